#include "backends/shm/shm_single_copy.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "backends/shm/shm_fold.hpp"

namespace shardkit::detail {
namespace {

// The piece of each rank's input an allreduce reads at a time: the pieces of every rank stay in L2.
constexpr std::size_t kPieceBytes = std::size_t{128} << 10;

}  // namespace

// In place (send and out one buffer), a rank's share of its buffer is read and written only by itself, and rank p's
// share only by rank p, which reads each piece before it writes it.
void ShmSingleCopy::allreduce(const Array& send, Array& out, ReduceOp op, const OpContext& ctx) {
  const std::size_t item = send.itemsize();
  const std::int64_t m = send.numel();
  const std::int64_t piece = std::max<std::int64_t>(1, static_cast<std::int64_t>(kPieceBytes / item));
  const Reducer fold_in(send.dtype(), op, std::min<std::size_t>(send.nbytes(), piece * item));
  const unsigned char* in = bytes_of(send);
  unsigned char* res = bytes_of(out);
  const bool in_place = in == res;
  const int set = steps_.next_set();
  const std::uint32_t posted = steps_.next_step();
  post_addresses(set, posted, {in, res});
  steps_.wait_all(set, posted, ctx);
  // Every rank's inputs for one piece: the others' read into the cache-sized buffer, this rank's own from its input
  // (in place, copied there too: folding writes the output before it reads this rank's part).
  pieces_.resize(static_cast<std::size_t>(n_) * piece * item);
  const std::int64_t lo = m * me_ / n_, hi = m * (me_ + 1) / n_;  // this rank's share of the elements
  for (std::int64_t off = lo; off < hi; off += piece) {
    const std::int64_t k = std::min(piece, hi - off);
    const std::size_t at = off * item, bytes = k * item;
    auto held = [&](int p) { return pieces_.data() + static_cast<std::size_t>(p) * piece * item; };
    for (int j = 1; j < n_; ++j) {  // each starts with its right neighbour: not all at rank 0 at once
      const int p = (me_ + j) % n_;
      copy_posted(held(p), set, p, 0, at, bytes, false, ctx);
    }
    if (in_place) std::memcpy(held(me_), in + at, bytes);
    fold_ranks(n_, res + at, k, item, fold_in, [&](int p) { return p == me_ && !in_place ? in + at : held(p); });
    for (int j = 1; j < n_; ++j) {  // the piece is still in cache: into every other rank's output
      const int p = (me_ + j) % n_;
      copy_posted(res + at, set, p, 1, at, bytes, true, ctx);
    }
  }
  steps_.step(set, ctx);  // every share is in every output, and nobody reads an input any more
}

// The root posts its buffer's address; the others read it from the root's memory and post; the root returns once all
// have read (its buffer is theirs until then).
void ShmSingleCopy::bcast(unsigned char* buf, std::size_t bytes, int root, const OpContext& ctx) {
  steps_.before_one_way(ctx);
  const int set = steps_.next_set();
  const std::uint32_t s = steps_.next_step();
  if (me_ == root) {
    post_addresses(set, s, {buf});
    // Not a size-checked wait_all: a reader that went on (another root's next two bcasts) may post a later step of
    // this set with another size meanwhile; each compared its size with the root's when it read.
    steps_.wait_all_posted(set, s, ctx);
    return;
  }
  steps_.wait_root(set, root, s, /*exact=*/true, ctx);
  copy_posted(buf, set, root, 0, 0, bytes, false, ctx);
  steps_.post(set, s);
  steps_.owe(set, s);
}

// Every rank posts its buffer's address and waits for all; the root writes the first 1/n of every other rank's buffer
// while each reads the rest from the root's; a second handshake ends it (the root's buffer is theirs to read, theirs
// the root's to write, until then). Each core copies (n-1)/n of the bytes, where a reader alone would copy them all.
void ShmSingleCopy::bcast_shared(unsigned char* buf, std::size_t bytes, int root, const OpContext& ctx) {
  const int set = steps_.next_set();
  const std::uint32_t s = steps_.next_step();
  post_addresses(set, s, {buf});
  // A reader first waits for the root, watching its ring as a one-way bcast's reader does: a root that sent a small
  // bcast (through its ring) instead disagrees on the size, and its set line may by then carry its next operation's
  // addresses, which are never read. Then for every other rank.
  if (me_ != root) steps_.wait_root(set, root, s, /*exact=*/false, ctx);
  steps_.wait_all(set, s, ctx);
  const std::size_t head = bytes / n_;
  if (me_ == root) {
    for (int k = 1; k < n_; ++k) copy_posted(buf, set, (root + k) % n_, 0, 0, head, true, ctx);
  } else {
    copy_posted(buf + head, set, root, 0, head, bytes - head, false, ctx);
  }
  steps_.step(set, ctx);
}

// Every rank posts its send buffer's address, reads from every other rank's, and waits until all have read before
// returning (its send buffer is theirs until then).
void ShmSingleCopy::gather(const unsigned char* send, unsigned char* recv, std::size_t bytes, std::size_t at,
                           const OpContext& ctx) {
  const int set = steps_.next_set();
  const std::uint32_t s = steps_.next_step();
  post_addresses(set, s, {send});
  steps_.wait_all(set, s, ctx);
  std::memmove(recv + me_ * bytes, send + at, bytes);  // allgather in place: the two may be one
  for (int k = 1; k < n_; ++k) {  // each rank starts with its right neighbour: not all at rank 0 at once
    const int p = (me_ + k) % n_;
    steps_.wait_for(set, p, s, ctx);
    copy_posted(recv + p * bytes, set, p, 0, at, bytes, false, ctx);
  }
  steps_.step(set, ctx);
}

void ShmSingleCopy::post_addresses(int set, std::uint32_t s, std::initializer_list<const void*> bufs) {
  ShmLine& l = seg_.line(set, me_);
  std::size_t k = 0;
  for (const void* b : bufs) {
    const auto at = reinterpret_cast<std::uintptr_t>(b);
    std::memcpy(l.data + k++ * sizeof at, &at, sizeof at);
  }
  steps_.post(set, s);
}

void ShmSingleCopy::copy_posted(unsigned char* here, int set, int p, int which, std::size_t at, std::size_t bytes,
                                bool write, const OpContext& ctx) {
  std::uintptr_t address = 0;
  std::memcpy(&address, seg_.line(set, p).data + which * sizeof address, sizeof address);
  if (bytes == 0) return;
  auto* there = reinterpret_cast<unsigned char*>(address + at);
  if (!(write ? cma_write(cma_.pids[p], there, here, bytes) : cma_read(cma_.pids[p], here, there, bytes)))
    raise_unfinished(ctx, abort_,
                     concat(write ? "process_vm_writev to rank " : "process_vm_readv from rank ", steps_.name(p),
                            " failed (", std::strerror(errno), ")"));
}

}  // namespace shardkit::detail
