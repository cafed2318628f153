#pragma once

// JSON text written by hand (the flight recorder's dumps, the traces, the benchmarks' --json): one string escaper.

#include <cstdio>
#include <string>
#include <string_view>

namespace shardkit {

/// Appends `s` to `out` as a JSON string literal: quotes and backslashes escaped, control characters as \u00XX.
inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += b;
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace shardkit
