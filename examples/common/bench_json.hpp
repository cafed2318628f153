#pragma once

// JSON text for the benchmarks' --json output: strings escaped, numbers that JSON can hold (inf and nan become null).

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace shardkit::examples {

/// `s` as a JSON string literal: quotes and backslashes escaped, control characters as \u00XX.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

/// A JSON number with 6 significant digits; null for none, inf or nan (JSON has neither).
inline std::string json_number(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", *v);
  return buf;
}

}  // namespace shardkit::examples
