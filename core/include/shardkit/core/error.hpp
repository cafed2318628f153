#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardkit {

/// What kind of failure an Error reports. The Python package maps each code to its own exception class.
enum class ErrorCode {
  kInvalidArgument,  ///< A caller passed something the API does not accept; nothing was sent.
  kMismatch,         ///< Ranks disagreed on a collective (checked mode).
  kBackend,          ///< MPI, NCCL or CUDA reported a failure.
  kTimeout,          ///< An operation did not complete within the configured timeout.
  kInternal,         ///< A broken invariant inside shardkit.
  kInterrupted,      ///< SIGINT or SIGTERM arrived while the operation was waiting.
};

/// How many error codes there are: ErrorCode's values are 0 .. kErrorCodeCount - 1.
inline constexpr int kErrorCodeCount = static_cast<int>(ErrorCode::kInterrupted) + 1;

/// One row of the error table, which every view of the errors reads (the Python exception classes, the messages JAX's
/// handlers pass back, shardkit.jax._ops's translation of them).
struct ErrorKind {
  ErrorCode code;
  const char* name;          ///< the class's name ("InvalidArgument"): the C++ class and the Python exception
  const char* doc;           ///< what it means: the Python class's docstring
  const char* builtin_base;  ///< the Python built-in exception the class also derives from ("ValueError"), or nullptr
};

/// The row of `code` (every class derives from shardkit::Error, shardkit.Error in Python); the rows are walked with
/// `for (int i = 0; i < kErrorCodeCount; ++i) error_kind(static_cast<ErrorCode>(i))`.
const ErrorKind& error_kind(ErrorCode code) noexcept;
/// Name of an error code's class ("InvalidArgument", ..., "InternalError").
const char* error_code_name(ErrorCode code) noexcept;

/// Base of every exception shardkit throws. `what()` is the text for users: what went wrong and what to do, with no
/// source paths or check expressions; those go to `where()`, for bug reports.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, std::string where = {})
      : std::runtime_error(message), code_(code), where_(std::move(where)) {}
  /// The kind of failure.
  ErrorCode code() const noexcept { return code_; }
  /// The check or native call that raised it and its source location ("root < size at collectives/src/...:42");
  /// empty when the error was not raised by a check macro.
  const std::string& where() const noexcept { return where_; }

 private:
  ErrorCode code_;
  std::string where_;
};

/// A caller passed an argument the API does not accept (thrown before anything is sent).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message, std::string where = {})
      : Error(ErrorCode::kInvalidArgument, message, std::move(where)) {}
};

/// Ranks disagreed on the signature of a collective (operation, dtype, count, root, op, sequence number).
class MismatchError : public Error {
 public:
  explicit MismatchError(const std::string& message) : Error(ErrorCode::kMismatch, message) {}
};

/// A native library (MPI, NCCL, CUDA, BLAS) reported a failure; keeps the library's own code and message.
class BackendError : public Error {
 public:
  /// @param backend  "MPI", "NCCL", "CUDA", ...
  /// @param native_code  the library's error code
  /// @param message  full message, including the library's own error string
  /// @param where  the native call and its source location (see Error::where)
  BackendError(std::string backend, int native_code, const std::string& message, std::string where = {})
      : Error(ErrorCode::kBackend, message, std::move(where)), backend_(std::move(backend)), native_code_(native_code) {}
  /// Which library failed.
  const std::string& backend() const noexcept { return backend_; }
  /// The library's own error code.
  int native_code() const noexcept { return native_code_; }

 private:
  std::string backend_;
  int native_code_;
};

/// An operation did not complete within the configured timeout (SHARDKIT_TIMEOUT_S).
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(ErrorCode::kTimeout, message) {}
};

