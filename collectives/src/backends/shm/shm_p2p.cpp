// Point-to-point over shared memory (shm_p2p.hpp): construction and teardown, and sending. Receiving:
// shm_p2p_recv.cpp.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "backends/shm/shm_p2p.hpp"
#include "backends/shm/shm_p2p_wire.hpp"
#include "backends/shm/shm_poster.hpp"

namespace shardkit::detail {

using namespace shm_p2p_wire;  // NOLINT(google-build-using-namespace): the entries' format both halves share


ShmP2p::ShmP2p(const ShmSegment& seg, const CmaPeers& cma, int rank, const WaitPolicy& policy, AbortState& abort,
               std::size_t pending_bytes)
    : seg_(seg),
      cma_(cma),
      me_(rank),
      n_(seg.ranks()),
      geo_(seg.p2p()),
      policy_(policy),
      abort_(abort),
      posted_(static_cast<std::size_t>(n_), 0),
      freed_(posted_),
      reads_posted_(posted_),
      taken_(posted_),
      reads_done_(posted_),
      incoming_(static_cast<std::size_t>(n_)),
      pending_(static_cast<std::size_t>(n_)),
      pending_limit_(pending_bytes),
      dropped_(static_cast<std::size_t>(n_), 0) {
  static_assert(sizeof(Head) == 24 && sizeof(ShmLine::data) >= sizeof(Head) + kInlineBytes);
  // An eager message (one entry) never goes by single copy: send() does not wait for its receiver.
  SHARDKIT_ASSERT(
      geo_.payload >= kInlineBytes && geo_.payload < kSingleCopyBytes && (geo_.entries & (geo_.entries - 1)) == 0,
      "a point-to-point ring of ", geo_.entries, " entries of ", geo_.payload, " bytes");
  shm_poster_track(*this);  // last: from here on the destructor runs
}

ShmP2p::~ShmP2p() {
  close_end();
  if (pending_count_ != 0 && !abort_.aborted)
    shm_wait_until(seg_.bell(me_), policy_, deadline_after(pending_timeout()), [&] { return !flush(); });
  shm_poster_remove(*this);  // from here on no other thread touches it
  report_lost();
}

void ShmP2p::close_end() noexcept {
  // closed(me_): senders drop what is pending for this rank, and a send that waits for it raises.
  seg_.bell(me_).size.store(1, std::memory_order_seq_cst);
  for (int p = 0; p < n_; ++p)
    if (p != me_) shm_ring(seg_.bell(p));
}

void ShmP2p::report_lost() noexcept {
  const std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread is inside (at shutdown): it reports nothing
  auto warn = [&](std::size_t lost, int p, const char* why) {
    if (lost != 0)
      std::fprintf(stderr, "shardkit: warning: rank %d: %zu message(s) sent to rank %d were never received: %s\n", me_,
                   lost, p, why);
  };
  for (int p = 0; p < n_; ++p) {
    warn(dropped_[p], p, "it had freed the communicator (or shut shardkit down)");
    warn(pending_[p].size(), p,
         abort_.aborted ? "the communicator was aborted"
                        : "they still waited for room in its ring when the timeout passed (or a signal came)");
    dropped_[p] = 0;
    forget_pending(p);
  }
}

void ShmP2p::forget_pending(int d) noexcept {
  for (const Pending& m : pending_[d]) pending_bytes_ -= pending_cost(m.bytes);
  pending_count_ -= pending_[d].size();
  pending_[d].clear();
}

// ---- sending -------------------------------------------------------------------------------------------------

void ShmP2p::send(const Array& buf, int dest, int tag, const OpContext& ctx) {
  const std::lock_guard lock(mu_);
  if (dest == me_) {
    queue_own(bytes_of(buf), buf.nbytes(), tag, buf.dtype());
    return;
  }
  const std::uint64_t bytes = buf.nbytes();
  if (bytes <= geo_.payload) {  // eager: posted now where the ring has room, else pending
    if (closed(dest)) {
      ++dropped_[dest];  // nothing will take it (report_lost's warning counts it)
      return;
    }
    if (flush_to(dest) && room(dest)) {
      post_whole(dest, bytes_of(buf), bytes, tag, buf.dtype());
      return;
    }
    // Past the bound on what this rank holds back, the send waits for its receiver to take messages, as a rendezvous
    // send does: until this one is posted, or fits within the bound again (or the receiver freed its end).
    bool posted = false;
    if (pending_bytes_ + pending_cost(bytes) > pending_limit_) {
      refuse_closed(dest, ctx);
      wait_until(ctx, dest, [&] {
        drain();
        post_pending();
        if (flush_to(dest) && room(dest)) {
          post_whole(dest, bytes_of(buf), bytes, tag, buf.dtype());
          return posted = true;
        }
        if (closed(dest)) refuse_closed(dest, ctx);
        return pending_bytes_ + pending_cost(bytes) <= pending_limit_;
      });
    }
    if (!posted) hold_back(buf, dest, tag, ctx);
    return;
  }
  refuse_closed(dest, ctx);
  start(buf, bytes_of(buf), dest, tag);
  finish_send(ctx);
}

void ShmP2p::hold_back(const Array& buf, int dest, int tag, const OpContext& ctx) {
  const std::uint64_t bytes = buf.nbytes();
  auto data = std::make_unique<unsigned char[]>(std::max<std::uint64_t>(bytes, 1));
  copy_bytes(data.get(), bytes_of(buf), bytes);
  pending_[dest].push_back(Pending{tag, buf.dtype(), bytes, std::move(data)});
  ++pending_count_;
  pending_bytes_ += pending_cost(bytes);
  pending_timeout_ms_.store(ctx.timeout.count(), std::memory_order_relaxed);
  if (!registered_) {
    shm_poster_add(*this);
    registered_ = true;
  }
}

void ShmP2p::sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag,
                      RecvStatus* status, const OpContext& ctx) {
  const std::lock_guard lock(mu_);
  const std::uint64_t bytes = send.nbytes();
  const unsigned char* from = bytes_of(send);
  if (dest == me_) {
    // Queued first, as MPI's sendrecv with itself: its receive may take it.
    queue_own(from, bytes, send_tag, send.dtype());
    receive(recv, source, recv_tag, status, ctx);
    return;
  }
  refuse_endless_wait(source, recv_tag, ctx);  // before anything is sent
  // In place (the buffers overlap), what is sent must outlive the receive that overwrites it.
  std::unique_ptr<unsigned char[]> kept;
  const unsigned char* to = bytes_of(recv);
  if (bytes != 0 && recv.nbytes() != 0 && from < to + recv.nbytes() && to < from + bytes) {
    kept.reset(new unsigned char[bytes]);
    std::memcpy(kept.get(), from, bytes);
    from = kept.get();
  }
  start(send, from, dest, send_tag);
  advance();
  receive(recv, source, recv_tag, status, ctx);  // its waits post the rest
  finish_send(ctx);
}

