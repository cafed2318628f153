// Collective matmul, reduce-scatter flavour: rank j holds A[:, K_j] and B_j; the partial sums of each row block of C
// travel a ring, each rank adding its part, and end at the rank that owns the block. Each transfer is overlapped
// with the GEMM of the next partial.

#include <utility>

#include "algorithm.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/core/kernels.hpp"
#include "transfer.hpp"

namespace shardkit::detail {

Array reduce_scatter_ring(const Blocks& blocks) {
  const Mesh& mesh = blocks.a.mesh();
  const std::int64_t k = mesh.axis_size(blocks.axes), m = blocks.a.shape()[0], n = blocks.b.shape()[1];
  auto comm = mesh.axis_comm(blocks.axes);
  const int i = comm->rank(), left = (i + k - 1) % k, right = (i + 1) % k;
  const std::int64_t mb = m / k;
  const Array& a = blocks.a.local();
  const Array& b = blocks.b.local();
  const bool device = on_gpu(a);
  auto rows_of = [&](std::int64_t r) { return a.slice(0, r * mb, (r + 1) * mb); };
  // acc: the partial sum this rank holds; incoming: the one arriving from the right; partial: this rank's share.
  Array acc = Array::empty({mb, n}, a.dtype(), a.device());
  Array incoming = Array::empty({mb, n}, a.dtype(), a.device());
  Array partial = Array::empty({mb, n}, a.dtype(), a.device());
  gemm(rows_of((i + 1) % k), b, acc);  // step 0: the block that travels furthest
  for (int s = 1; s < k; ++s) {
    settle(acc);
    Transfer t(
        [&] {  // every rank of the ring runs this exchange (Peers::kAllSendrecv): it may take shm
          return comm->sendrecv_into(acc, left, incoming, right, kReduceScatterRingTag, kReduceScatterRingTag, nullptr,
                                     {}, Peers::kAllSendrecv);
        },
        device, blocks.overlap);
    gemm(rows_of((i + s + 1) % k), b, partial);  // overlapped with the transfer
    t.wait();
    settle(partial);
    add_into(incoming, partial);
    std::swap(acc, incoming);
  }
  settle(acc);
  return acc;
}

}  // namespace shardkit::detail
