// --profile parts of the reduce-scatter ring (A sharded on the contraction dimension, partial sums passed around the
// ring): p GEMMs of a row block of A[:, K_i] by B_i, and p - 1 transfers of a partial sum, each followed by an add.

#include <array>

#include "bench.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/core/kernels.hpp"

namespace shardkit::bench {

std::vector<Method> reduce_scatter_parts(const PartContext& c, const Ring& ring) {
  std::vector<Method> out;
  const std::int64_t p = ring.p, mb = c.d.m / p, i = ring.i;
  // The partial sum in hand, the incoming one and this rank's share.
  auto bufs = std::make_shared<std::array<Array, 3>>(std::array<Array, 3>{Array::empty({mb, c.d.n}, c.dt, c.dev),
                                                                          Array::empty({mb, c.d.n}, c.dt, c.dev),
                                                                          Array::empty({mb, c.d.n}, c.dt, c.dev)});
  Method g = c.part("gemm");
  g.run = [a = c.a, bl = c.bl, bufs, p, mb, i] {
    for (std::int64_t s = 0; s < p; ++s) {
      const std::int64_t r = (i + s + 1) % p;
      gemm(a.slice(0, r * mb, (r + 1) * mb), bl, (*bufs)[s == 0 ? 0 : 2]);
    }
  };
  Method t = c.part("comm");
  t.run = [r = ring, bufs] {
    for (std::int64_t s = 1; s < r.p; ++s)
      r.comm->sendrecv_into((*bufs)[0], r.left, (*bufs)[1], r.right, 29, 29).wait();
  };
  Method add = c.part("adds");
  add.run = [bufs, p] {
    for (std::int64_t s = 1; s < p; ++s) add_into((*bufs)[1], (*bufs)[2]);
  };
  out.push_back(std::move(g));
  out.push_back(std::move(t));
  out.push_back(std::move(add));
  out.push_back(fresh_memory_part(c.part("fresh"), {{mb, c.d.n}, {mb, c.d.n}, {mb, c.d.n}}, c.dt, c.dev));
  return out;
}

}  // namespace shardkit::bench
