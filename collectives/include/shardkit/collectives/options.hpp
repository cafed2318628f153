#pragma once

// The collectives layer's settings, in its own room: a communicator's options (CommOptions), the few that belong to
// the process (ProcessSettings: one watchdog, one dump directory, one trace file per rank), and what the job tells
// the layer as it starts (JobInfo). Nothing here reads the environment: the launch layer reads it once and fills the
// defaults (Config in shardkit/launch/config.hpp), and its Runtime hands the job's facts down. This header and
// options.cpp form their own small target (shardkit::collectives_options), below launch, so that launch can fill
// them without knowing the rest of collectives.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardkit/core/clock.hpp"
#include "shardkit/core/device.hpp"

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

/// How a communicator behaves. A field left out takes the process's default (defaults(): the built-in values below,
/// or the environment's once the launch layer applied it: SHARDKIT_BACKEND, SHARDKIT_CHECK, ...); a sub-communicator
/// (split, dup) inherits its parent's options.
struct CommOptions {
  /// SHARDKIT_BACKEND: which transport runs an operation (kAuto: by where the buffers live).
  BackendKind backend = defaults().backend;
  /// SHARDKIT_CHECK: before each collective, ranks compare signatures and raise MismatchError on disagreement.
  bool check = defaults().check;
  /// SHARDKIT_TIMEOUT_S: an operation that does not complete in time raises TimeoutError and aborts the communicator.
  /// Zero means wait forever.
  std::chrono::milliseconds timeout = defaults().timeout;
  /// MPI operations return at once with a pending token (nonblocking MPI) instead of completing before returning.
  bool async = false;
  /// A name for messages ("world", "mesh axis x", ...).
  std::string name = "world";
  /// The largest element count passed to one MPI call (MPI counts are int). Larger messages are split into chunks or
  /// point-to-point pieces. Lowered by tests to exercise those paths on small buffers.
  std::int64_t max_message_elements = 2147483647;
  /// SHARDKIT_VERBOSE: rank 0 logs the communicator's creation and its transports to stderr.
  bool verbose = defaults().verbose;
  /// SHARDKIT_TRACE_BUFFER: operations the communicator's flight recorder keeps (0: none).
  std::size_t trace_buffer = defaults().trace_buffer;
  /// SHARDKIT_SHM_SINGLE_COPY = 0: the shm transport never reads other ranks' memory (process_vm_readv) and copies
  /// large messages of every operation through its segment, as where the kernel refuses the reads (off on one rank:
  /// off on all).
  bool shm_single_copy = defaults().shm_single_copy;
  /// SHARDKIT_SHM_PENDING_BYTES: how many bytes of eager point-to-point sends a rank may hold back on the shm
  /// transport while the rings to their receivers are full (a receiver busy elsewhere). Past it a send waits for its
  /// receiver to take messages, as a rendezvous send does, under the timeout: a fast producer's memory stays bounded.
  /// 0: every send that finds its ring full waits.
  std::size_t shm_pending_bytes = defaults().shm_pending_bytes;

  /// The built-in values (what the fields above default to when no environment was applied).
  static CommOptions builtin();
  /// The process's defaults: builtin() until set_defaults (the launch layer: the environment) replaced them. The
  /// reference stays valid and unchanged for the life of the process, whatever other threads do.
  static const CommOptions& defaults();
  /// Replaces the process's defaults: communicators' options made from now on start from `options` (its name is
  /// ignored).
  static void set_defaults(const CommOptions& options);
};

/// The settings of the collectives layer that are the process's, not a communicator's.
struct ProcessSettings {
  /// SHARDKIT_HANG_WARN_S (0: never): an operation that has waited this long prints one line per rank (what each
  /// waits for, and since when) and writes the flight recorder's dumps, without ending the job.
  std::chrono::milliseconds hang_warn{std::chrono::minutes(5)};
  /// SHARDKIT_DUMP_DIR: where the flight recorder's dumps go ("": shardkit-dump-<job id> in the working directory).
  std::string dump_dir;
  /// SHARDKIT_DUMP_WAIT_S: before the job ends, how long a rank waits for the other ranks' dumps.
  std::chrono::milliseconds dump_wait{2000};
  /// SHARDKIT_TRACE = DIR: every rank writes each of its operations as a span to DIR/rank<R>.trace.json (Chrome
  /// trace / Perfetto JSON), with its clock's offset to rank 0's, which `shardkit-trace merge DIR` applies. "": none.
  std::string trace_dir;
  /// SHARDKIT_HANDLE_SIGNALS = 0: shardkit leaves SIGINT, SIGTERM and SIGUSR1 alone (what the handlers do:
  /// shardkit/core/interrupt.hpp; SIGUSR1 makes every rank write its flight recorder's dump and goes on).
  bool handle_signals = true;
  /// SHARDKIT_STAGING_POOL_MB: bytes of idle pinned memory the MPI transport keeps for staging device buffers.
  std::size_t staging_pool_bytes = std::size_t{256} << 20;

  /// The process's settings: built-in until set() (the launch layer: the environment). The reference stays valid and
  /// unchanged for the life of the process.
  static const ProcessSettings& current();
  static void set(const ProcessSettings& settings);
};

/// What the job tells the collectives layer: handed down by the launch layer's Runtime as it starts (a Runtime is a
/// JobInfo: Communicator::world(runtime)) and withdrawn as it ends.
struct JobInfo {
  /// The job's world communicator: the handle of an MPI_Comm (shardkit/launch/mpi.hpp's MpiCommHandle), the Runtime's
  /// duplicate of MPI_COMM_WORLD; valid while the job lives.
  std::uintptr_t world = 0;
  /// The device this rank computes on: its bound GPU, or the CPU.
  Device device = Device::cpu();
  /// The job's identity, the same on every rank: the flight recorder's dumps carry it.
  std::uint64_t id = 0;
  /// This rank's wall clock against rank 0's (measured at start-up when tracing; else rounds == 0).
  ClockOffset clock;

  /// The live job's facts, or nullptr when no Runtime lives (a caller's own MPI).
  static const JobInfo* current() noexcept;
  /// Publishes `job` (nullptr: none). The object must stay alive and unchanged until replaced.
  static void set_current(const JobInfo* job) noexcept;
};

}  // namespace shardkit
