// Point-to-point over shared memory (shm_p2p.hpp): receiving, with MPI's matching (source, tag, order).

#include <cstring>
#include <string>
#include <utility>

#include "shardkit/core/error.hpp"
#include "backends/shm/shm_p2p.hpp"
#include "backends/shm/shm_p2p_wire.hpp"

namespace shardkit::detail {

using namespace shm_p2p_wire;  // NOLINT(google-build-using-namespace): the entries' format both halves share

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


}  // namespace shardkit::detail
