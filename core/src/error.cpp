#include "shardkit/core/error.hpp"

#include <cctype>
#include <string_view>

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
