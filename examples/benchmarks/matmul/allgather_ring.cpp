// --profile parts of the all-gather ring (B sharded on the contraction dimension, collected block by block while the
// GEMMs run): C_i = sum_j A_i[:, K_j] @ B_j, p GEMMs on column slices of A and p - 1 transfers of a block of B.

#include <algorithm>
#include <utility>

#include "bench.hpp"
#include "shardkit/core/gemm.hpp"

namespace shardkit::bench {

std::vector<Method> allgather_parts(const PartContext& c, const Ring& ring) {
  std::vector<Method> out;
  const std::int64_t p = ring.p, kb = c.d.k / p, i = ring.i;
  auto result = std::make_shared<Array>(Array::empty({c.d.m / p, c.d.n}, c.dt, c.dev));
  Method g = c.part("gemm");
  g.run = [a = c.a, bl = c.bl, result, p, kb, i] {
    for (std::int64_t s = 0; s < p; ++s) {
      const std::int64_t j = (i + s) % p;
      gemm(a.slice(1, j * kb, (j + 1) * kb), bl, *result, 1.0, s == 0 ? 0.0 : 1.0);
    }
  };
  // Copies: the received blocks must not land in the shared inputs.
  auto bufs = std::make_shared<std::pair<Array, Array>>(c.bl.clone(), Array::empty(c.bl.shape(), c.dt, c.dev));
  Method t = c.part("comm");
  t.run = [r = ring, bufs] {
    for (std::int64_t s = 0; s + 1 < r.p; ++s) {
      r.comm->sendrecv_into(bufs->first, r.left, bufs->second, r.right, 23, 23).wait();
      std::swap(bufs->first, bufs->second);
    }
  };
  out.push_back(std::move(g));
  out.push_back(std::move(t));
  // C and the receive buffers: two used in turn, only one with two ranks.
  std::vector<Shape> fresh = {{c.d.m / p, c.d.n}};
  for (std::int64_t s = 0; s < std::min<std::int64_t>(p - 1, 2); ++s) fresh.push_back({kb, c.d.n});
  out.push_back(fresh_memory_part(c.part("fresh"), std::move(fresh), c.dt, c.dev));
  return out;
}

}  // namespace shardkit::bench
