#include "shm/shm_pairs.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

// Half an outbox: a chunk of a message through the segment.
constexpr std::size_t kChunkBytes = ShmSegment::kSlotBytes / 2;

}  // namespace

// The head of a message, at the start of its post line's data.
struct ShmPairs::Head {
  std::uint64_t bytes;
  std::uint64_t address;  // the sender's buffer, when the receiver reads it itself; else 0
  std::int32_t tag;
  std::int32_t dtype;
};
static_assert(sizeof(ShmLine::data) >= 24 + ShmPairs::kInlineBytes);

namespace {

std::int64_t chunks_of(std::size_t bytes, bool single_copy) {
  if (single_copy || bytes <= ShmPairs::kInlineBytes) return 1;
  return static_cast<std::int64_t>((bytes + kChunkBytes - 1) / kChunkBytes);
}

}  // namespace

ShmPairs::ShmPairs(const ShmSegment& seg, const CmaPeers& cma, int rank, const WaitPolicy& policy, AbortState& abort)
    : seg_(seg),
      cma_(cma),
      me_(rank),
      policy_(policy),
      abort_(abort),
      sent_(static_cast<std::size_t>(seg.ranks()), 0),
      taken_(static_cast<std::size_t>(seg.ranks()), 0) {}

void ShmPairs::sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag,
                        RecvStatus* status, const OpContext& ctx) {
  const std::size_t bytes = send.nbytes();
  settle(ctx);
  // In place, what is sent must outlive the receive that overwrites it.
  const unsigned char* from = bytes_of(send);
  std::vector<unsigned char> kept;
  if (bytes > kInlineBytes && send.data() == recv.data()) {
    kept.assign(from, from + bytes);
    from = kept.data();
  }
  const bool single_copy = cma_.usable && bytes >= kSingleCopyBytes && dest != me_;
  const std::int64_t to_send = chunks_of(bytes, single_copy);
  std::int64_t to_take = 1;  // known once the first chunk has come
  for (std::int64_t c = 0; c < std::max(to_send, to_take); ++c) {
    if (c < to_send) post(send, from, dest, send_tag, c, single_copy, ctx);
    if (c < to_take) {
      const std::int64_t n = take(recv, source, recv_tag, c, status, ctx);
      if (c == 0) to_take = n;
    }
  }
  owed_ = dest;
  if (single_copy) settle(ctx);  // the receiver reads `from` itself
}

void ShmPairs::post(const Array& send, const unsigned char* from, int dest, int tag, std::int64_t chunk,
                    bool single_copy, const OpContext& ctx) {
  ShmLine& line = seg_.post_line(me_, dest);
  const std::size_t bytes = send.nbytes();
  const std::uint32_t first = sent_[dest] - static_cast<std::uint32_t>(chunk);  // this message's first chunk, less 1
  if (chunk == 0) {
    const Head h{bytes, single_copy ? reinterpret_cast<std::uintptr_t>(from) : 0, tag,
                 static_cast<std::int32_t>(send.dtype())};
    std::memcpy(line.data, &h, sizeof h);
    if (bytes <= kInlineBytes) std::memcpy(line.data + sizeof h, from, bytes);
  }
  if (!single_copy && bytes > kInlineBytes) {
    // The half this chunk goes to is free once the chunk two before it was taken.
    if (chunk >= 2) wait(seg_.ack_line(me_, dest), first + static_cast<std::uint32_t>(chunk - 1), dest, ctx);
    const std::size_t at = static_cast<std::size_t>(chunk) * kChunkBytes;
    std::memcpy(seg_.outbox(me_) + (chunk & 1) * kChunkBytes, from + at, std::min(kChunkBytes, bytes - at));
  }
  shm_post(line, ++sent_[dest]);
}

std::int64_t ShmPairs::take(Array& recv, int source, int tag, std::int64_t chunk, RecvStatus* status,
                            const OpContext& ctx) {
  ShmLine& line = seg_.post_line(source, me_);
  const std::uint32_t step = taken_[source] + 1;
  wait(line, step, source, ctx);
  Head h;
  std::memcpy(&h, line.data, sizeof h);
  unsigned char* to = bytes_of(recv);
  if (chunk == 0) {
    const auto dtype = static_cast<DType>(h.dtype);
    if (h.bytes > recv.nbytes() || dtype != recv.dtype() || (tag != kAnyTag && tag != h.tag)) {
      abort_.aborted = true;
      abort_.reason = concat(ctx.describe(), " received a message it did not expect");
      throw MismatchError(concat(ctx.describe(), ": rank ", source, " sent ", h.bytes, " bytes of ", dtype_name(dtype),
                                 " with tag ", h.tag, ", rank ", me_, " expected at most ", recv.nbytes(), " bytes of ",
                                 dtype_name(recv.dtype()), " with tag ",
                                 tag == kAnyTag ? std::string("any") : concat(tag),
                                 " (on shared memory a sendrecv pairs with the peer's sendrecv, in call order)"));
    }
    if (status) *status = RecvStatus{source, h.tag, static_cast<std::int64_t>(h.bytes / recv.itemsize())};
  }
  if (h.address != 0) {
    if (!cma_read(cma_.pids[source], to, reinterpret_cast<const void*>(h.address), h.bytes))
      raise_unfinished(ctx, abort_,
                       concat("process_vm_readv from rank ", source, " failed (", std::strerror(errno), ")"));
  } else if (h.bytes <= kInlineBytes) {
    std::memcpy(to, line.data + sizeof h, h.bytes);
  } else {
    const std::size_t at = static_cast<std::size_t>(chunk) * kChunkBytes;
    std::memcpy(to + at, seg_.outbox(source) + (chunk & 1) * kChunkBytes, std::min(kChunkBytes, h.bytes - at));
  }
  shm_post(seg_.ack_line(source, me_), step);
  taken_[source] = step;
  return chunks_of(h.bytes, h.address != 0);
}

void ShmPairs::settle(const OpContext& ctx) {
  if (owed_ < 0) return;
  wait(seg_.ack_line(me_, owed_), sent_[owed_], owed_, ctx);
  owed_ = -1;
}

void ShmPairs::wait(ShmLine& line, std::uint32_t step, int rank, const OpContext& ctx) {
  if (!reached(line.flag.load(std::memory_order_acquire), step) && !shm_wait(line, step, policy_, ctx.deadline))
    raise_unfinished(ctx, abort_, concat("rank(s) ", rank, " did not arrive (shared memory)"));
}

}  // namespace shardkit::detail
