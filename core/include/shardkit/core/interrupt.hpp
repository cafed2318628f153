#pragma once

// Waits that SIGINT and SIGTERM can end. shardkit's wait loops (MPI requests polled against a deadline, pending
// tokens, NCCL events) run inside an InterruptibleWait and check interrupt_signal() as they poll. The handlers that
// install_interrupt_handlers() puts in place (the Runtime does, unless SHARDKIT_HANDLE_SIGNALS=0) raise a flag when
// a signal arrives while a wait is in progress, and pass the signal on to the handler that was there before
// (Python's, which then raises KeyboardInterrupt as usual). Outside a wait, and for a second signal while the first
// one is still pending, the previous disposition acts alone: a program that never waits sees no difference.

#include <string>

#include "shardkit/core/error.hpp"

namespace shardkit {

/// Installs the SIGINT and SIGTERM handlers (once; later calls do nothing). Returns false when they could not be
/// installed (sigaction failed); the waits then run to completion or timeout as before.
bool install_interrupt_handlers() noexcept;
/// Puts back the handlers that install_interrupt_handlers() replaced.
void uninstall_interrupt_handlers() noexcept;
/// True while the handlers are installed.
bool interrupt_handlers_installed() noexcept;

/// The signal that interrupted a wait (SIGINT, SIGTERM), or 0. It stays raised: the operation it interrupted is
/// left unfinished, so every later wait of the process fails the same way until the job ends.
int interrupt_signal() noexcept;
/// True while some thread of the process is inside an InterruptibleWait.
bool waits_in_progress() noexcept;
/// The last signal that arrived outside any wait and went to the previous handler (Python's, which raises
/// KeyboardInterrupt only once its thread is back in the interpreter), or 0; reading it lowers it. The watchdog
/// (collectives) ends a rank whose thread stays inside a blocking MPI call after such a signal.
int take_handed_on_signal() noexcept;
/// Raises the flag as the handler does (async-signal-safe); for tests and for embedders with their own handlers.
void request_interrupt(int signal) noexcept;

/// Marks the calling thread as waiting for the lifetime of the object: a signal arriving meanwhile ends the wait
/// instead of (first) acting as the previous disposition would.
class InterruptibleWait {
 public:
  InterruptibleWait() noexcept;
  ~InterruptibleWait();
  InterruptibleWait(const InterruptibleWait&) = delete;
  InterruptibleWait& operator=(const InterruptibleWait&) = delete;
};

namespace detail {
/// Lowers the flag (tests only: the interrupted operation is still unfinished).
void clear_interrupt() noexcept;
/// Throws the Interrupted error of the operation `what` ("allreduce #3 on communicator 'world'"), whose wait
/// interrupt_signal() ended; `consequence` says what became of it ("the communicator is aborted").
[[noreturn]] void throw_interrupted(const std::string& what, const std::string& consequence);
}  // namespace detail

}  // namespace shardkit
