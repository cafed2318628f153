#pragma once

// Point-to-point messages of the shm backend (send, recv, sendrecv), matched as MPI matches them: a receive takes the
// earliest message from its source (any source: from any rank) with its tag (or any tag); messages from one rank to
// another never overtake each other; a message no receive wants yet waits in the receiver's queue of unexpected
// messages.
//
// Each ordered pair of ranks has a ring of entries in the segment (shm_segment.hpp, P2pGeometry). A message up to an
// entry's payload travels in one entry (up to kInlineBytes in the entry's line itself), and its sender returns once it
// is posted, as MPI's eager messages. A larger one travels as a run of entries, the first with the message's head, and
// its sender returns once the last is posted; or, from kSingleCopyBytes where the ranks may read each other's memory
// (shm_cma.hpp), as one entry with the sender's address: the receiver reads the buffer itself, and the sender returns
// once it has (MPI's rendezvous). A rank's messages to itself go straight to its own queue.
//
// A send of up to an entry's payload does not wait for its receiver, as MPI's eager sends do not: where the ring to the
// receiver is full (it is taking nothing: busy, or in a collective), a copy waits in the sender's queue of pending
// sends, up to SHARDKIT_SHM_PENDING_BYTES of them (Config::shm_pending_bytes; past it the send waits, under the
// timeout, until its receiver has taken enough, as a rendezvous send does: a fast producer's memory stays bounded), and
// is posted once the ring has room: by the sender's own later point-to-point calls on the communicator, and
// by the process's poster thread (shm_poster.hpp) whatever the sender does meanwhile (an operation on any
// communicator, a blocking MPI call, its own computation). Freeing the communicator waits until they are posted, until
// the receiver has freed its end, or until the timeout of the send that queued the last one passes (what is still
// pending then is dropped, with a warning). One thread at a time is inside a ShmP2p (its lock): the owner's
// operations, or the poster, which only ever tries the lock.
//
// While a rank waits (for room in a ring, for its buffer to be read, for a message), it moves what arrived into its
// queue and posts what its sends still have to send, so that ranks sending to each other at once all progress.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "backend.hpp"
#include "backends/shm/shm_cma.hpp"
#include "backends/shm/shm_segment.hpp"

namespace shardkit::detail {

class ShmP2p {
 public:
  /// Messages up to this many bytes travel in their entry's line, after the head.
  static constexpr std::size_t kInlineBytes = 24;
  /// From this many bytes the receiver reads the sender's buffer itself, where the ranks may (shm_cma.hpp).
  static constexpr std::size_t kSingleCopyBytes = std::size_t{16} << 10;

  /// `pending_bytes`: CommOptions::shm_pending_bytes, how much of its eager sends a rank may hold back.
  ShmP2p(const ShmSegment& seg, const CmaPeers& cma, int rank, const WaitPolicy& policy, AbortState& abort,
         std::size_t pending_bytes);
  /// Marks this rank's end gone (senders waiting for room to it drop what they have for it), then waits until its own
  /// pending sends are posted (see above).
  ~ShmP2p();
  ShmP2p(const ShmP2p&) = delete;
  ShmP2p& operator=(const ShmP2p&) = delete;

