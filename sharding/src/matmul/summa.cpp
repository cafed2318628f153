// SUMMA on a 2-d mesh (x, y): C[x][y] = sum over panels t of A[x][panel t] @ B[panel t][y]; panel t of A is broadcast
// along y from its owner column, of B along x from its owner row, the next panel's broadcasts overlapped with the
// current panel's GEMM.

#include <numeric>
#include <optional>

#include "algorithm.hpp"
#include "shardkit/core/gemm.hpp"
#include "transfer.hpp"

namespace shardkit::detail {

Array summa(const Blocks& blocks) {
  const Mesh& mesh = blocks.a.mesh();
  const std::string& x = mesh.axis_names()[0];
  const std::string& y = mesh.axis_names()[1];
  const std::int64_t px = mesh.shape()[0], py = mesh.shape()[1];
  const std::int64_t kk = blocks.a.shape()[1];
  const std::int64_t panels = std::lcm(px, py);
  const Array& a = blocks.a.local();
  const Array& b = blocks.b.local();
  auto row_comm = mesh.axis_comm(y);  // ranks of my mesh row (same x), indexed by y
  auto col_comm = mesh.axis_comm(x);  // ranks of my mesh column (same y), indexed by x
  const std::int64_t my_x = mesh.axis_index(x), my_y = mesh.axis_index(y);
  const std::int64_t kp = kk / panels, a_per = panels / py, b_per = panels / px;
  const bool device = on_gpu(a);
  const std::int64_t mloc = a.dim(0), nloc = b.dim(1);
  Array c = Array::empty({mloc, nloc}, a.dtype(), a.device());
  // Panel t of A is columns of its owner's block, panel t of B rows of its owner's. The GEMM reads a panel in place
  // where this rank holds it (its owner, or every rank when the axis it travels along has one rank: no broadcast);
  // other ranks receive it into one of two buffers per operand (one read by the GEMM, the other being filled),
  // allocated only when needed. The owner broadcasts straight from its block when the panel is contiguous there.
  Array apan[2], bpan[2];  // receive (or staging) buffers
  Array ause[2], buse[2];  // what the GEMM of the panel in a slot reads
  auto share = [&](const Array& mine, bool owner, int root, const Shape& shape, Array& buffer, Array& use,
                   Communicator& comm, std::int64_t ranks) -> Token {
    if (ranks == 1) {
      use = mine;
      return {};
    }
    if (owner && mine.is_contiguous()) {
      use = mine;  // a broadcast only reads its root's buffer (which may be read-only)
      return comm.bcast_inplace(use, root);
    }
    if (buffer.shape() != shape) buffer = Array::empty(shape, a.dtype(), a.device());
    if (owner) buffer.copy_from(mine);
    use = owner ? mine : buffer;
    return comm.bcast_inplace(buffer, root);
  };
  auto fetch = [&](std::int64_t t, int slot) {
    const std::int64_t a_owner = t / a_per, b_owner = t / b_per;
    const bool a_own = my_y == a_owner, b_own = my_x == b_owner;
    const Array a_mine = a_own ? a.slice(1, (t % a_per) * kp, (t % a_per + 1) * kp) : Array();
    const Array b_mine = b_own ? b.slice(0, (t % b_per) * kp, (t % b_per + 1) * kp) : Array();
    Token ta = share(a_mine, a_own, static_cast<int>(a_owner), {mloc, kp}, apan[slot], ause[slot], *row_comm, py);
    Token tb = share(b_mine, b_own, static_cast<int>(b_owner), {kp, nloc}, bpan[slot], buse[slot], *col_comm, px);
    return Token::join(ta, tb);
  };
  Transfer first([&] { return fetch(0, 0); }, device, false);
  first.wait();
  for (std::int64_t t = 0; t < panels; ++t) {
    const int cur = static_cast<int>(t % 2);
    std::optional<Transfer> pre;
    if (t + 1 < panels) pre.emplace([&, t] { return fetch(t + 1, 1 - cur); }, device, blocks.overlap);
    gemm(ause[cur], buse[cur], c, 1.0, t == 0 ? 0.0 : 1.0);
    if (pre) {
      settle(c);
      pre->wait();
    }
  }
  settle(c);
  return c;
}

}  // namespace shardkit::detail
