#pragma once

#include <memory>

#include "shardkit/core/cuda.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit {

/// Orders execution, as mpi4jax's token does. Every operation takes a token and returns a new one:
///
/// 1. Every operation takes an optional token and returns `(result, token)`.
/// 2. An operation given token `t` starts only after the operation that produced `t` has completed — across
///    communicators and backends, and relative to user kernels ordered on the token (from_stream / order_stream).
/// 3. Operations on one communicator execute in call order (MPI's matching rule), with or without tokens.
/// 4. A result is safe to read from the host after `wait()`; every host access path of the library (copy to host,
///    DLPack export, printing) waits by itself.
/// 5. NCCL operations are stream-ordered and do not block the host: their token is a CUDA event. MPI operations
///    complete before returning, or, when issued asynchronously, complete by the time the token is waited for.
/// 6. `join(a, b)` waits for both; a default token is already complete.
///
/// Tokens are cheap to copy (a shared handle). A complete token holds nothing.
class Token {
 public:
  /// An already complete token.
  Token() = default;
  /// A token that completes when `w` does (nullptr: complete).
  explicit Token(std::shared_ptr<Waitable> w) : w_(std::move(w)) {}

  /// A token that completes when both `a` and `b` have.
  static Token join(const Token& a, const Token& b);
  /// A token that completes when the work enqueued on `stream` so far completes (records a CUDA event).
  static Token from_stream(StreamHandle stream, int device);

  /// Blocks the host until complete. Rethrows what the operation raised (TimeoutError, Interrupted, BackendError, ...).
  void wait() const {
    if (w_) w_->wait();
  }
  /// True once complete; never blocks.
  bool is_complete() const;
  /// Makes later work on `stream` wait for this token: a device-side wait for CUDA events, a host wait otherwise.
  void order_stream(StreamHandle stream) const;
  /// The underlying waitable (nullptr when complete at creation).
  const std::shared_ptr<Waitable>& waitable() const noexcept { return w_; }

 private:
  std::shared_ptr<Waitable> w_;
};

}  // namespace shardkit
