#pragma once

// The shm backend's own element-wise folds, for small messages: there MPI_Reduce_local's dispatch costs more than
// the arithmetic. The same arithmetic as the MPI backend's reductions (mpi_types.hpp: wrapping integer sums and
// products, NaN-propagating float min/max) on the dtypes and reductions they cover; every other combination (bool,
// float16/bfloat16, complex, logical reductions) keeps going through MPI_Reduce_local.

#include <cstdint>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/dtype.hpp"

namespace shardkit::detail {

/// out[i] = in[i] op acc[i] for `count` elements (the operand order of MPI_Reduce_local's `inout = in op inout`);
/// `out` may be `acc` (in place), no other overlap; buffers need not be aligned.
using ShmFold = void (*)(const unsigned char* in, const unsigned char* acc, unsigned char* out, std::int64_t count);

/// The fold of `op` on `dtype`, or nullptr where the backend leaves it to MPI_Reduce_local.
ShmFold shm_fold(DType dtype, ReduceOp op) noexcept;

}  // namespace shardkit::detail
