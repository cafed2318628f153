// --profile parts of the local algorithm (row-sharded A times replicated B): its one GEMM, into a buffer allocated
// once, and the allocation of its result.

#include "bench.hpp"
#include "shardkit/core/gemm.hpp"

namespace shardkit::bench {

std::vector<Method> local_parts(const PartContext& c) {
  std::vector<Method> out;
  // Against the algorithm's time, the GEMM alone shows the cost of the call's own result allocation (fresh pages
  // every call for large results).
  Method g = c.part("gemm");
  auto result = std::make_shared<Array>(Array::empty({c.a.dim(0), c.d.n}, c.dt, c.dev));
  g.run = [a = c.a, bl = c.bl, result] { gemm(a, bl, *result); };
  out.push_back(std::move(g));
  out.push_back(fresh_memory_part(c.part("fresh"), {{c.a.dim(0), c.d.n}}, c.dt, c.dev));
  return out;
}

}  // namespace shardkit::bench
