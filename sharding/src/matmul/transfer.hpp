#pragma once

// Overlap of a matmul step's transfer with the GEMM of the data already in hand. On the host the transfer runs on a
// helper thread doing the blocking MPI call, so the MPI library progresses it while the GEMM runs (a nonblocking call
// would only progress inside later MPI calls). On a GPU, NCCL's stream runs it.

#include <future>
#include <utility>

#include "shardkit/collectives/token.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/core/cuda.hpp"

namespace shardkit::detail {

inline bool on_gpu(const Array& a) {
  return a.device().kind == DeviceKind::kCUDA;
}

/// Waits for the GPU GEMMs on `a`'s library stream, before host code reuses their buffers.
inline void settle(const Array& a) {
  if (on_gpu(a)) cuda::synchronize(cuda::library_stream(a.device().index));
}

/// A transfer started now and finished by wait(): on a helper thread for host buffers, directly (stream-ordered) for
/// GPU buffers, or at once when overlap is off.
class Transfer {
 public:
  template <typename F>
  Transfer(F&& f, bool device, bool overlap) {
    if (device || !overlap) {
      token_ = f();
      if (!overlap) token_.wait();
    } else {
      future_ = std::async(std::launch::async, std::forward<F>(f));
    }
  }
  /// Completes the transfer; rethrows its error.
  void wait() {
    if (future_.valid()) token_ = future_.get();
    token_.wait();
  }

 private:
  std::future<Token> future_;
  Token token_;
};

}  // namespace shardkit::detail
