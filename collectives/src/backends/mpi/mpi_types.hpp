#pragma once

// Mapping of shardkit dtypes and reductions onto MPI. MPI has no float16 / bfloat16: they get their own 2-byte
// datatypes and reduction operations (computed in float32 and rounded back, as the GPU libraries do).

#include <mpi.h>

#include <algorithm>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/dtype.hpp"

namespace shardkit::detail {

/// NaN propagates through min and max whichever rank holds it, as in NumPy's minimum/maximum and JAX's pmin/pmax
/// (MPI_MIN/MPI_MAX keep or drop a NaN depending on its rank, and NCCL's fminf/fmaxf drop it): every floating dtype
/// reduces min and max through these (here and in the shm backend's own folds).
template <typename F>
inline F nan_min(F a, F b) { return (a != a || b != b) ? a + b : std::min(a, b); }
template <typename F>
inline F nan_max(F a, F b) { return (a != a || b != b) ? a + b : std::max(a, b); }

/// The MPI datatype of one element of `dtype`.
MPI_Datatype mpi_datatype(DType dtype);
/// The MPI operation for `op` on `dtype`. @throws InvalidArgument when the combination is not defined.
MPI_Op mpi_op(ReduceOp op, DType dtype);

}  // namespace shardkit::detail
