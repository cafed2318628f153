// Collective matmul, all-gather flavour: C_i = sum_j A_i[:, K_j] @ B_j, B's row blocks travelling a ring of
// ppermutes, each step's transfer overlapped with the GEMM of the block in hand.

#include <optional>

#include "algorithm.hpp"
#include "shardkit/core/gemm.hpp"
#include "transfer.hpp"

namespace shardkit::detail {

Array allgather_ring(const Blocks& blocks) {
  const Mesh& mesh = blocks.a.mesh();
  const std::int64_t k = mesh.axis_size(blocks.axes), kk = blocks.a.shape()[1];
  auto comm = mesh.axis_comm(blocks.axes);
  const int i = comm->rank(), left = (i + k - 1) % k, right = (i + 1) % k;
  const std::int64_t kb = kk / k;
  const Array& a = blocks.a.local();
  const bool device = on_gpu(a);
  Array c = Array::empty({a.dim(0), blocks.b.shape()[1]}, a.dtype(), a.device());
  // The block in hand starts as this rank's own (read, never written: it belongs to the caller); blocks from the
  // ring land in two buffers of ours, used in turn.
  const Array own = blocks.b.local().contiguous();
  Array buf[2] = {Array::empty(own.shape(), own.dtype(), own.device()),
                  Array::empty(own.shape(), own.dtype(), own.device())};
  const Array* cur = &own;
  for (int s = 0; s < k; ++s) {
    const std::int64_t j = (i + s) % k;  // the block of B in hand
    Array* next = &buf[s % 2];
    std::optional<Transfer> t;
    if (s + 1 < k) {
      // Pass the block on to the left while the right neighbour's arrives; the GEMM below runs meanwhile.
      const Token after =
          device ? Token::from_stream(cuda::library_stream(own.device().index), own.device().index) : Token();
      t.emplace(
          [&, cur, next, after] {
            // Every rank of the ring runs this exchange (Peers::kAllSendrecv): it may take shm.
            return comm->sendrecv_into(*cur, left, *next, right, kAllGatherRingTag, kAllGatherRingTag, nullptr, after,
                                       Peers::kAllSendrecv);
          },
          device, blocks.overlap);
    }
    gemm(a.slice(1, j * kb, (j + 1) * kb), *cur, c, 1.0, s == 0 ? 0.0 : 1.0);
    if (t) {
      settle(c);
      t->wait();
      cur = next;
    }
  }
  settle(c);
  return c;
}

}  // namespace shardkit::detail
