#pragma once

// A fourth transport, for tests only: it shows what adding one takes (this folder, one registry line in the test,
// and its tests). "loopback" serves the communicators of one rank whose name starts with "loopback:", where every
// collective's result is its input: it copies, without MPI.

#include <atomic>
#include <cstdint>

#include "transport.hpp"

namespace shardkit::testing {

/// What its operations are recorded as: a kind no other transport has.
inline constexpr BackendKind kLoopbackKind = static_cast<BackendKind>(16);

/// Its descriptor (register it with detail::register_transport).
const detail::Transport& loopback_transport() noexcept;

/// Operations it has run, in this process.
std::int64_t loopback_operations() noexcept;

}  // namespace shardkit::testing
