#pragma once

// Where an operation was called from, for the flight recorder (SHARDKIT_TRACE_BUFFER): a language binding sets it
// before it runs an operation on the calling thread (the Python binding: the caller's file and line).

namespace shardkit {

struct CallSite {
  const char* file = nullptr;  ///< interned: lives as long as the process
  int line = 0;
};

/// The calling thread's call site for the operations it runs next (empty: none known).
CallSite& current_call_site() noexcept;

}  // namespace shardkit
