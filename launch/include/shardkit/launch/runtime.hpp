#pragma once

#include <string>
#include <vector>

#include "shardkit/collectives/options.hpp"
#include "shardkit/core/device.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/clock_sync.hpp"
#include "shardkit/launch/config.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit {

/// MPI thread support levels, weakest first.
enum class ThreadLevel { kSingle = 0, kFunneled = 1, kSerialized = 2, kMultiple = 3 };
const char* thread_level_name(ThreadLevel level) noexcept;

/// Options of the Runtime.
struct RuntimeOptions {
  /// Level asked of MPI_Init_thread when the Runtime initialises MPI.
  ThreadLevel requested_thread_level = ThreadLevel::kMultiple;
  /// Weakest level accepted, whoever initialised MPI; below it the constructor throws BackendError.
  ThreadLevel required_thread_level = ThreadLevel::kSerialized;
  /// Bind this rank to GPU `local_rank % gpu_count` when GPUs exist.
  bool bind_device = true;
  /// Print warnings (ranks sharing a GPU, ...) to stderr; they are always available from warnings().
  bool print_warnings = true;
  /// Install shardkit's SIGINT and SIGTERM handlers (install_interrupt_handlers) while the Runtime lives, so that a
  /// signal ends a rank's wait in a collective with Interrupted (and the job, at exit) rather than being ignored
  /// until the wait ends. Also off when SHARDKIT_HANDLE_SIGNALS=0.
  bool handle_signals = true;
};

/// Which GPU a rank uses, worked out from its place on the node (a pure function, exposed for tests).
struct DeviceBinding {
  Device device;        ///< cuda(local_rank % gpu_count), or cpu when there are no GPUs
  bool shared = false;  ///< more ranks on the node than GPUs: several ranks use one GPU
  std::string warning;  ///< non-empty when `shared`
};
DeviceBinding choose_device(int local_rank, int local_size, int gpu_count);

/// The process's view of the job: initialises MPI unless something else already did (mpi4py may own it) and
/// finalises only what it initialised; knows rank, size, local rank and host; binds the GPU; owns a duplicate of
/// MPI_COMM_WORLD (shardkit never communicates on the world communicator itself). One Runtime exists at a time.
class Runtime {
 public:
  /// @throws BackendError if MPI was already finalised or gives less thread support than required;
  ///         Error if another Runtime is alive.
  explicit Runtime(int* argc = nullptr, char*** argv = nullptr, RuntimeOptions options = {});
  explicit Runtime(RuntimeOptions options) : Runtime(nullptr, nullptr, options) {}
  /// Frees the world duplicate; finalises MPI only if this Runtime initialised it (and nobody finalised it since).
  /// If request_abort_at_exit was called, prints the reason and calls MPI_Abort instead (whoever owns MPI).
  /// Puts back the signal handlers it replaced.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The live Runtime, or nullptr.
  static Runtime* current() noexcept;
  /// The live Runtime. @throws Error when none exists.
  static Runtime& instance();

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// Rank among the processes on this node (MPI_COMM_TYPE_SHARED), and their count.
  int local_rank() const noexcept { return local_rank_; }
  int local_size() const noexcept { return local_size_; }
  const std::string& host() const noexcept { return host_; }
  /// True when this Runtime called MPI_Init_thread (and so will call MPI_Finalize).
  bool owns_mpi() const noexcept { return owns_mpi_; }
  /// Thread support MPI provides.
  ThreadLevel thread_level() const noexcept { return thread_level_; }
  /// GPUs visible to this process (0 without a driver or device).
  int gpu_count() const noexcept { return gpu_count_; }
  /// The device this rank computes on: its bound GPU, or the CPU.
  Device device() const noexcept { return binding_.device; }
  /// The binding decision, including whether ranks share a GPU.
  const DeviceBinding& binding() const noexcept { return binding_; }
  /// The duplicated world communicator (handle of an MPI_Comm; valid while the Runtime lives).
  MpiCommHandle world() const noexcept { return world_.handle(); }
  /// This rank's wall clock against rank 0's, measured at start-up when SHARDKIT_TRACE is set (else rounds == 0).
  const ClockOffset& clock_offset() const noexcept { return job_.clock; }
  /// This job's identity, the same on every rank (rank 0's random number, handed to all at start-up): the flight
  /// recorder's dumps carry it, so that a dump an earlier job left is never taken for this job's.
  std::uint64_t job_id() const noexcept { return job_.id; }
  /// What the Runtime hands the collectives layer (published as JobInfo::current() while it lives): a Runtime passes
  /// for its JobInfo, as in Communicator::world(runtime).
  const JobInfo& job() const noexcept { return job_; }
  operator const JobInfo&() const noexcept { return job_; }  // NOLINT(google-explicit-constructor)
  /// Warnings raised at start-up.
  const std::vector<std::string>& warnings() const noexcept { return warnings_; }
  /// One line: rank, host, device, backend and library versions.
  std::string describe() const;

 private:
  bool owns_mpi_ = false;
  ThreadLevel thread_level_ = ThreadLevel::kSingle;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
  int gpu_count_ = 0;
  DeviceBinding binding_;
  MpiComm world_;
  JobInfo job_;
  std::vector<std::string> warnings_;
  bool installed_signal_handlers_ = false;
};

}  // namespace shardkit
