// Distributed matrix multiply, public entry points: names, the default overlap, the chooser and matmul itself. The
// algorithms, their layouts and their bodies are in matmul/ (the table in matmul/table.cpp).

#include "shardkit/sharding/matmul.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "matmul/algorithm.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit {

const char* matmul_algorithm_name(MatmulAlgorithm a) noexcept {
  for (const detail::MatmulEntry& e : detail::matmul_table())
    if (e.algorithm == a) return e.name.data();
  return "auto";
}

MatmulAlgorithm parse_matmul_algorithm(std::string_view name) {
  if (name == "auto") return MatmulAlgorithm::kAuto;
  std::string known = "auto";
  for (const detail::MatmulEntry& e : detail::matmul_table()) {
    if (name == e.name || std::find(e.aliases.begin(), e.aliases.end(), name) != e.aliases.end()) return e.algorithm;
    known += detail::concat(", ", e.name);
  }
  throw InvalidArgument(detail::concat("unknown matmul algorithm '", name, "' (", known, ")"));
}

std::string matmul_layout_text(MatmulAlgorithm algorithm) {
  const detail::MatmulEntry& e =
      detail::matmul_entry(algorithm == MatmulAlgorithm::kAuto ? detail::kFallbackMatmul : algorithm);
  std::string out;
  for (const detail::Layout& l : e.layouts) out += detail::concat(out.empty() ? "" : ", or ", detail::layout_text(l));
  return out;
}

MatmulLayout matmul_layout(MatmulAlgorithm algorithm, const Mesh& mesh) {
  const detail::MatmulEntry& e =
      detail::matmul_entry(algorithm == MatmulAlgorithm::kAuto ? detail::kFallbackMatmul : algorithm);
  const detail::Layout& l = e.layouts.front();
  const Axes all(mesh.axis_names());
  const std::string where = detail::concat("matmul_layout (", e.name, ", ", detail::layout_text(l), ")");
  return {detail::layout_spec(l.a, mesh, all, where), detail::layout_spec(l.b, mesh, all, where),
          detail::layout_spec(l.c, mesh, all, where)};
}

bool host_overlap_pays(int cores, int ranks_sharing, int blas_threads) noexcept {
  return cores >= static_cast<long>(std::max(ranks_sharing, 1)) * (std::max(blas_threads, 1) + 1);
}

bool matmul_overlap_default(Device device) {
  if (device.kind == DeviceKind::kCUDA) return true;
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int mine = machine;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) mine = std::max(1, CPU_COUNT(&set));
  const Runtime* rt = Runtime::current();
  const int sharing = mine < machine ? 1 : (rt ? rt->local_size() : 1);
  return host_overlap_pays(mine, sharing, blas_num_threads());
}

MatmulAlgorithm choose_matmul_algorithm(const ShardedArray& a, const ShardedArray& b) {
  // By the specs (not by the mesh's sizes): the choice reads the same on a mesh of one rank.
  for (const detail::MatmulEntry& e : detail::matmul_table())
    for (const detail::Layout& l : e.layouts)
      if (detail::match_layout(l, a, b)) return e.algorithm;
  return detail::kFallbackMatmul;
}

ShardedArray matmul(const ShardedArray& a, const ShardedArray& b, MatmulOptions options) {
  SHARDKIT_CHECK(a.ndim() == 2 && b.ndim() == 2, "matmul takes 2-d operands, got shapes ", shape_to_string(a.shape()),
                 " and ", shape_to_string(b.shape()));
  SHARDKIT_CHECK_EQ(a.shape()[1], b.shape()[0], "matmul: inner dimensions differ: ", shape_to_string(a.shape()), " @ ",
                    shape_to_string(b.shape()));
  SHARDKIT_CHECK(a.mesh() == b.mesh(), "matmul: operands on different meshes: ", a.mesh().to_string(), ", ",
                 b.mesh().to_string());
  SHARDKIT_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ: ", a.dtype(), " and ", b.dtype());
  SHARDKIT_CHECK(a.device() == b.device(), "matmul: operands on different devices: ", a.device(), ", ", b.device());
  const MatmulAlgorithm alg =
      options.algorithm == MatmulAlgorithm::kAuto ? choose_matmul_algorithm(a, b) : options.algorithm;
  const bool overlap = alg == MatmulAlgorithm::kLocal || options.overlap.has_value()
                           ? options.overlap.value_or(false)
                           : matmul_overlap_default(a.device());
  return detail::run_matmul(detail::matmul_entry(alg), a, b, overlap);
}

}  // namespace shardkit
