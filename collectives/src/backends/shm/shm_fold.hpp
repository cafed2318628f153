#pragma once

// The shm backend's own element-wise folds, for small messages: there MPI_Reduce_local's dispatch costs more than
// the arithmetic. The same arithmetic as the MPI backend's reductions (mpi_types.hpp: wrapping integer sums and
// products, NaN-propagating float min/max) on the dtypes and reductions they cover; every other combination (bool,
// float16/bfloat16, complex, logical reductions) keeps going through MPI_Reduce_local. Reducer chooses between the
// two for each part, and fold_ranks() folds every rank's part in rank order with it.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/mpi/mpi_types.hpp"
#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/dtype.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

/// out[i] = in[i] op acc[i] for `count` elements (the operand order of MPI_Reduce_local's `inout = in op inout`);
/// `out` may be `acc` (in place), no other overlap; buffers need not be aligned.
using ShmFold = void (*)(const unsigned char* in, const unsigned char* acc, unsigned char* out, std::int64_t count);

/// The fold of `op` on `dtype`, or nullptr where the backend leaves it to MPI_Reduce_local.
ShmFold shm_fold(DType dtype, ReduceOp op) noexcept;

/// Parts up to this many bytes fold through shm_fold() where it covers the reduction; larger ones through
/// MPI_Reduce_local, whose vectorised loops (Open MPI's op/avx, chosen at run time) are faster from about there: a
/// float32, float64 or int32 sum in place took 3-4x less time in our loop at 8-64 B, 1.2-1.3x less at 512 B, the same
/// at 1 KiB, and 1.2x more at 4-16 KiB (one rank, min and median of 15 rounds, on this project's 2-core AVX-512
/// machine).
inline constexpr std::size_t kOwnFoldBytes = std::size_t{1} << 10;

/// How one part folds into another: the backend's own loop (small parts, and every first fold of two parts into a
/// third, which saves copying one of them out first), or MPI_Reduce_local (handles looked up only when some part may
/// need them).
struct Reducer {
  ShmFold own = nullptr;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;

  Reducer(DType dtype, ReduceOp reduce, std::size_t largest_part) : own(shm_fold(dtype, reduce)) {
    if (!own || largest_part > kOwnFoldBytes) {
      type = mpi_datatype(dtype);
      op = mpi_op(reduce, dtype);
    }
  }
  /// inout = in op inout.
  void operator()(const unsigned char* in, unsigned char* inout, std::int64_t count, std::size_t item) const {
    if (own && count * item <= kOwnFoldBytes)
      own(in, inout, inout, count);
    else
      SHARDKIT_MPI_CHECK(MPI_Reduce_local(in, inout, static_cast<int>(count), type, op));
  }
  /// out = in op acc (out overlaps neither).
  void operator()(const unsigned char* in, const unsigned char* acc, unsigned char* out, std::int64_t count,
                  std::size_t item) const {
    if (own) return own(in, acc, out, count);
    std::memcpy(out, acc, count * item);
    (*this)(in, out, count, item);
  }
};

/// out = src(0) op src(1) op ... op src(ranks - 1), in the same order on every rank (src(p): rank p's part).
template <typename Src>
void fold_ranks(int ranks, unsigned char* out, std::int64_t count, std::size_t item, const Reducer& r, Src&& src) {
  if (ranks == 1) return static_cast<void>(std::memcpy(out, src(0), count * item));
  r(src(1), src(0), out, count, item);
  for (int p = 2; p < ranks; ++p) r(src(p), out, count, item);
}

}  // namespace shardkit::detail
