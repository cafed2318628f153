#pragma once

// Mapping of shardkit dtypes and reductions onto MPI. MPI has no float16 / bfloat16: they get their own 2-byte
// datatypes and reduction operations (computed in float32 and rounded back, as the GPU libraries do).

#include <mpi.h>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/dtype.hpp"

namespace shardkit::detail {

/// The MPI datatype of one element of `dtype`.
MPI_Datatype mpi_datatype(DType dtype);
/// The MPI operation for `op` on `dtype`. @throws InvalidArgument when the combination is not defined.
MPI_Op mpi_op(ReduceOp op, DType dtype);

}  // namespace shardkit::detail