/// SIGINT or SIGTERM arrived while an operation was waiting (see shardkit/core/interrupt.hpp); the operation is left
/// unfinished, its communicator aborted, and the job ends at exit. Python raises it as a KeyboardInterrupt.
class Interrupted : public Error {
 public:
  /// @param signal  the signal's number (SIGINT, SIGTERM)
  Interrupted(const std::string& message, int signal) : Error(ErrorCode::kInterrupted, message), signal_(signal) {}
  /// The signal that interrupted the wait.
  int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

namespace detail {

/// Builds a message from any streamable parts.
template <typename... Parts>
std::string concat(const Parts&... parts) {
  if constexpr (sizeof...(Parts) == 0) {
    return std::string();
  } else {
    std::ostringstream os;
    (os << ... << parts);
    return os.str();
  }
}

[[noreturn]] void throw_check_failure(const char* expr, const char* file, int line, const std::string& detail,
                                      const std::string& message);
[[noreturn]] void throw_internal(const char* expr, const char* file, int line, const std::string& message);
/// Throws BackendError for a failed CUDA runtime call; implemented where CUDA is linked (or reports "not built").
[[noreturn]] void throw_cuda_error(int code, const char* expr, const char* file, int line);

/// "(3 == 5 is false)": the values a failed comparison check adds to its message.
template <typename A, typename B>
std::string describe_operands(const A& a, const B& b, const char* op) {
  std::ostringstream os;
  os << "(" << a << " " << op << " " << b << " is false)";
  return os.str();
}

/// The source location of a check for Error::where: the path from the project's top folder when it is known.
std::string source_location(const char* expr, const char* file, int line);
/// " in MPI_Recv" for the expression "MPI_Recv(buf, ...)": the native function a failed call named, for messages
/// (empty when the expression is not a call).
std::string called_function(const char* expr);

}  // namespace detail
}  // namespace shardkit

/// Throws InvalidArgument with the message when `cond` is false (the condition, file and line go to where()).
#define SHARDKIT_CHECK(cond, ...)                                                                       \
  do {                                                                                                  \
    if (!(cond)) [[unlikely]]                                                                           \
      ::shardkit::detail::throw_check_failure(#cond, __FILE__, __LINE__, "", ::shardkit::detail::concat(__VA_ARGS__)); \
  } while (0)

#define SHARDKIT_CHECK_OP_(a, b, op, ...)                                                                     \
  do {                                                                                                        \
    const auto& shardkit_a_ = (a);                                                                            \
    const auto& shardkit_b_ = (b);                                                                            \
    if (!(shardkit_a_ op shardkit_b_)) [[unlikely]]                                                           \
      ::shardkit::detail::throw_check_failure(#a " " #op " " #b, __FILE__, __LINE__,                          \
                                              ::shardkit::detail::describe_operands(shardkit_a_, shardkit_b_, #op), \
                                              ::shardkit::detail::concat(__VA_ARGS__));                       \
  } while (0)

/// Comparison checks: throw InvalidArgument printing both operands.
#define SHARDKIT_CHECK_EQ(a, b, ...) SHARDKIT_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define SHARDKIT_CHECK_NE(a, b, ...) SHARDKIT_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define SHARDKIT_CHECK_LT(a, b, ...) SHARDKIT_CHECK_OP_(a, b, <, __VA_ARGS__)
#define SHARDKIT_CHECK_LE(a, b, ...) SHARDKIT_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define SHARDKIT_CHECK_GT(a, b, ...) SHARDKIT_CHECK_OP_(a, b, >, __VA_ARGS__)
#define SHARDKIT_CHECK_GE(a, b, ...) SHARDKIT_CHECK_OP_(a, b, >=, __VA_ARGS__)

/// Internal invariant: throws Error(kInternal) when false. Not for validating user input.
#define SHARDKIT_ASSERT(cond, ...)                                                                        \
  do {                                                                                                    \
    if (!(cond)) [[unlikely]]                                                                             \
      ::shardkit::detail::throw_internal(#cond, __FILE__, __LINE__, ::shardkit::detail::concat(__VA_ARGS__)); \
  } while (0)

/// Wraps a CUDA runtime call (cudaError_t); throws BackendError with cudaGetErrorString's text on failure.
/// Only usable where the CUDA runtime header is included; the macro itself needs nothing from CUDA.
#define SHARDKIT_CUDA_CHECK(expr)                                                                    \
  do {                                                                                               \
    const int shardkit_cuda_err_ = static_cast<int>(expr);                                           \
    if (shardkit_cuda_err_ != 0) [[unlikely]]                                                        \
      ::shardkit::detail::throw_cuda_error(shardkit_cuda_err_, #expr, __FILE__, __LINE__);           \
  } while (0)
