#pragma once

// Where an operation was called from, for the flight recorder (SHARDKIT_TRACE_BUFFER): a language binding sets it
// before it runs an operation on the calling thread (the Python binding: the caller's file and line).

#include <cstdint>

namespace shardkit {

struct CallSite {
  const char* file = nullptr;  ///< interned: lives as long as the process
  int line = 0;
};

/// The calling thread's call site for the operations it runs next (empty: none known).
CallSite& current_call_site() noexcept;

/// A small integer standing for a call site, the same for equal sites (0: none), so that a compiled program can carry
/// the site of each of its operations from the trace to the run (the JAX layer's handler sets it back by call_site_of).
std::int64_t call_site_id(const CallSite& site);
/// The site of an id from call_site_id (an unknown id: none).
CallSite call_site_of(std::int64_t id) noexcept;

}  // namespace shardkit
