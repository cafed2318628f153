#include "shardkit/core/error.hpp"

namespace shardkit {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kMismatch: return "MismatchError";
    case ErrorCode::kBackend: return "BackendError";
    case ErrorCode::kTimeout: return "TimeoutError";
    case ErrorCode::kInternal: break;
  }
  return "InternalError";
}

namespace detail {

void throw_check_failure(const char* expr, const char* file, int line, const std::string& detail,
                         const std::string& message) {
  std::string text = message.empty() ? std::string("check failed") : message;
  text += concat(" [check ", expr);
  if (!detail.empty()) text += " " + detail;
  text += concat(" failed at ", file, ":", line, "]");
  throw InvalidArgument(text);
}

void throw_internal(const char* expr, const char* file, int line, const std::string& message) {
  throw Error(ErrorCode::kInternal,
              concat("internal error: ", message.empty() ? "assertion failed" : message, " [", expr, " at ", file, ":",
                     line, "]"));
}

}  // namespace detail
}  // namespace shardkit