void ShmP2p::start(const Array& buf, const unsigned char* from, int dest, int tag) {
  out_ = Outgoing{};
  out_.active = true;
  out_.from = from;
  out_.bytes = buf.nbytes();
  out_.dest = dest;
  out_.tag = tag;
  out_.dtype = buf.dtype();
  out_.single_copy = cma_.usable && out_.bytes >= kSingleCopyBytes;
}

void ShmP2p::finish_send(const OpContext& ctx) {
  wait_until(ctx, out_.dest, [&] {
    drain();
    if (advance()) return true;
    if (closed(out_.dest)) {  // it would wait for good
      out_.active = false;
      refuse_closed(out_.dest, ctx);
    }
    return false;
  });
}

void ShmP2p::refuse_closed(int dest, const OpContext& ctx) const {
  if (closed(dest))
    throw InvalidArgument(
        concat(ctx.describe(), ": rank ", dest, " has freed the communicator, so nothing sent to it can be received"));
}

bool ShmP2p::advance() {
  post_pending();
  if (!out_.active) return true;
  if (!pending_[out_.dest].empty()) return false;  // what was sent before goes first
  while (!out_.head_posted || (!out_.single_copy && out_.sent < out_.bytes)) {
    if (!room(out_.dest)) return false;
    post_entry(out_);
  }
  if (out_.single_copy && !reached(seg_.p2p_read(me_, out_.dest).flag.load(std::memory_order_acquire), out_.read))
    return false;
  out_.active = false;
  return true;
}

