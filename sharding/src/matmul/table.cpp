// The table of matmul algorithms (see algorithm.hpp): the one place that says which shardings of A, B and C each
// algorithm takes.

#include "algorithm.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {

const std::vector<MatmulEntry>& matmul_table() {
  constexpr Cut N = Cut::kNone, R = Cut::kAxes, X = Cut::kMeshX, Y = Cut::kMeshY;
  // Layouts as {A, B, C}, each {rows, columns}. The layouts of different algorithms never overlap, so the chooser's
  // order does not matter; an algorithm's first layout is the one other operands are resharded to.
  // clang-format off
  static const std::vector<MatmulEntry> table = {
      // The seed program: A cut by rows and B replicated (or A replicated and B cut by columns).
      {MatmulAlgorithm::kLocal, "local", {"rows"},
       {{{R, N}, {N, N}, {R, N}}, {{N, N}, {N, R}, {N, R}}}, true, local_gemm},
      // B cut on the contraction dimension, its blocks travelling a ring.
      {MatmulAlgorithm::kAllGather, "allgather", {"ag", "all_gather"},
       {{{R, N}, {R, N}, {R, N}}}, false, allgather_ring},
      // A and B both cut on the contraction dimension, partial products travelling a ring.
      {MatmulAlgorithm::kReduceScatter, "reduce_scatter", {"rs", "reducescatter"},
       {{{N, R}, {R, N}, {R, N}}}, false, reduce_scatter_ring},
      // Blocks of a 2-d mesh, panels broadcast along its rows and columns.
      {MatmulAlgorithm::kSumma, "summa", {},
       {{{X, Y}, {X, Y}, {X, Y}}}, false, summa},
  };
  // clang-format on
  return table;
}

const MatmulEntry& matmul_entry(MatmulAlgorithm algorithm) {
  for (const MatmulEntry& e : matmul_table())
    if (e.algorithm == algorithm) return e;
  throw InvalidArgument(concat("matmul: no algorithm entry for ", static_cast<int>(algorithm),
                               " (auto is resolved by choose_matmul_algorithm)"));
}

}  // namespace shardkit::detail
