#include "shm/shm_p2p.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/config.hpp"
#include "shm/shm_poster.hpp"

namespace shardkit::detail {
namespace {

enum class Kind : std::uint8_t {
  kWhole,    // the whole message (inline, or in the entry's payload)
  kFirst,    // the head and first piece of a message in several entries
  kMore,     // a further piece
  kAddress,  // the head of a message the receiver reads from the sender's buffer (single copy)
};

void copy_bytes(void* to, const void* from, std::size_t n) {
  if (n != 0) std::memcpy(to, from, n);
}

bool matches(int s, int t, int source, int tag) {
  return (source == kAnySource || source == s) && (tag == kAnyTag || tag == t);
}

std::string tag_text(int tag) {
  return tag == kAnyTag ? std::string("any") : concat(tag);
}

}  // namespace

// What an entry's line carries before its inline data; the message's size is the line's `size`.
struct ShmP2p::Head {
  std::uint64_t address;  // kAddress: the sender's buffer
  std::int32_t tag;
  std::uint32_t piece;  // bytes of the message in this entry
  std::int16_t dtype;
  Kind kind;
  std::uint8_t unused[5];
};

namespace {

template <typename H>
H head_of(const ShmLine& line) {
  H h;
  std::memcpy(&h, line.data, sizeof h);
  return h;
}

}  // namespace

ShmP2p::ShmP2p(const ShmSegment& seg, const CmaPeers& cma, int rank, const WaitPolicy& policy, AbortState& abort)
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
      pending_limit_(Config::get().shm_pending_bytes),
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

// ---- receiving -----------------------------------------------------------------------------------------------

void ShmP2p::recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) {
  const std::lock_guard lock(mu_);
  receive(buf, source, tag, status, ctx);
}

void ShmP2p::receive(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it)
    if (matches(it->source, it->tag, source, tag)) return deliver_queued(it, buf, status, ctx);
  refuse_endless_wait(source, tag, ctx);
  wait_until(ctx, source, [&] {
    if (deliver_from_rings(buf, source, tag, status, ctx)) return true;
    advance();
    if (source != kAnySource) drain(source);
    return false;
  });
}

ShmLine* ShmP2p::ready_entry(int s) {
  ShmLine& line = seg_.p2p_entry(s, me_, static_cast<int>(taken_[s] & static_cast<std::uint32_t>(geo_.entries - 1)));
  return line.flag.load(std::memory_order_acquire) == taken_[s] + 1 ? &line : nullptr;
}

const unsigned char* ShmP2p::entry_data(int s, const ShmLine& line, std::uint64_t inline_bytes) const {
  if (inline_bytes <= kInlineBytes) return line.data + sizeof(Head);
  return seg_.p2p_payload(s, me_, static_cast<int>(taken_[s] & static_cast<std::uint32_t>(geo_.entries - 1)));
}

void ShmP2p::free_entry(int s) {
  seg_.p2p_freed(s, me_).flag.store(++taken_[s], std::memory_order_seq_cst);
  shm_ring(seg_.bell(s));
}

ShmLine* ShmP2p::peek(int s) {
  Incoming& in = incoming_[s];
  while (in.active()) {
    ShmLine* line = ready_entry(s);
    if (!line) return nullptr;
    const auto h = head_of<Head>(*line);
    SHARDKIT_ASSERT(h.kind == Kind::kMore && h.piece <= in.bytes - in.got, "rank ", s,
                    "'s message went on with an entry of kind ", static_cast<int>(h.kind));
    copy_bytes(in.to + in.got, entry_data(s, *line, ~std::uint64_t{0}), h.piece);
    in.got += h.piece;
    free_entry(s);
  }
  if (in.to) {
    if (in.queued) in.queued->complete = true;
    in = Incoming{};
  }
  return ready_entry(s);
}

void ShmP2p::take_head(int s, ShmLine& line, unsigned char* to, Message* queued, const OpContext* ctx) {
  const auto h = head_of<Head>(line);
  const std::uint64_t bytes = line.size.load(std::memory_order_relaxed);
  switch (h.kind) {
    case Kind::kWhole:
      copy_bytes(to, entry_data(s, line, bytes), bytes);
      free_entry(s);
      break;
    case Kind::kFirst:
      std::memcpy(to, entry_data(s, line, ~std::uint64_t{0}), h.piece);
      free_entry(s);
      incoming_[s] = Incoming{to, bytes, h.piece, queued};
      if (queued) queued->complete = false;
      break;
    case Kind::kAddress:
      free_entry(s);
      if (queued)
        queued->address = h.address;
      else
        read_single_copy(s, to, h.address, bytes, *ctx);
      break;
    case Kind::kMore:
      SHARDKIT_ASSERT(false, "rank ", s, " sent a message's piece before its head");
  }
}