  /// Sends `buf` to `dest` with `tag`: up to an entry's payload, returns at once (posted, or pending: see above, unless
  /// the pending sends are at their bound; or dropped, counted for the destructor's warning, where `dest` has freed
  /// the communicator).
  /// @throws TimeoutError naming `dest` when it takes nothing before the deadline (a larger message); InvalidArgument
  /// when a larger message goes to a rank that has freed the communicator.
  void send(const Array& buf, int dest, int tag, const OpContext& ctx);
  /// Receives the earliest matching message from `source` (or kAnySource) with `tag` (or kAnyTag) into `buf`.
  /// @throws MismatchError (the communicator aborted) when the message is larger than `buf` or of another dtype;
  /// InvalidArgument when only this rank could send it and it has not (a wait that could never end; nothing taken);
  /// TimeoutError naming the source.
  void recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx);
  /// Sends `send` to `dest` and receives into `recv` from `source`, both at once (`send` and `recv` may overlap).
  void sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag, RecvStatus* status,
                const OpContext& ctx);
  /// Posts the pending sends the rings have room for now; true while some are still pending. Never throws; waits only
  /// for the poster's thread to leave this object (shm_poster.hpp).
  bool flush() noexcept;

  /// For the poster (shm_poster.hpp): what post_in_background did.
  enum class Posted {
    kAll,   // nothing is pending any more (it no longer holds this one)
    kSome,  // some still wait for room
    kBusy,  // another thread is inside (its owner, which posts them itself): nothing done
  };
  /// Where no other thread is inside, posts what the rings have room for. Never throws or waits.
  Posted post_in_background() noexcept;
  /// This rank's doorbell, which its receivers ring as they free entries.
  ShmLine& doorbell() const noexcept { return seg_.bell(me_); }
  /// For shutdown (shm_poster_close_all) and the destructor: marks this rank's end gone (senders drop what they have
  /// for it, and a send that would wait for it raises). Idempotent; any thread.
  void close_end() noexcept;
  /// Whether some sends are pending. Any thread.
  bool has_pending() const noexcept { return pending_count_.load(std::memory_order_acquire) != 0; }
  /// The timeout of the send that queued the last pending one (0: none). Any thread.
  std::chrono::milliseconds pending_timeout() const noexcept {
    return std::chrono::milliseconds(pending_timeout_ms_.load(std::memory_order_relaxed));
  }
  /// Prints a warning per rank that lost messages (dropped, or still pending: those are dropped now) and forgets them,
  /// unless another thread is inside.
  void report_lost() noexcept;

 private:
  struct Head;
  // A message that arrived before a receive wanted it: its data (or, single copy, where the sender's buffer is).
  struct Message {
    int source;
    int tag;
    DType dtype;
    std::uint64_t bytes;
    std::uint64_t address = 0;  // single copy: the sender's buffer, read once a receive takes it
    bool single_copy = false;
    bool complete = true;  // false while the rest of its entries arrive (Incoming::queued)
    std::unique_ptr<unsigned char[]> data;
  };
  // Where the rest of a message in several entries from one rank goes: a receive's buffer or a queued message's.
  struct Incoming {
    unsigned char* to = nullptr;
    std::uint64_t bytes = 0;
    std::uint64_t got = 0;
    Message* queued = nullptr;
    bool active() const { return to != nullptr && got < bytes; }
  };
  // The message this rank is sending (at most one: a send or sendrecv returns only once it is done).
  struct Outgoing {
    bool active = false;
    const unsigned char* from = nullptr;
    std::uint64_t bytes = 0;
    std::uint64_t sent = 0;  // bytes posted
    int dest = -1;
    int tag = 0;
    DType dtype{};
    bool single_copy = false;
    bool head_posted = false;
    std::uint32_t read = 0;  // single copy: the count of reads of this rank's buffers by `dest` that means done
  };

  // An eager message that found its ring full: a copy, posted once the ring has room.
  struct Pending {
    int tag;
    DType dtype;
    std::uint64_t bytes;
    std::unique_ptr<unsigned char[]> data;
  };

  // Sending.
  // What a pending message counts against the bound: its bytes and its bookkeeping.
  static std::uint64_t pending_cost(std::uint64_t bytes) noexcept { return bytes + 64; }
  void hold_back(const Array& buf, int dest, int tag, const OpContext& ctx);  // a copy joins the pending sends
  void forget_pending(int dest) noexcept;  // drops what is pending for `dest` (counted by the caller)
  void start(const Array& buf, const unsigned char* from, int dest, int tag);
  bool advance();  // posts pending sends, then what the ring has room for; true once the outgoing message is done
  bool room(int dest);
  bool closed(int rank) const noexcept;  // whether `rank`'s end is gone (close_end: destroyed, or shut down)
  void refuse_closed(int dest, const OpContext& ctx) const;  // InvalidArgument where closed(dest): a send would wait
  bool post_pending() noexcept;                              // flush() with the lock held
  bool flush_to(int dest) noexcept;      // posts what is pending for `dest` while there is room; true once none is
  void post_entry(Outgoing& o);
  // Posts a message of up to an entry's payload, whole, in the next entry to `dest` (which must have room).
  void post_whole(int dest, const unsigned char* from, std::uint64_t bytes, int tag, DType dtype) noexcept;
  void queue_own(const unsigned char* from, std::uint64_t bytes, int tag, DType dtype);
  void finish_send(const OpContext& ctx);
  // Receiving.
  void receive(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx);  // recv(), lock held
  ShmLine* ready_entry(int source);
  // Where an entry's data lies: in its line for a whole message of up to kInlineBytes, else in its payload.
  const unsigned char* entry_data(int source, const ShmLine& line, std::uint64_t inline_bytes) const;
  void free_entry(int source);
  ShmLine* peek(int source);  // the head of the next message from `source`, once what precedes it has arrived
  void take_head(int source, ShmLine& line, unsigned char* to, Message* queued, const OpContext* ctx);
  void queue_head(int source, ShmLine& line);
  void drain(int skip = -1);  // queues what arrived from every rank but `skip` (-1: none; kAnySource: all skipped)
  bool deliver_from_rings(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx);
  void deliver_queued(std::list<Message>::iterator m, Array& buf, RecvStatus* status, const OpContext& ctx);
  void finish_incoming(int source, const OpContext& ctx);
  void read_single_copy(int source, unsigned char* to, std::uint64_t address, std::uint64_t bytes,
                        const OpContext& ctx);
  void check_fits(int source, int tag, DType dtype, std::uint64_t bytes, const Array& buf, int want_tag,
                  const OpContext& ctx);
  void refuse_endless_wait(int source, int tag, const OpContext& ctx) const;
  // Waiting: spins, yields, then sleeps on this rank's bell; `ready` is asked again each time (and may make progress).
  template <typename Ready>
  void wait_until(const OpContext& ctx, int peer, Ready&& ready);

  const ShmSegment& seg_;
  const CmaPeers& cma_;
  int me_, n_;
  P2pGeometry geo_;
  WaitPolicy policy_;
  AbortState& abort_;
  std::vector<std::uint32_t> posted_;        // entries posted to each rank
  std::vector<std::uint32_t> freed_;         // entries each rank was last seen to have freed of this rank's ring to it
  std::vector<std::uint32_t> reads_posted_;  // single-copy messages posted to each rank
  std::vector<std::uint32_t> taken_;         // entries taken from each rank
  std::vector<std::uint32_t> reads_done_;    // single-copy messages of each rank read
  std::vector<Incoming> incoming_;
  std::list<Message> queue_;  // unexpected messages, in arrival order (a rank's in the order it sent them)
  Outgoing out_;
  // Held by the thread inside: an operation of the owner's, the poster, the destructor.
  std::mutex mu_;
  std::vector<std::deque<Pending>> pending_;  // for each rank, in the order sent
  std::atomic<std::size_t> pending_count_ = 0;    // changed with mu_ held; read without, by its owner's flush()
  std::uint64_t pending_bytes_ = 0;               // their pending_cost, with mu_ held
  std::uint64_t pending_limit_;                   // Config::shm_pending_bytes
  bool registered_ = false;                       // whether the poster holds it (shm_poster_add)
  std::vector<std::size_t> dropped_;              // pending sends to each rank dropped as its end was gone
  std::atomic<std::chrono::milliseconds::rep> pending_timeout_ms_{0};  // pending_timeout()
};

}  // namespace shardkit::detail
