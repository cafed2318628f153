#include "shardkit/core/error.hpp"

#include <array>
#include <cctype>
#include <string_view>

namespace shardkit {

namespace {

// The one list of error classes, in ErrorCode order (see ErrorKind).
constexpr std::array<ErrorKind, kErrorCodeCount> kErrorKinds = {{
    {ErrorCode::kInvalidArgument, "InvalidArgument",
     "A caller passed something the API does not accept; nothing was sent.", "ValueError"},
    {ErrorCode::kMismatch, "MismatchError", "Ranks disagreed on a collective (checked mode).", nullptr},
    {ErrorCode::kBackend, "BackendError", "MPI, NCCL, CUDA or BLAS reported a failure (see .backend, .native_code).",
     nullptr},
    {ErrorCode::kTimeout, "TimeoutError",
     "An operation did not complete within SHARDKIT_TIMEOUT_S; its communicator is aborted.", "TimeoutError"},
    {ErrorCode::kInternal, "InternalError",
     "A broken invariant inside shardkit: a bug (please report it with the error's .where).", nullptr},
    {ErrorCode::kInterrupted, "Interrupted",
     "SIGINT or SIGTERM arrived while an operation waited; its communicator is aborted and the job ends at exit.",
     "KeyboardInterrupt"},
}};
constexpr bool in_code_order() {
  for (std::size_t i = 0; i < kErrorKinds.size(); ++i)
    if (static_cast<std::size_t>(kErrorKinds[i].code) != i || kErrorKinds[i].name == nullptr) return false;
  return true;
}
static_assert(in_code_order(), "kErrorKinds needs one named row per ErrorCode, in ErrorCode order");

}  // namespace

const ErrorKind& error_kind(ErrorCode code) noexcept {
  const auto i = static_cast<std::size_t>(code);
  return i < kErrorKinds.size() ? kErrorKinds[i] : kErrorKinds[static_cast<int>(ErrorCode::kInternal)];
}

const char* error_code_name(ErrorCode code) noexcept { return error_kind(code).name; }

namespace detail {

std::string source_location(const char* expr, const char* file, int line) {
  std::string_view path(file);
#ifdef SHARDKIT_SOURCE_DIR
  if (path.starts_with(SHARDKIT_SOURCE_DIR)) path.remove_prefix(std::string_view(SHARDKIT_SOURCE_DIR).size());
#endif
  return concat(expr, " at ", path, ":", line);
}

std::string called_function(const char* expr) {
  std::string_view e(expr);
  const auto open = e.find('(');
  if (open == std::string_view::npos || open == 0) return {};
  for (char c : e.substr(0, open))
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) return {};
  return concat(" in ", e.substr(0, open));
}

void throw_check_failure(const char* expr, const char* file, int line, const std::string& detail,
                         const std::string& message) {
  std::string text = message.empty() ? std::string("invalid argument") : message;
  if (!detail.empty()) text += " " + detail;
  throw InvalidArgument(text, source_location(expr, file, line));
}

void throw_internal(const char* expr, const char* file, int line, const std::string& message) {
  throw Error(ErrorCode::kInternal,
              concat("internal error in shardkit: ", message.empty() ? "assertion failed" : message,
                     " (a bug: please report it with the error's `where`)"),
              source_location(expr, file, line));
}

}  // namespace detail
}  // namespace shardkit
