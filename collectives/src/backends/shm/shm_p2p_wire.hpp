#pragma once

// The point-to-point rings' entries as both ends read them (shm_p2p.cpp sends, shm_p2p_recv.cpp receives): what a
// line carries before its inline data, and the helpers both halves use.

#include <cstdint>
#include <cstring>
#include <string>

#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "backends/shm/shm_p2p.hpp"

namespace shardkit::detail {
namespace shm_p2p_wire {

enum class Kind : std::uint8_t {
  kWhole,    // the whole message (inline, or in the entry's payload)
  kFirst,    // the head and first piece of a message in several entries
  kMore,     // a further piece
  kAddress,  // the head of a message the receiver reads from the sender's buffer (single copy)
};

inline void copy_bytes(void* to, const void* from, std::size_t n) {
  if (n != 0) std::memcpy(to, from, n);
}

inline bool matches(int s, int t, int source, int tag) {
  return (source == kAnySource || source == s) && (tag == kAnyTag || tag == t);
}

inline std::string tag_text(int tag) {
  return tag == kAnyTag ? std::string("any") : concat(tag);
}

template <typename H>
H head_of(const ShmLine& line) {
  H h;
  std::memcpy(&h, line.data, sizeof h);
  return h;
}

}  // namespace shm_p2p_wire

// What an entry's line carries before its inline data; the message's size is the line's `size`.
struct ShmP2p::Head {
  std::uint64_t address;  // kAddress: the sender's buffer
  std::int32_t tag;
  std::uint32_t piece;  // bytes of the message in this entry
  std::int16_t dtype;
  shm_p2p_wire::Kind kind;
  std::uint8_t unused[5];
};

// Waits (under the deadline) until `ready()` holds; else raises naming `peer`.
template <typename Ready>
void ShmP2p::wait_until(const OpContext& ctx, int peer, Ready&& ready) {
  if (shm_wait_until(seg_.bell(me_), policy_, ctx.deadline, ready)) return;
  raise_unfinished(ctx, abort_,
                   peer == kAnySource ? std::string("no rank sent it a message it takes (shared memory)")
                                      : concat("rank(s) ", peer, " did not arrive (shared memory)"));
}

}  // namespace shardkit::detail
