// --profile parts of SUMMA on a 2-d mesh (x, y), a self-contained mirror of the library's steps: lcm(px, py) panels;
// for each, A's panel is broadcast along y from its owner column and B's along x from its owner row (no broadcast
// along an axis of one rank), then one GEMM. Owners broadcast straight from their block where the panel is contiguous
// there and copy it into a buffer first where not (A's panels when a block holds more than one); the other ranks
// receive into buffers, two per operand used in turn.

#include <array>
#include <numeric>

#include "bench.hpp"
#include "shardkit/core/gemm.hpp"

namespace shardkit::bench {

std::vector<Method> summa_parts(const PartContext& c) {
  std::vector<Method> out;
  const Mesh& mesh = c.mesh;
  const Dims& d = c.d;
  const std::string& x = mesh.axis_names()[0];
  const std::string& y = mesh.axis_names()[1];
  const std::int64_t px = mesh.shape()[0], py = mesh.shape()[1], panels = std::lcm(px, py);
  if (d.m % px || d.n % py || d.k % panels) return out;
  auto row_comm = mesh.axis_comm(y);
  auto col_comm = mesh.axis_comm(x);
  const std::int64_t my_x = mesh.axis_index(x), my_y = mesh.axis_index(y);
  const std::int64_t kp = d.k / panels, a_per = panels / py, b_per = panels / px, mloc = d.m / px, nloc = d.n / py;
  auto a_panel = [a = c.a, a_per, kp](std::int64_t s) { return a.slice(1, (s % a_per) * kp, (s % a_per + 1) * kp); };
  auto b_panel = [bl = c.bl, b_per, kp](std::int64_t s) { return bl.slice(0, (s % b_per) * kp, (s % b_per + 1) * kp); };
  auto pan = std::make_shared<std::array<Array, 3>>(std::array<Array, 3>{Array::empty({mloc, kp}, c.dt, c.dev),
                                                                         Array::empty({kp, nloc}, c.dt, c.dev),
                                                                         Array::empty({mloc, nloc}, c.dt, c.dev)});
  Method g = c.part("gemm");
  g.run = [pan, panels] {
    for (std::int64_t t = 0; t < panels; ++t) gemm((*pan)[0], (*pan)[1], (*pan)[2], 1.0, t == 0 ? 0.0 : 1.0);
  };
  Method t = c.part("comm");
  t.run = [pan, panels, a_per, b_per, px, py, row_comm, col_comm] {
    for (std::int64_t s = 0; s < panels; ++s) {
      Token ta, tb;
      if (py > 1) ta = row_comm->bcast_inplace((*pan)[0], static_cast<int>(s / a_per));
      if (px > 1) tb = col_comm->bcast_inplace((*pan)[1], static_cast<int>(s / b_per));
      Token::join(ta, tb).wait();
    }
  };
  // Which panels this rank copies (owner of a strided panel on an axis of more than one rank) and which need a
  // buffer (those, and every panel received).
  auto a_copies = [=](std::int64_t s) { return py > 1 && my_y == s / a_per && !a_panel(s).is_contiguous(); };
  auto b_copies = [=](std::int64_t s) { return px > 1 && my_x == s / b_per && !b_panel(s).is_contiguous(); };
  Method cp = c.part("copies");
  cp.run = [pan, panels, a_copies, b_copies, a_panel, b_panel] {
    for (std::int64_t s = 0; s < panels; ++s) {
      if (a_copies(s)) (*pan)[0].copy_from(a_panel(s));
      if (b_copies(s)) (*pan)[1].copy_from(b_panel(s));
    }
  };
  out.push_back(std::move(g));
  out.push_back(std::move(t));
  out.push_back(std::move(cp));
  // C and the panel buffers the call allocates: one per operand and slot (panels alternate slots) that some panel
  // of that slot needs.
  std::vector<Shape> fresh = {{mloc, nloc}};
  for (int slot = 0; slot < 2; ++slot) {
    bool a_buf = false, b_buf = false;
    for (std::int64_t s = slot; s < panels; s += 2) {
      a_buf = a_buf || (py > 1 && (my_y != s / a_per || a_copies(s)));
      b_buf = b_buf || (px > 1 && (my_x != s / b_per || b_copies(s)));
    }
    if (a_buf) fresh.push_back({mloc, kp});
    if (b_buf) fresh.push_back({kp, nloc});
  }
  out.push_back(fresh_memory_part(c.part("fresh"), std::move(fresh), c.dt, c.dev));
  return out;
}

}  // namespace shardkit::bench
