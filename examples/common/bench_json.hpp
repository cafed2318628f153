#pragma once

// JSON text for the benchmarks' --json output: strings escaped, numbers that JSON can hold (inf and nan become null).

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "shardkit/core/json.hpp"

namespace shardkit::examples {

/// `s` as a JSON string literal (core's escaper).
inline std::string json_string(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

/// A JSON number with 6 significant digits; null for none, inf or nan (JSON has neither).
inline std::string json_number(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", *v);
  return buf;
}

}  // namespace shardkit::examples
