#pragma once

// Point-to-point exchanges of the shm backend (sendrecv): each ordered pair of ranks has a channel in the segment (the
// sender's post line, the receiver's acknowledgement line; shm_segment.hpp) and each rank an outbox.
//
// A message is a run of chunks, counted per pair on both sides (the k-th chunk `from` posts to `to` is the k-th `to`
// takes). Its head (size, tag, dtype, and the sender's address when single-copy) travels in the post line with the
// first chunk; up to kInlineBytes of data travel there too. Larger messages go through the sender's outbox in two
// halves, in lockstep with the exchange's other direction (send chunk c, then take chunk c), which cannot deadlock:
// chunk c waits only for the receiver to have taken chunk c - 2. From kSingleCopyBytes the receiver reads the sender's
// buffer itself (process_vm_readv), and the sender returns once it has. Otherwise the sender returns as soon as its
// last chunk is posted; its next send first waits until that message was taken (the outbox and post line are free
// again).
//
// A sendrecv on shm pairs with the peer's sendrecv on shm (never with a recv on MPI): the route sends both alike, by
// what the peers run (OpArgs::peers, routing.hpp).

#include <cstdint>
#include <vector>

#include "backend.hpp"
#include "shm/shm_cma.hpp"
#include "shm/shm_segment.hpp"

namespace shardkit::detail {

class ShmPairs {
 public:
  /// Messages up to this many bytes travel in the post line, after the head.
  static constexpr std::size_t kInlineBytes = 24;
  /// From this many bytes the receiver reads the sender's buffer itself, where the ranks may (shm_cma.hpp).
  static constexpr std::size_t kSingleCopyBytes = std::size_t{16} << 10;

  ShmPairs(const ShmSegment& seg, const CmaPeers& cma, int rank, const WaitPolicy& policy, AbortState& abort);

  /// Sends `send` to `dest` and receives into `recv` from `source` (both ranks; both this rank or neither;
  /// `recv_tag` may be kAnyTag).
  /// @throws MismatchError when the message from `source` is larger than `recv`, of another dtype or tag (the
  /// communicator is aborted); TimeoutError naming the rank that did not come.
  void sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag, RecvStatus* status,
                const OpContext& ctx);

 private:
  struct Head;
  // Posts chunk `chunk` of `send` (read from `from`) to `dest`.
  void post(const Array& send, const unsigned char* from, int dest, int tag, std::int64_t chunk, bool single_copy,
            const OpContext& ctx);
  // Takes chunk `chunk` from `source` into `recv`; returns the message's chunk count (known from its first chunk).
  std::int64_t take(Array& recv, int source, int tag, std::int64_t chunk, RecvStatus* status, const OpContext& ctx);
  void wait(ShmLine& line, std::uint32_t step, int rank, const OpContext& ctx);
  void settle(const OpContext& ctx);

  const ShmSegment& seg_;
  const CmaPeers& cma_;
  int me_;
  WaitPolicy policy_;
  AbortState& abort_;
  std::vector<std::uint32_t> sent_, taken_;  // chunks posted to / taken from each rank
  int owed_ = -1;                            // the rank whose last message from here may not be taken yet (-1: none)
};

}  // namespace shardkit::detail
