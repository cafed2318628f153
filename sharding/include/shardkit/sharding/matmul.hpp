#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "shardkit/sharding/sharded_array.hpp"

namespace shardkit {

/// Distributed matrix-multiply algorithms. Each has an input layout it works on (operands held otherwise are
/// resharded to it first) and an output layout. `rows` below is a mesh axis (or tuple of axes) over which rows are
/// cut; for SUMMA, `x` and `y` are the two axes of a 2-d mesh.
enum class MatmulAlgorithm {
  kAuto,           ///< chosen from the operands' shardings (choose_matmul_algorithm)
  kLocal,          ///< A P(rows, None) x B P() -> C P(rows, None): the seed program, no communication
                   ///  (also A P() x B P(None, cols) -> C P(None, cols))
  kAllGather,      ///< A P(rows, None) x B P(rows, None) -> C P(rows, None): B is cut on the contraction
                   ///  dimension; its blocks travel a ring of ppermutes, each step's transfer overlapped with the
                   ///  GEMM of the block in hand (collective matmul, all-gather flavour)
  kReduceScatter,  ///< A P(None, k) x B P(k, None) -> C P(k, None): both cut on the contraction dimension; partial
                   ///  products travel a ring, accumulated as they go, overlapped with the next partial's GEMM
                   ///  (collective matmul, reduce-scatter flavour)
  kSumma,          ///< A P(x, y) x B P(x, y) -> C P(x, y) on a 2-d mesh: panels of A broadcast along y and of B
                   ///  along x, the next panel's broadcast overlapped with the current panel's GEMM
};

const char* matmul_algorithm_name(MatmulAlgorithm a) noexcept;
/// "auto", "local", "allgather" (or "ag"), "reduce_scatter" (or "rs"), "summa". @throws InvalidArgument.
MatmulAlgorithm parse_matmul_algorithm(std::string_view name);

/// Options of matmul.
struct MatmulOptions {
  MatmulAlgorithm algorithm = MatmulAlgorithm::kAuto;
  /// Overlap each step's communication with the previous step's GEMM (the collective algorithms). false: the
  /// same steps, each transfer completed before its GEMM. Unset: matmul_overlap_default(device of the operands).
  std::optional<bool> overlap;
};

/// Whether matmul overlaps by default on `device`. On a GPU, yes: NCCL's stream moves the data while the GEMM runs.
/// On the host a helper thread runs each transfer, and the MPI library progresses it (copying, polling) on a core:
/// that pays only when a core is free for it, and where every core already runs BLAS it competes with the GEMMs and
/// costs more than it hides. So: host_overlap_pays(cores this process may use, ranks of this machine sharing them,
/// BLAS threads per rank); the cores are the process's affinity mask when it is bound to fewer than the machine has
/// (each rank then owns its mask), else the machine's, shared by the ranks on it (Runtime::local_size).
bool matmul_overlap_default(Device device);
/// cores >= ranks_sharing * (blas_threads + 1): every rank has a core beyond its BLAS threads for its transfers.
bool host_overlap_pays(int cores, int ranks_sharing, int blas_threads) noexcept;

/// The algorithm matmul(a, b) picks for these shardings: local when one operand is cut by rows (or columns) and
/// the other replicated, all-gather when both are cut by rows over the same axes, reduce-scatter when A is cut by
/// columns and B by rows over the same axes, SUMMA for P(x, y) operands on a 2-d mesh; otherwise local after
/// resharding A by rows over every mesh axis and replicating B.
MatmulAlgorithm choose_matmul_algorithm(const ShardedArray& a, const ShardedArray& b);

/// C = A @ B for 2-d sharded operands of one dtype on one mesh: float32 and float64 everywhere, float16 and
/// bfloat16 (and complex) where the local GEMM takes them (cuBLAS for GPU blocks; on the host they are widened).
/// Collective over the mesh.
/// @throws InvalidArgument for operands that are not 2-d, whose inner dimensions differ, live on different meshes,
///         or that the chosen algorithm cannot cut (its dimensions must divide by the mesh axes; only the local
///         algorithm takes uneven shards).
ShardedArray matmul(const ShardedArray& a, const ShardedArray& b, MatmulOptions options = {});

}  // namespace shardkit