bool ShmP2p::room(int dest) {
  const auto k = static_cast<std::uint32_t>(geo_.entries);
  if (posted_[dest] - freed_[dest] < k) return true;
  freed_[dest] = seg_.p2p_freed(me_, dest).flag.load(std::memory_order_acquire);
  return posted_[dest] - freed_[dest] < k;
}

bool ShmP2p::closed(int rank) const noexcept {
  return seg_.bell(rank).size.load(std::memory_order_acquire) != 0;
}

bool ShmP2p::flush() noexcept {
  if (pending_count_.load(std::memory_order_relaxed) == 0) return false;  // only this thread adds to them
  const std::lock_guard lock(mu_);
  return post_pending();
}

ShmP2p::Posted ShmP2p::post_in_background() noexcept {
  const std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return Posted::kBusy;
  if (post_pending()) return Posted::kSome;
  registered_ = false;
  return Posted::kAll;
}

bool ShmP2p::post_pending() noexcept {
  if (pending_count_ == 0) return false;
  for (int d = 0; d < n_; ++d) flush_to(d);
  return pending_count_ != 0;
}

bool ShmP2p::flush_to(int d) noexcept {
  std::deque<Pending>& q = pending_[d];
  if (!q.empty() && closed(d)) {  // nothing will take them
    dropped_[d] += q.size();
    forget_pending(d);
  }
  while (!q.empty() && room(d)) {
    const Pending& m = q.front();
    post_whole(d, m.data.get(), m.bytes, m.tag, m.dtype);
    pending_bytes_ -= pending_cost(m.bytes);
    q.pop_front();
    --pending_count_;
  }
  return q.empty();
}

void ShmP2p::post_whole(int dest, const unsigned char* from, std::uint64_t bytes, int tag, DType dtype) noexcept {
  Outgoing o{.active = true, .from = from, .bytes = bytes, .dest = dest, .tag = tag, .dtype = dtype};
  post_entry(o);
}

void ShmP2p::post_entry(Outgoing& o) {
  const int d = o.dest;
  const int i = static_cast<int>(posted_[d] & static_cast<std::uint32_t>(geo_.entries - 1));
  ShmLine& line = seg_.p2p_entry(me_, d, i);
  unsigned char* payload = seg_.p2p_payload(me_, d, i);
  Head h{};
  h.tag = o.tag;
  h.dtype = static_cast<std::int16_t>(o.dtype);
  if (!o.head_posted) {
    line.size.store(o.bytes, std::memory_order_relaxed);
    if (o.single_copy) {
      h.kind = Kind::kAddress;
      h.address = reinterpret_cast<std::uintptr_t>(o.from);
      o.read = ++reads_posted_[d];
    } else if (o.bytes <= geo_.payload) {
      h.kind = Kind::kWhole;
      h.piece = static_cast<std::uint32_t>(o.bytes);
      copy_bytes(o.bytes <= kInlineBytes ? line.data + sizeof h : payload, o.from, o.bytes);
    } else {
      h.kind = Kind::kFirst;
      h.piece = static_cast<std::uint32_t>(geo_.payload);
      std::memcpy(payload, o.from, geo_.payload);
    }
    o.head_posted = true;
  } else {
    h.kind = Kind::kMore;
    h.piece = static_cast<std::uint32_t>(std::min<std::uint64_t>(geo_.payload, o.bytes - o.sent));
    std::memcpy(payload, o.from + o.sent, h.piece);
  }
  o.sent += h.piece;
  std::memcpy(line.data, &h, sizeof h);
  line.flag.store(++posted_[d], std::memory_order_seq_cst);
  shm_ring(seg_.bell(d));
}

void ShmP2p::queue_own(const unsigned char* from, std::uint64_t bytes, int tag, DType dtype) {
  Message& m = queue_.emplace_back(Message{me_, tag, dtype, bytes});
  m.data.reset(new unsigned char[std::max<std::uint64_t>(bytes, 1)]);
  copy_bytes(m.data.get(), from, bytes);
}

}  // namespace shardkit::detail
