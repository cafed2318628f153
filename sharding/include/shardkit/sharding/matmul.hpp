#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "shardkit/sharding/sharded_array.hpp"

namespace shardkit {

/// Distributed matrix-multiply algorithms. Each takes operands in its layouts as they are (others are resharded to
/// its first layout) and gives C in the matching layout: matmul_layout_text() states them, from the one table of
/// algorithms (sharding/src/matmul/table.cpp).
enum class MatmulAlgorithm {
  kAuto,           ///< chosen from the operands' shardings (choose_matmul_algorithm)
  kLocal,          ///< one operand cut, the other replicated: the seed program, no communication; takes uneven rows
  kAllGather,      ///< B cut on the contraction dimension: its blocks travel a ring of ppermutes, each step's transfer
                   ///  overlapped with the GEMM of the block in hand (collective matmul, all-gather flavour)
  kReduceScatter,  ///< A and B cut on the contraction dimension: partial products travel a ring, accumulated as they
                   ///  go, overlapped with the next partial's GEMM (collective matmul, reduce-scatter flavour)
  kSumma,          ///< blocks of a 2-d mesh: panels of A broadcast along its second axis and of B along its first,
                   ///  the next panel's broadcast overlapped with the current panel's GEMM
};

/// The name of an algorithm: "auto", "local", "allgather", "reduce_scatter", "summa".
const char* matmul_algorithm_name(MatmulAlgorithm a) noexcept;
/// A name of matmul_algorithm_name, or an alias ("rows", "ag", "all_gather", "rs", "reducescatter").
/// @throws InvalidArgument for any other name, listing the known ones.
MatmulAlgorithm parse_matmul_algorithm(std::string_view name);

/// The layouts `algorithm` takes as they are, as text such as "A P(axes, None) @ B P(axes, None) -> C P(axes, None)":
/// `axes` is a mesh axis or tuple of axes (the same within one layout), `x` and `y` the axes of a 2-d mesh. The
/// first layout is the one other operands are resharded to. kAuto: those of the algorithm used when no layout fits.
std::string matmul_layout_text(MatmulAlgorithm algorithm);

/// The specs of A, B and C in an algorithm's first layout on a mesh.
struct MatmulLayout {
  PartitionSpec a, b, c;
};
/// The layout `algorithm` reshards its operands to on `mesh`, with `axes` every mesh axis (kAuto: that of the
/// algorithm used when no layout fits). @throws InvalidArgument for a 2-d layout (SUMMA) on a mesh that is not 2-d.
MatmulLayout matmul_layout(MatmulAlgorithm algorithm, const Mesh& mesh);

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

/// The algorithm matmul(a, b) picks for these shardings: the one with a layout (matmul_layout_text) the operands'
/// specs match, whatever the mesh's sizes; when none matches, local, after resharding A by rows and replicating B.
MatmulAlgorithm choose_matmul_algorithm(const ShardedArray& a, const ShardedArray& b);

/// C = A @ B for 2-d sharded operands of one dtype on one mesh: float32 and float64 everywhere, float16 and
/// bfloat16 (and complex) where the local GEMM takes them (cuBLAS for GPU blocks; on the host they are widened).
/// Collective over the mesh.
/// @throws InvalidArgument for operands that are not 2-d, whose inner dimensions differ, live on different meshes,
///         or that the chosen algorithm cannot cut (the message names its layout and the dimensions that do not
///         divide by their axes' sizes, for an algorithm that does not take uneven shards).
ShardedArray matmul(const ShardedArray& a, const ShardedArray& b, MatmulOptions options = {});

}  // namespace shardkit
