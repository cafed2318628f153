#include "shardkit/launch/runtime.hpp"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

#include "shardkit/config.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/interrupt.hpp"
#include "shardkit/launch/clock_sync.hpp"

namespace shardkit {
namespace {

std::atomic<Runtime*> g_current{nullptr};

int to_mpi_level(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::kSingle: return MPI_THREAD_SINGLE;
    case ThreadLevel::kFunneled: return MPI_THREAD_FUNNELED;
    case ThreadLevel::kSerialized: return MPI_THREAD_SERIALIZED;
    case ThreadLevel::kMultiple: break;
  }
  return MPI_THREAD_MULTIPLE;
}

ThreadLevel from_mpi_level(int level) {
  if (level >= MPI_THREAD_MULTIPLE) return ThreadLevel::kMultiple;
  if (level >= MPI_THREAD_SERIALIZED) return ThreadLevel::kSerialized;
  if (level >= MPI_THREAD_FUNNELED) return ThreadLevel::kFunneled;
  return ThreadLevel::kSingle;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

}  // namespace

const char* thread_level_name(ThreadLevel level) noexcept {
  switch (level) {
    case ThreadLevel::kSingle: return "MPI_THREAD_SINGLE";
    case ThreadLevel::kFunneled: return "MPI_THREAD_FUNNELED";
    case ThreadLevel::kSerialized: return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::kMultiple: break;
  }
  return "MPI_THREAD_MULTIPLE";
}

DeviceBinding choose_device(int local_rank, int local_size, int gpu_count) {
  SHARDKIT_CHECK(local_rank >= 0 && local_rank < local_size, "local rank ", local_rank, " outside [0, ", local_size,
                 ")");
  SHARDKIT_CHECK_GE(gpu_count, 0, "negative GPU count");
  DeviceBinding b;
  if (gpu_count == 0) {
    b.device = Device::cpu();
    return b;
  }
  b.device = Device::cuda(local_rank % gpu_count);
  if (local_size > gpu_count) {
    b.shared = true;
    b.warning = detail::concat(local_size, " ranks on this node share ", gpu_count, " GPU", gpu_count == 1 ? "" : "s",
                               ": rank-local ", local_rank, " uses cuda:", b.device.index,
                               " with others (slower, and NCCL needs NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL >= 2.30)");
  }
  return b;
}

Runtime::Runtime(int* argc, char*** argv, RuntimeOptions options) {
  Runtime* expected = nullptr;
  if (!g_current.compare_exchange_strong(expected, this))
    throw Error(ErrorCode::kInvalidArgument, "a shardkit Runtime already exists in this process; use Runtime::instance()");
  try {
    // The environment fills the collectives layer's defaults before anything is made (a malformed value throws).
    const Config config = Config::get();
    if (mpi_finalized())
      throw BackendError("MPI", 0, "MPI has already been finalised in this process; it cannot be initialised again");
    int provided = MPI_THREAD_SINGLE;
    if (mpi_initialized()) {
      SHARDKIT_MPI_CHECK(MPI_Query_thread(&provided));  // someone else (mpi4py, the application) owns MPI
    } else {
      // A process started without a launcher (a singleton) discovers its topology itself, through hwloc, whose
      // OpenCL plugin loads the OpenCL vendor libraries: on a CUDA image (H200, Ubuntu 24.04, Open MPI 4.1.6) one of
      // them crashed the process at a null call inside MPI_Init. MPI needs no OpenCL devices in its topology: the
      // plugin stays out unless the user chose hwloc's components (an empty value chooses nothing).
      if (const char* chosen = std::getenv("HWLOC_COMPONENTS"); chosen == nullptr || *chosen == '\0')
        setenv("HWLOC_COMPONENTS", "-opencl", /*overwrite=*/1);
      SHARDKIT_MPI_CHECK(MPI_Init_thread(argc, argv, to_mpi_level(options.requested_thread_level), &provided));
      owns_mpi_ = true;
    }
    thread_level_ = from_mpi_level(provided);
    if (thread_level_ < options.required_thread_level)
      throw BackendError("MPI", 0,
                         detail::concat("MPI provides ", thread_level_name(thread_level_), " but shardkit needs at least ",
                                        thread_level_name(options.required_thread_level),
                                        owns_mpi_ ? "" : " (MPI was initialised before shardkit with a lower level)"));

    detail::install_world_error_handler();
    world_ = MpiComm::dup(mpi_comm_world());
    rank_ = world_.rank();
    size_ = world_.size();
    {
      MpiComm node;
      MPI_Comm node_comm = MPI_COMM_NULL;
      SHARDKIT_MPI_CHECK(MPI_Comm_split_type(to_mpi<MPI_Comm>(world_.handle()), MPI_COMM_TYPE_SHARED, rank_,
                                             MPI_INFO_NULL, &node_comm));
      SHARDKIT_MPI_CHECK(MPI_Comm_rank(node_comm, &local_rank_));
      SHARDKIT_MPI_CHECK(MPI_Comm_size(node_comm, &local_size_));
      MPI_Comm_free(&node_comm);
    }
    host_ = host_name();
    {
      // Rank 0's random number (its clock mixed in), handed to every rank: the job's identity in the flight
      // recorder's dumps. A blocking bcast, as the duplicate and the node split above are.
      std::uint64_t id = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(wall_clock_ns()) ^
                         (static_cast<std::uint64_t>(getpid()) << 32);
      SHARDKIT_MPI_CHECK(MPI_Bcast(&id, 1, MPI_UINT64_T, 0, to_mpi<MPI_Comm>(world_.handle())));
      job_.id = id;
    }
    // Only for traces: the merged timeline needs every rank's clock against rank 0's (a few ping-pongs per rank).
    if (!config.process.trace_dir.empty()) job_.clock = measure_clock_offset(world_.handle());

    gpu_count_ = cuda::device_count();
    binding_ = choose_device(local_rank_, local_size_, options.bind_device ? gpu_count_ : 0);
    if (binding_.device.kind == DeviceKind::kCUDA) cuda::set_device(binding_.device.index);
    if (binding_.shared) warnings_.push_back(binding_.warning);
    if (options.print_warnings && local_rank_ == 0)
      for (const auto& w : warnings_) std::fprintf(stderr, "shardkit: warning: %s\n", w.c_str());
    // After MPI_Init_thread, so that the handlers chain to any MPI installed as well as to Python's.
    if (options.handle_signals && config.process.handle_signals)
      installed_signal_handlers_ = install_interrupt_handlers();
    // The collectives layer learns the job's facts (Communicator::world(), the recorders' job id, the traces' clock).
    job_.world = world_.handle();
    job_.device = binding_.device;
    JobInfo::set_current(&job_);
  } catch (...) {
    world_ = MpiComm();
    if (owns_mpi_ && !mpi_finalized()) MPI_Finalize();
    g_current.store(nullptr);
    throw;
  }
}

Runtime::~Runtime() {
  if (const std::string reason = abort_at_exit_reason(); !reason.empty() && !mpi_finalized()) {
    run_before_abort(reason);
    std::fprintf(stderr, "shardkit: rank %d: ending the job (MPI_Abort): %s\n", rank_, reason.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  run_before_finalize();
  JobInfo::set_current(nullptr);
  if (installed_signal_handlers_) uninstall_interrupt_handlers();
  world_ = MpiComm();  // free our duplicate before MPI goes away
  if (owns_mpi_ && !mpi_finalized()) {
    if (MPI_Finalize() != MPI_SUCCESS) std::fprintf(stderr, "shardkit: warning: MPI_Finalize failed\n");
  }
  g_current.store(nullptr);
}

Runtime* Runtime::current() noexcept { return g_current.load(); }

Runtime& Runtime::instance() {
  Runtime* r = g_current.load();
  if (!r) throw Error(ErrorCode::kInvalidArgument, "no shardkit Runtime: create one (shardkit::Runtime rt(&argc, &argv);)");
  return *r;
}

std::string Runtime::describe() const {
  const CommOptions& defaults = CommOptions::defaults();
  std::string device = binding_.device.to_string();
  if (binding_.device.kind == DeviceKind::kCUDA) device += " (" + cuda::device_name(binding_.device.index) + ")";
  std::string backend;
  if (defaults.backend != BackendKind::kAuto)
    backend = backend_name(defaults.backend);
  else
    backend = (binding_.device.kind == DeviceKind::kCUDA && SHARDKIT_HAVE_NCCL) ? "nccl" : "mpi";

  std::string cuda_text;
  if (!cuda::compiled())
    cuda_text = "not built";
  else if (gpu_count_ == 0)
    cuda_text = "runtime " + cuda_version_text(cuda::runtime_version()) + ", 0 GPUs (" + cuda::unavailable_reason() + ")";
  else
    cuda_text = "runtime " + cuda_version_text(cuda::runtime_version()) + ", driver " +
                cuda_version_text(cuda::driver_version()) + ", " + std::to_string(gpu_count_) + " GPU" +
                (gpu_count_ == 1 ? "" : "s");
  return detail::concat("rank ", rank_, "/", size_, " host=", host_, " local_rank=", local_rank_, "/", local_size_,
                        " device=", device, " backend=", backend, " | shardkit ", SHARDKIT_VERSION_STRING,
                        ", MPI: ", mpi_library_version().substr(0, mpi_library_version().find(',')), " (", thread_level_name(thread_level_), "), CUDA: ",
                        cuda_text, ", NCCL: ", SHARDKIT_HAVE_NCCL ? "built " SHARDKIT_NCCL_VERSION_STRING : "not built");
}

}  // namespace shardkit
