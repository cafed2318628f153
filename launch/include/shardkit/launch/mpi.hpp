#pragma once

// MPI as the rest of shardkit uses it, without including mpi.h: communicators travel as opaque handles (the value
// of an MPI_Comm, as mpi4py's MPI._handleof() returns it), and RAII owns the ones shardkit creates.

#include <cstdint>
#include <string>
#include <type_traits>

namespace shardkit {

/// An MPI_Comm as an integer (a pointer in Open MPI, an int in MPICH).
using MpiCommHandle = std::uintptr_t;

namespace detail {
/// Converts an MPI handle to or from an integer: reinterpret_cast where one side is a pointer (Open MPI's handles),
/// static_cast between integers (MPICH's).
template <typename To, typename From>
To handle_cast(From value) noexcept {
  if constexpr (std::is_pointer_v<To> || std::is_pointer_v<From>)
    return reinterpret_cast<To>(value);
  else
    return static_cast<To>(value);
}
}  // namespace detail

/// Converts between MPI_Comm and MpiCommHandle; instantiate where mpi.h is included: `to_mpi<MPI_Comm>(h)`.
template <typename Comm>
Comm to_mpi(MpiCommHandle h) noexcept {
  return detail::handle_cast<Comm>(h);
}
template <typename Comm>
MpiCommHandle from_mpi(Comm c) noexcept {
  return detail::handle_cast<MpiCommHandle>(c);
}

bool mpi_initialized() noexcept;  ///< MPI_Initialized
bool mpi_finalized() noexcept;    ///< MPI_Finalized
/// MPI_Get_library_version of the MPI library this process runs (first line).
std::string mpi_library_version();
/// "Open MPI", "MPICH", ... from the library version string.
std::string mpi_vendor();
/// True when the MPI library reports CUDA awareness (MPIX_Query_cuda_support in Open MPI / MPICH builds).
bool mpi_cuda_aware() noexcept;

/// The handle of MPI_COMM_WORLD (for tests and interop; shardkit itself never communicates on it).
MpiCommHandle mpi_comm_world() noexcept;

/// An MPI communicator owned by shardkit: created by dup or split with MPI_ERRORS_RETURN set, so failures come back
/// as BackendError instead of aborting; freed on destruction unless MPI is already finalised. Move-only.
class MpiComm {
 public:
  MpiComm() = default;
  /// MPI_Comm_dup of `parent`. Collective over `parent`.
  static MpiComm dup(MpiCommHandle parent);
  /// MPI_Comm_split of `parent`. Collective over `parent`. A negative color gives a null communicator.
  static MpiComm split(MpiCommHandle parent, int color, int key);
  /// Takes ownership of a communicator made elsewhere (e.g. by MPI_Comm_idup), setting MPI_ERRORS_RETURN.
  static MpiComm adopt(MpiCommHandle comm);
  ~MpiComm();
  MpiComm(MpiComm&& other) noexcept;
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MpiCommHandle handle() const noexcept { return handle_; }
  bool is_null() const noexcept { return rank_ < 0; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

 private:
  void take(MpiCommHandle h);
  MpiCommHandle handle_ = 0;
  int rank_ = -1;
  int size_ = 0;
};

// ---- how the job ends: MPI_Finalize, or MPI_Abort when a collective was left in flight ----------------------------

/// Asks that the job end with MPI_Abort instead of MPI_Finalize when the Runtime goes away: used after a collective
/// timed out or was interrupted, when finalising could hang on the operation left in flight. `reason` is printed then.
void request_abort_at_exit(const std::string& reason);
/// The reason given to request_abort_at_exit ("" when none).
std::string abort_at_exit_reason();
/// What runs just before shardkit ends the job with MPI_Abort (the flight recorder: its dumps, and a short wait for
/// the other ranks'); set once by the collectives layer. run_before_abort runs it (at most once; never throws).
void set_before_abort(void (*fn)(const std::string& reason));
void run_before_abort(const std::string& reason) noexcept;
/// What runs as the Runtime goes away, before MPI_Finalize, unless the job ends with MPI_Abort (the shm backend: the
/// ends of communicators still alive are closed, their pending sends posted or dropped, so that no peer waits for
/// them); set once by the collectives layer. Must not throw.
void set_before_finalize(void (*fn)() noexcept);
void run_before_finalize() noexcept;

namespace detail {
/// Throws BackendError with MPI_Error_string's text for a failed MPI call. A truncated message (MPI_ERR_TRUNCATE: the
/// ranks disagree on a size, and only the receiver knows) also asks that the job end at exit.
[[noreturn]] void throw_mpi_error(int code, const char* expr, const char* file, int line);

/// Open MPI reports the errors of completing nonblocking collectives (MPI_Testall) through MPI_COMM_WORLD's error
/// handler, whoever owns the requests. When that handler is MPI_ERRORS_ARE_FATAL (MPI's default), the Runtime puts
/// in its place one that returns the error to the MPI call inside a WorldErrorsReturned scope (shardkit's waits, which
/// turn it into a BackendError) and is fatal, as before, everywhere else.
void install_world_error_handler();
/// While alive, MPI errors raised on MPI_COMM_WORLD in this thread are returned (see install_world_error_handler).
class WorldErrorsReturned {
 public:
  WorldErrorsReturned() noexcept;
  ~WorldErrorsReturned();
  WorldErrorsReturned(const WorldErrorsReturned&) = delete;
  WorldErrorsReturned& operator=(const WorldErrorsReturned&) = delete;
};
}  // namespace detail

}  // namespace shardkit

/// Wraps an MPI call; throws BackendError("MPI", code, message with MPI_Error_string) when it does not return
/// MPI_SUCCESS (0 in every implementation).
#define SHARDKIT_MPI_CHECK(expr)                                                                 \
  do {                                                                                           \
    const int shardkit_mpi_err_ = (expr);                                                        \
    if (shardkit_mpi_err_ != 0) [[unlikely]]                                                     \
      ::shardkit::detail::throw_mpi_error(shardkit_mpi_err_, #expr, __FILE__, __LINE__);         \
  } while (0)