void ShmP2p::queue_head(int s, ShmLine& line) {
  const auto h = head_of<Head>(line);
  const std::uint64_t bytes = line.size.load(std::memory_order_relaxed);
  Message& m = queue_.emplace_back(Message{s, h.tag, static_cast<DType>(h.dtype), bytes});
  m.single_copy = h.kind == Kind::kAddress;
  if (!m.single_copy) m.data.reset(new unsigned char[std::max<std::uint64_t>(bytes, 1)]);
  take_head(s, line, m.data.get(), &m, nullptr);
}

void ShmP2p::drain(int skip) {
  for (int s = 0; s < n_; ++s) {
    if (s == me_ || s == skip) continue;
    while (ShmLine* line = peek(s)) queue_head(s, *line);
  }
}

bool ShmP2p::deliver_from_rings(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) {
  const int first = source == kAnySource ? 0 : source, last = source == kAnySource ? n_ - 1 : source;
  for (int s = first; s <= last; ++s) {
    if (s == me_) continue;
    while (ShmLine* line = peek(s)) {
      const auto h = head_of<Head>(*line);
      if (!matches(s, h.tag, source, tag)) {
        queue_head(s, *line);
        continue;
      }
      const std::uint64_t bytes = line->size.load(std::memory_order_relaxed);
      check_fits(s, h.tag, static_cast<DType>(h.dtype), bytes, buf, tag, ctx);
      take_head(s, *line, bytes_of(buf), nullptr, &ctx);
      finish_incoming(s, ctx);
      if (status) *status = RecvStatus{s, h.tag, static_cast<std::int64_t>(bytes / buf.itemsize())};
      return true;
    }
  }
  return false;
}

void ShmP2p::deliver_queued(std::list<Message>::iterator it, Array& buf, RecvStatus* status, const OpContext& ctx) {
  const int s = it->source, tag = it->tag;
  const std::uint64_t bytes = it->bytes;
  check_fits(s, tag, it->dtype, bytes, buf, tag, ctx);
  unsigned char* to = bytes_of(buf);
  if (it->single_copy) {
    const std::uint64_t address = it->address;
    queue_.erase(it);
    read_single_copy(s, to, address, bytes, ctx);
  } else if (it->complete) {
    copy_bytes(to, it->data.get(), bytes);
    queue_.erase(it);
  } else {
    // Its first pieces have come: they go to the receive's buffer, and the rest straight there.
    Incoming& in = incoming_[s];
    copy_bytes(to, it->data.get(), in.got);
    in.to = to;
    in.queued = nullptr;
    queue_.erase(it);
    finish_incoming(s, ctx);
  }
  if (status) *status = RecvStatus{s, tag, static_cast<std::int64_t>(bytes / buf.itemsize())};
}

void ShmP2p::finish_incoming(int s, const OpContext& ctx) {
  wait_until(ctx, s, [&] {
    peek(s);
    if (!incoming_[s].active()) return true;
    advance();
    drain(s);
    return false;
  });
}

void ShmP2p::read_single_copy(int s, unsigned char* to, std::uint64_t address, std::uint64_t bytes,
                              const OpContext& ctx) {
  if (!cma_read(cma_.pids[s], to, reinterpret_cast<const void*>(address), bytes))
    raise_unfinished(ctx, abort_, concat("process_vm_readv from rank ", s, " failed (", std::strerror(errno), ")"));
  seg_.p2p_read(s, me_).flag.store(++reads_done_[s], std::memory_order_seq_cst);
  shm_ring(seg_.bell(s));
}

void ShmP2p::check_fits(int s, int tag, DType dtype, std::uint64_t bytes, const Array& buf, int want_tag,
                        const OpContext& ctx) {
  if (bytes <= buf.nbytes() && dtype == buf.dtype()) return;
  abort_.aborted = true;
  abort_.reason = concat(ctx.describe(), " received a message it did not expect");
  throw MismatchError(concat(ctx.describe(), ": rank ", s, " sent ", bytes, " bytes of ", dtype_name(dtype),
                             " with tag ", tag, ", rank ", me_, " expected at most ", buf.nbytes(), " bytes of ",
                             dtype_name(buf.dtype()), " with tag ", tag_text(want_tag),
                             " (the communicator is aborted)"));
}

void ShmP2p::refuse_endless_wait(int source, int tag, const OpContext& ctx) const {
  if (source != me_ && !(source == kAnySource && n_ == 1)) return;
  for (const Message& m : queue_)
    if (matches(m.source, m.tag, source, tag)) return;
  throw InvalidArgument(concat(ctx.describe(), ": a receive from rank ", me_, " (itself) with tag ", tag_text(tag),
                               ", but it sent itself no such message before: it would wait forever"));
}

template <typename Ready>
void ShmP2p::wait_until(const OpContext& ctx, int peer, Ready&& ready) {
  if (shm_wait_until(seg_.bell(me_), policy_, ctx.deadline, ready)) return;
  raise_unfinished(ctx, abort_,
                   peer == kAnySource ? std::string("no rank sent it a message it takes (shared memory)")
                                      : concat("rank(s) ", peer, " did not arrive (shared memory)"));
}

}  // namespace shardkit::detail
