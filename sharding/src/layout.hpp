#pragma once

// Data movement of local blocks along one array dimension over one communicator: the pieces that reshard and the
// ShardContext collectives are made of. Blocks on a non-leading dimension are packed into (and unpacked from)
// contiguous buffers with strided copies, on the host or the GPU.

#include <cstdint>
#include <span>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/array.hpp"

namespace shardkit::detail {

/// Concatenates the members' blocks along `dim` in member order (tiled all_gather). `sizes[j]` is member j's
/// extent along `dim` (all equal for even shardings; may differ, or be zero, for uneven ones).
Array gather_along(Communicator& comm, const Array& x, int dim, std::span<const std::int64_t> sizes, Token& token);

/// Splits `split_dim` into comm.size() equal chunks, sends chunk j to member j, and concatenates what arrives along
/// `concat_dim` (tiled all_to_all).
Array all_to_all_along(Communicator& comm, const Array& x, int split_dim, int concat_dim, Token& token);

/// Reduces over the members, then keeps chunk `rank` of `dim` (tiled reduce-scatter). x.dim(dim) must divide.
Array reduce_scatter_along(Communicator& comm, const Array& x, int dim, ReduceOp op, Token& token);

/// The members' blocks, each packed contiguously, concatenated in member order along dimension 0 of a new
/// leading axis: the shape is (comm.size(), *x.shape) (untiled all_gather at 0).
Array stack_all(Communicator& comm, const Array& x, Token& token);

/// Copies `x` (any layout) into a new contiguous array on the same device.
Array packed(const Array& x);

}  // namespace shardkit::detail
