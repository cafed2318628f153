#include "layout.hpp"

#include <numeric>

#include "shardkit/core/error.hpp"

namespace shardkit::detail {

Array packed(const Array& x) { return x.is_contiguous() ? x : x.clone(); }

Array stack_all(Communicator& comm, const Array& x, Token& token) {
  Shape s{comm.size()};
  s.insert(s.end(), x.shape().begin(), x.shape().end());
  Array out = Array::empty(s, x.dtype(), x.device());
  Array flat = out.reshape({out.numel()});
  token = comm.allgather(packed(x).reshape({x.numel()}), flat, token);
  if (token.waitable()) out.set_ready(token.waitable());
  return out;
}

Array gather_along(Communicator& comm, const Array& x, int dim, std::span<const std::int64_t> sizes, Token& token) {
  const int k = comm.size();
  SHARDKIT_ASSERT(static_cast<int>(sizes.size()) == k, "one size per member");
  SHARDKIT_ASSERT(sizes[comm.rank()] == x.dim(dim), "this member's size");
  Shape out_shape = x.shape();
  out_shape[dim] = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  std::int64_t outer = 1, inner = 1;  // elements before and after `dim`
  for (int d = 0; d < x.ndim(); ++d) (d < dim ? outer : inner) *= d == dim ? 1 : x.dim(d);
  bool even = true;
  for (std::int64_t s : sizes) even = even && s == sizes[0];
  Array flat_x = packed(x).reshape({x.numel()});

  if (outer == 1) {
    // The blocks are consecutive in the result: gather straight into it.
    Array out = Array::empty(out_shape, x.dtype(), x.device());
    Array flat = out.reshape({out.numel()});
    if (even) {
      token = comm.allgather(flat_x, flat, token);
    } else {
      std::vector<std::int64_t> counts(sizes.begin(), sizes.end());
      for (auto& c : counts) c *= inner;
      token = comm.allgatherv(flat_x, flat, counts, token);
    }
    if (token.waitable()) out.set_ready(token.waitable());
    return out;
  }
  // Blocks interleave in the result: gather the packed blocks, then place each with a strided copy.
  std::vector<std::int64_t> counts(sizes.begin(), sizes.end());
  for (auto& c : counts) c *= outer * inner;
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  Array recv = Array::empty({total}, x.dtype(), x.device());
  if (even)
    token = comm.allgather(flat_x, recv, token);
  else
    token = comm.allgatherv(flat_x, recv, counts, token);
  token.wait();
  Array out = Array::empty(out_shape, x.dtype(), x.device());
  std::int64_t src_off = 0, dst_off = 0;
  for (int j = 0; j < k; ++j) {
    Shape block = x.shape();
    block[dim] = sizes[j];
    Array dst = out.slice(dim, dst_off, dst_off + sizes[j]);
    dst.copy_from(recv.slice(0, src_off, src_off + counts[j]).reshape(block));
    src_off += counts[j];
    dst_off += sizes[j];
  }
  return out;
}

Array all_to_all_along(Communicator& comm, const Array& x, int split_dim, int concat_dim, Token& token) {
  const int k = comm.size();
  SHARDKIT_CHECK(x.dim(split_dim) % k == 0, "all_to_all: dimension ", split_dim, " of size ", x.dim(split_dim),
                 " does not split into ", k, " equal chunks");
  const std::int64_t chunk = x.dim(split_dim) / k;
  Shape chunk_shape = x.shape();
  chunk_shape[split_dim] = chunk;
  Shape buf_shape{k};
  buf_shape.insert(buf_shape.end(), chunk_shape.begin(), chunk_shape.end());
  // Chunk j, packed, is row j of the send buffer (no copy when the split is along the leading dimension).
  Array send;
  if (split_dim == 0 && x.is_contiguous()) {
    send = x.reshape(buf_shape);
  } else {
    send = Array::empty(buf_shape, x.dtype(), x.device());
    for (int j = 0; j < k; ++j) {
      Array row = send.select(0, j);
      row.copy_from(x.slice(split_dim, j * chunk, (j + 1) * chunk));
    }
  }
  Array recv = Array::empty(buf_shape, x.dtype(), x.device());
  Array flat_recv = recv.reshape({recv.numel()});
  token = comm.alltoall(send.reshape({send.numel()}), flat_recv, token);
  token.wait();
  Shape out_shape = chunk_shape;
  out_shape[concat_dim] *= k;
  // Concatenating along the leading dimension: the received rows already follow each other.
  if (concat_dim == 0) return recv.reshape(out_shape);
  Array out = Array::empty(out_shape, x.dtype(), x.device());
  const std::int64_t len = chunk_shape[concat_dim];
  for (int j = 0; j < k; ++j) {
    Array dst = out.slice(concat_dim, j * len, (j + 1) * len);
    dst.copy_from(recv.select(0, j));
  }
  return out;
}

Array reduce_scatter_along(Communicator& comm, const Array& x, int dim, ReduceOp op, Token& token) {
  const int k = comm.size();
  SHARDKIT_CHECK(x.dim(dim) % k == 0, "psum_scatter: dimension ", dim, " of size ", x.dim(dim),
                 " does not divide by the axis size ", k);
  const std::int64_t chunk = x.dim(dim) / k;
  Shape chunk_shape = x.shape();
  chunk_shape[dim] = chunk;
  Shape buf_shape{k};
  buf_shape.insert(buf_shape.end(), chunk_shape.begin(), chunk_shape.end());
  Array send;
  if (dim == 0 && x.is_contiguous()) {
    send = x.reshape(buf_shape);
  } else {
    send = Array::empty(buf_shape, x.dtype(), x.device());
    for (int j = 0; j < k; ++j) {
      Array row = send.select(0, j);
      row.copy_from(x.slice(dim, j * chunk, (j + 1) * chunk));
    }
  }
  Array out = Array::empty(chunk_shape, x.dtype(), x.device());
  Array flat_out = out.reshape({out.numel()});
  token = comm.reduce_scatter(send.reshape({send.numel()}), flat_out, op, token);
  if (token.waitable()) out.set_ready(token.waitable());
  return out;
}

}  // namespace shardkit::detail
