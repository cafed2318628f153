#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace shardkit {

/// Which communication engine collectives use.
enum class BackendKind {
  kAuto,  ///< by where the buffers live: CUDA memory -> NCCL when built and a GPU is bound, else MPI
  kMpi,   ///< always MPI (device buffers are staged through pinned memory unless MPI is CUDA-aware)
  kNccl,  ///< always NCCL (host buffers are an error)
  kShm,   ///< shared memory for the collectives it implements on host buffers of one node's ranks, else as kAuto
};
const char* backend_name(BackendKind kind) noexcept;
/// The kind a name of backend_name's stands for ("auto", "mpi", "nccl", "shm"; nullopt: none).
std::optional<BackendKind> backend_from_name(std::string_view name) noexcept;

/// Run-time configuration, read once from the environment (Config::get()) and overridable in code.
struct Config {
  /// SHARDKIT_BACKEND = auto | mpi | nccl | shm.
  BackendKind backend = BackendKind::kAuto;
  /// SHARDKIT_CHECK = 1: before each collective, ranks compare signatures and raise MismatchError on disagreement.
  bool check = false;
  /// SHARDKIT_TIMEOUT_S (seconds, fractional allowed): a collective that does not complete in time raises
  /// TimeoutError and aborts its communicator. Zero means wait forever.
  std::chrono::milliseconds timeout{0};
  /// SHARDKIT_VERBOSE = 1: log communicator creation and backend choices to stderr.
  bool verbose = false;
  /// SHARDKIT_SHM_SINGLE_COPY = 0: the shm backend never reads other ranks' memory (process_vm_readv) and copies large
  /// messages of every operation through its segment, as where the kernel refuses the reads.
  bool shm_single_copy = true;
  /// SHARDKIT_SHM_PENDING_BYTES: how many bytes of eager point-to-point sends a rank may hold back, per shm
  /// communicator, while the rings to their receivers are full (a receiver busy elsewhere). Past it a send waits for
  /// its receiver to take messages, as a rendezvous send does, under the timeout: a fast producer's memory stays
  /// bounded. 0: every send that finds its ring full waits.
  std::size_t shm_pending_bytes = std::size_t{8} << 20;
  /// SHARDKIT_TRACE_BUFFER: operations each communicator's flight recorder keeps (0: none).
  std::size_t trace_buffer = 2000;
  /// SHARDKIT_HANG_WARN_S (seconds; 0: never): an operation that has waited this long prints one line per rank
  /// (what each waits for, and since when) and writes the flight recorder's dumps, without ending the job.
  std::chrono::milliseconds hang_warn{std::chrono::minutes(5)};
  /// SHARDKIT_DUMP_DIR: where the flight recorder's dumps go ("": shardkit-dump-<job id> in the working directory).
  std::string dump_dir;
  /// SHARDKIT_DUMP_WAIT_S (seconds): before the job ends, how long a rank waits for the other ranks' dumps.
  std::chrono::milliseconds dump_wait{2000};
  /// SHARDKIT_TRACE = DIR: every rank writes each of its operations as a span to DIR/rank<R>.trace.json (Chrome
  /// trace / Perfetto JSON), with its clock's offset to rank 0's, which `shardkit-trace merge DIR` applies. Empty
  /// (unset, or 0/off/false/no): no trace.
  std::string trace_dir;
  /// SHARDKIT_HANDLE_SIGNALS = 0: the Runtime leaves SIGINT and SIGTERM alone, and a wait in a collective ends only
  /// when it completes or times out (unless the signal's own disposition ends the process). What the handlers do:
  /// shardkit/core/interrupt.hpp. Also
  /// SIGUSR1, which otherwise makes every rank write its flight recorder's dump and goes on.
  bool handle_signals = true;

  /// Parses the variables above. @throws InvalidArgument on a malformed value.
  static Config from_env();
  /// The process-wide configuration (from_env() on first use; later changes through set()). The reference stays valid
  /// and unchanged for the life of the process, whatever other threads do (a set() publishes a new one).
  static const Config& get();
  /// Replaces the process-wide configuration (tests, bindings): get() returns the new one from now on.
  static void set(const Config& config);
};

}  // namespace shardkit
