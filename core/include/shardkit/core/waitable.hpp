#pragma once

#include "shardkit/core/cuda.hpp"

namespace shardkit {

/// Something that completes later: an in-flight collective, a CUDA event, a join of several. Arrays carry one as
/// their *ready event*; every host access through the library waits for it (token rule 4).
class Waitable {
 public:
  virtual ~Waitable() = default;
  /// Blocks the host until complete. May throw what the operation raised (TimeoutError, BackendError, ...).
  virtual void wait() = 0;
  /// True once complete; never blocks.
  virtual bool is_complete() = 0;
  /// Makes work later enqueued on `stream` wait for completion. The default blocks the host, which is always
  /// correct; CUDA events override it with a device-side wait.
  virtual void enqueue_wait(StreamHandle stream) {
    (void)stream;
    wait();
  }
};

}  // namespace shardkit
