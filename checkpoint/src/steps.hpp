#pragma once
// A checkpoint root's directory names: committed steps are `step_<N>`; temporary directories start with ".tmp-".

#include <cstdint>
#include <string>

namespace shardkit::checkpoint::detail {

/// Prefix of every temporary directory under a root (ignored by readers, removed by the next save).
inline constexpr const char* kTmpPrefix = ".tmp-";

/// The directory of step `step` under `root`.
std::string step_path(const std::string& root, std::int64_t step);

}  // namespace shardkit::checkpoint::detail
