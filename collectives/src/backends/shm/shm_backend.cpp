// The shm backend: allreduce, reduce, bcast, allgather, reduce_scatter, gather, scatter, alltoall and barrier, and
// send, recv and sendrecv, on host buffers among the ranks of one node, through one shared segment per communicator
// (shm_segment.hpp). Point-to-point messages have their own rings and MPI's matching (shm_p2p.hpp).
//
// Every step of every operation is the same handshake over the segment's two buffer sets (shm_steps.hpp). Messages
// larger than a slot are cut into slot-sized chunks. An allreduce (or reduce) chunk above kShmSplitBytes is reduced by
// all ranks in parallel: each folds its share of the elements into the result slot, posts a second step, and then
// every rank copies the result out. Smaller chunks are folded whole by every rank after the one step.
//
// From the sizes in shm_cma.hpp up, bcast, allgather, alltoall and (where every rank has a CPU) allreduce copy once
// instead of twice where the ranks may read each other's memory (shm_single_copy.hpp).
//
// Reductions are MPI_Reduce_local on the MPI backend's datatypes and operations (mpi_types.hpp): the same arithmetic
// as on MPI (float16/bfloat16 in float32, wrapping 8/16-bit integer sums, NaN-propagating min/max, bool logic), folded
// in rank order so that every rank gets the same bits. Parts up to kOwnFoldBytes fold through the backend's own
// loops where it has one (shm_fold.hpp: the same arithmetic, without MPI_Reduce_local's dispatch).

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "shardkit/core/error.hpp"
#include "backends/shm/shm_cma.hpp"
#include "backends/shm/shm_fold.hpp"
#include "backends/shm/shm_p2p.hpp"
#include "backends/shm/shm_segment.hpp"
#include "backends/shm/shm_single_copy.hpp"
#include "backends/shm/shm_steps.hpp"
#include "backends/shm/shm_backend.hpp"
#include "backends/shm/shm_transport.hpp"

namespace shardkit::detail {
namespace {

class ShmBackend final : public Backend {
 public:
  ShmBackend(ShmSegment seg, CmaPeers cma, WaitPolicy policy, int rank, std::vector<int> names,
             std::shared_ptr<AbortState> abort, std::size_t pending_bytes)
      : seg_(std::move(seg)),
        cma_(std::move(cma)),
        me_(rank),
        n_(seg_.ranks()),
        abort_(std::move(abort)),
        policy_(policy),
        steps_(seg_, me_, policy_, std::move(names), *abort_),
        p2p_(seg_, cma_, me_, policy_, *abort_, pending_bytes),
        single_copy_(seg_, cma_, steps_, me_, *abort_) {}

  BackendKind kind() const noexcept override { return BackendKind::kShm; }
  std::uint32_t route_traits() const noexcept override { return policy_.crowded ? kShmCrowded : 0; }
  void abort() noexcept override { abort_->aborted = true; }

  Token run(const BackendCall& c, const OpContext& ctx) override {
    const OpArgs& a = *c.args;
    for (const Array* x : {c.send, static_cast<const Array*>(c.recv)})
      if (x) x->wait_ready();
    p2p_.flush();  // point-to-point sends still pending go first where their rings have room now
    // Point-to-point: between two ranks, on rings of their own (no step of the collectives' sets).
    switch (c.op) {
      case OpKind::kSend: p2p_.send(*c.send, a.dest, a.send_tag, ctx); return Token();
      case OpKind::kRecv: p2p_.recv(*c.recv, a.source, a.recv_tag, a.status, ctx); return Token();
      case OpKind::kSendrecv:
        p2p_.sendrecv(*c.send, a.dest, a.send_tag, *c.recv, a.source, a.recv_tag, a.status, ctx);
        return Token();
      default: break;
    }
    steps_.begin(operation_size(c), one_way(c), ctx);
    switch (c.op) {
      case OpKind::kAllreduce:
        if (cma_.usable && !policy_.crowded && c.send->nbytes() >= kCmaReduceBytes)
          single_copy_.allreduce(*c.send, *c.recv, a.reduce, ctx);
        else
          reduce(*c.send, c.recv, a.reduce, ctx);
        break;
      case OpKind::kReduce:  // recv set on the root only
        if (one_way_reduce(c))
          reduce_one_way(*c.send, c.recv, a.reduce, ctx);
        else
          reduce(*c.send, c.recv, a.reduce, ctx);
        break;
      case OpKind::kBcast: {
        const Array& buf = c.send ? *c.send : *c.recv;
        if (shared_bcast(c))
          single_copy_.bcast_shared(bytes_of(buf), buf.nbytes(), a.root, ctx);
        else if (cma_.usable && buf.nbytes() >= kCmaBcastBytes)
          single_copy_.bcast(bytes_of(buf), buf.nbytes(), a.root, ctx);
        else
          bcast(buf, a.root, ctx);
        break;
      }
      case OpKind::kAllgather:
        if (cma_.usable && c.send->nbytes() >= (policy_.crowded ? kCmaCrowdedGatherBytes : kCmaGatherBytes))
          single_copy_.gather(bytes_of(*c.send), bytes_of(*c.recv), c.send->nbytes(), 0, ctx);
        else
          allgather(*c.send, *c.recv, ctx);
        break;
      case OpKind::kGather: gather(*c.send, c.recv, ctx); break;  // recv set on the root only
      case OpKind::kScatter: scatter(c.send, *c.recv, a.root, ctx); break;  // send set on the root only
      case OpKind::kReduceScatter: reduce_scatter(*c.send, *c.recv, a.reduce, ctx); break;
      case OpKind::kAlltoall: {
        // In place, a rank's own buffer is overwritten while the others may still read it: through the segment then.
        const std::size_t block = c.send->nbytes() / n_;
        if (cma_.usable && block >= kCmaAlltoallBytes && !c.in_place())
          single_copy_.gather(bytes_of(*c.send), bytes_of(*c.recv), block, me_ * block, ctx);
        else
          alltoall(*c.send, *c.recv, ctx);
        break;
      }
      case OpKind::kBarrier: steps_.step(steps_.next_set(), ctx); break;
      default: SHARDKIT_ASSERT(false, "the shm backend does not implement ", op_name(c.op));
    }
    return Token();
  }

 private:
  // `out` (null off a reduce's root) = the element-wise reduction of every rank's `send`.
  void reduce(const Array& send, Array* out, ReduceOp op, const OpContext& ctx) {
    const std::size_t item = send.itemsize();
    const Reducer fold_in(send.dtype(), op, std::min(send.nbytes(), ShmSegment::kSlotBytes));
    const unsigned char* in = bytes_of(send);
    unsigned char* res = out ? bytes_of(*out) : nullptr;
    chunks(send.numel(), ShmSegment::kSlotBytes / item, [&](std::int64_t off, std::int64_t m) {
      const std::size_t bytes = m * item, at = off * item;
      const int set = steps_.next_set();
      if (bytes <= kShmSplitBytes || n_ == 1) {
        std::memcpy(part(set, me_, bytes), in + at, bytes);
        steps_.step(set, ctx);
        if (res) fold_ranks(n_, res + at, m, item, fold_in, [&](int p) { return part(set, p, bytes); });
        return;
      }
      // This rank's share of the elements, folded into the set's result slot; then every rank copies the result. Only
      // the others' shares of this rank's input go through its slot: its own share it folds from its input (at 2 ranks
      // that halves the copying in).
      const std::int64_t lo = m * me_ / n_, hi = m * (me_ + 1) / n_;
      unsigned char* mine = seg_.slot(set, me_);
      std::memcpy(mine, in + at, lo * item);
      std::memcpy(mine + hi * item, in + at + hi * item, (m - hi) * item);
      steps_.step(set, ctx);
      unsigned char* result = seg_.slot(set, n_);
      if (hi > lo) {
        fold_ranks(n_, result + lo * item, hi - lo, item, fold_in,
                   [&](int p) { return (p == me_ ? in + at : seg_.slot(set, p)) + lo * item; });
      }
      steps_.step(set, ctx);
      if (res) std::memcpy(res + at, result, bytes);
    });
  }

  // A reduce of one unsplit chunk is one-way, as a bcast is the other way (shm_steps.hpp): every rank writes its part
  // and posts; the root waits for all, folds and posts that it has read; the others return without waiting for the
  // root, as MPI's eager sends let them, and wait only before they write that set again (owe()).
  bool one_way_reduce(const BackendCall& c) const {
    return c.op == OpKind::kReduce && n_ > 1 && c.send->nbytes() <= kShmSplitBytes;
  }
  // A large bcast where every rank has a CPU shares the copying between the root and the readers (shm_single_copy.hpp).
  // With more ranks than CPUs the root's share mostly adds to the others' wait: from 16 KiB to 256 KiB, 1.3-2.4x the
  // one-way bcast's time in five of six cases at 3-4 ranks on 2 cores (0.76x in one), against 0.58-0.93x at 2.
  bool shared_bcast(const BackendCall& c) const {
    return c.op == OpKind::kBcast && cma_.usable && !policy_.crowded && operation_size(c) >= kCmaBcastBytes;
  }
  // Operations whose steps are one-way (begin() then waits for nothing: each step waits in before_one_way()).
  bool one_way(const BackendCall& c) const {
    return (c.op == OpKind::kBcast && !shared_bcast(c)) || c.op == OpKind::kGather || c.op == OpKind::kScatter ||
           one_way_reduce(c);
  }
  void reduce_one_way(const Array& send, Array* out, ReduceOp op, const OpContext& ctx) {
    const std::size_t bytes = send.nbytes(), item = send.itemsize();
    to_root(bytes_of(send), bytes, out != nullptr, ctx, [&](int set) {
      fold_ranks(n_, bytes_of(*out), send.numel(), item, Reducer(send.dtype(), op, bytes),
                 [&](int p) { return part(set, p, bytes); });
    });
  }

  // One one-way step toward the root (a small reduce, a gather's chunk): every rank writes `bytes` from `mine` as its
  // part and posts; the root waits for every part, hands the set to take(set), and posts that it has read; every rank
  // owes the step (it waits only before writing the set again).
  template <typename Take>
  void to_root(const unsigned char* mine, std::size_t bytes, bool root, const OpContext& ctx, Take&& take) {
    steps_.before_one_way(ctx);
    const int set = steps_.next_set();
    const std::uint32_t s = steps_.next_step();
    std::memcpy(part(set, me_, bytes), mine, bytes);
    if (root) {
      steps_.wait_all(set, s, ctx);
      take(set);
    }
    steps_.post(set, s);
    steps_.owe(set, s);
  }

  void bcast(const Array& buf, int root, const OpContext& ctx) {
    const std::size_t item = buf.itemsize();
    unsigned char* p = bytes_of(buf);
    if (buf.nbytes() <= ShmSegment::kRingBcastBytes) {  // through the root's ring, a line per piece (shm_steps.hpp)
      constexpr std::size_t kMaxPieces = ShmSegment::kRingBcastBytes / ShmSegment::kInlineBytes;
      std::array<int, kMaxPieces> js{};
      std::array<std::uint64_t, kMaxPieces> uses{};
      std::size_t piece = 0;
      const int total =
          buf.nbytes() == 0
              ? 1
              : static_cast<int>((buf.nbytes() + ShmSegment::kInlineBytes - 1) / ShmSegment::kInlineBytes);
      steps_.begin_ring_bcast(root);
      for (std::size_t off = 0; off < buf.nbytes() || off == 0; off += ShmSegment::kInlineBytes, ++piece) {
        const std::size_t bytes = std::min(buf.nbytes() - off, ShmSegment::kInlineBytes);
        const int j = steps_.next_ring_line();
        const std::uint64_t use = steps_.ring_use();
        if (me_ == root) {
          steps_.before_ring_write(j, ctx);
          std::memcpy(seg_.ring_line(root, j).data, p + off, bytes);
          js[piece] = j;
          uses[piece] = use;
        } else {
          steps_.wait_ring(root, j, use, total - static_cast<int>(piece), ctx);
          std::memcpy(p + off, seg_.ring_line(root, j).data, bytes);
        }
        steps_.ring_read(j, root, off + ShmSegment::kInlineBytes >= buf.nbytes());
      }
      if (me_ == root) steps_.post_ring({js.data(), piece}, {uses.data(), piece});
      return;
    }
    chunks(buf.numel(), ShmSegment::kSlotBytes / item, [&](std::int64_t off, std::int64_t m) {
      const std::size_t bytes = m * item;
      steps_.before_one_way(ctx);
      const int set = steps_.next_set();
      const std::uint32_t s = steps_.next_step();
      if (me_ == root) {
        std::memcpy(part(set, root, bytes), p + off * item, bytes);
      } else {
        steps_.wait_root(set, root, s, /*exact=*/true, ctx);
        std::memcpy(p + off * item, part(set, root, bytes), bytes);
      }
      steps_.post(set, s);
      steps_.owe(set, s);
    });
  }

  // One-way, chunk by chunk, as a small reduce: every rank writes its part of its block and posts; the root waits for
  // all, copies every part into its place in `out` and posts that it has read; the others go on.
  void gather(const Array& send, Array* out, const OpContext& ctx) {
    const std::size_t item = send.itemsize();
    const std::int64_t n = send.numel();
    const unsigned char* s = bytes_of(send);
    unsigned char* r = out ? bytes_of(*out) : nullptr;
    chunks(n, ShmSegment::kSlotBytes / item, [&](std::int64_t off, std::int64_t m) {
      const std::size_t bytes = m * item;
      to_root(s + off * item, bytes, r != nullptr, ctx, [&](int set) {
        for (int p = 0; p < n_; ++p) std::memcpy(r + (p * n + off) * item, part(set, p, bytes), bytes);
      });
    });
  }

  // One-way, chunk by chunk, as a bcast: the root writes its piece of every rank's block in its slot and posts; each
  // rank copies its own piece (the root too, from the slot: its block of `send` may be `recv` itself) and the others
  // post that they have read.
  void scatter(const Array* send, Array& recv, int root, const OpContext& ctx) {
    const std::size_t item = recv.itemsize();
    const std::int64_t n = recv.numel();
    unsigned char* r = bytes_of(recv);
    chunks(n, ShmSegment::kSlotBytes / (item * n_), [&](std::int64_t off, std::int64_t m) {
      const std::size_t bytes = m * item, whole = bytes * n_;
      steps_.before_one_way(ctx);
      const int set = steps_.next_set();
      const std::uint32_t st = steps_.next_step();
      unsigned char* pieces = part(set, root, whole);
      if (me_ == root) {
        const unsigned char* s = bytes_of(*send);
        for (int b = 0; b < n_; ++b) std::memcpy(pieces + b * bytes, s + (b * n + off) * item, bytes);
      } else {
        steps_.wait_root(set, root, st, /*exact=*/true, ctx);
      }
      std::memcpy(r + off * item, pieces + me_ * bytes, bytes);
      steps_.post(set, st);
      steps_.owe(set, st);
    });
  }

  void allgather(const Array& send, Array& recv, const OpContext& ctx) {
    const std::size_t item = send.itemsize();
    const std::int64_t n = send.numel();
    const unsigned char* s = bytes_of(send);
    unsigned char* r = bytes_of(recv);
    chunks(n, ShmSegment::kSlotBytes / item, [&](std::int64_t off, std::int64_t m) {
      const std::size_t bytes = m * item;
      const int set = steps_.next_set();
      std::memcpy(part(set, me_, bytes), s + off * item, bytes);
      steps_.step(set, ctx);
      for (int p = 0; p < n_; ++p) std::memcpy(r + (p * n + off) * item, part(set, p, bytes), bytes);
    });
  }

  // Rank r folds everyone's block r.
  void reduce_scatter(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) {
    const std::size_t item = send.itemsize();
    const Reducer fold_in(send.dtype(), op, std::min(recv.nbytes(), ShmSegment::kSlotBytes / n_));
    unsigned char* r = bytes_of(recv);
    exchange_blocks(bytes_of(send), recv.numel(), item, ctx, [&](std::int64_t off, std::int64_t m, auto piece) {
      fold_ranks(n_, r + off * item, m, item, fold_in, piece);
    });
  }

  // Rank r's block p is rank p's block r.
  void alltoall(const Array& send, Array& recv, const OpContext& ctx) {
    const std::size_t item = send.itemsize();
    const std::int64_t n = recv.numel() / n_;
    unsigned char* r = bytes_of(recv);
    exchange_blocks(bytes_of(send), n, item, ctx, [&](std::int64_t off, std::int64_t m, auto piece) {
      for (int p = 0; p < n_; ++p) std::memcpy(r + (p * n + off) * item, piece(p), m * item);
    });
  }

  // Chunk by chunk, each rank puts its pieces of every block of `send` (n_ blocks of `n` elements) in its slot, steps,
  // and hands take(offset, count, piece) piece(p): where rank p's piece of block me_ lies. A chunk's pieces are all
  // in the slots before anyone writes its own (alltoall in place may overwrite what it sent).
  template <typename Take>
  void exchange_blocks(const unsigned char* s, std::int64_t n, std::size_t item, const OpContext& ctx, Take&& take) {
    chunks(n, ShmSegment::kSlotBytes / (item * n_), [&](std::int64_t off, std::int64_t m) {
      const std::size_t bytes = m * item, whole = bytes * n_;
      const int set = steps_.next_set();
      unsigned char* mine = part(set, me_, whole);
      for (int b = 0; b < n_; ++b) std::memcpy(mine + b * bytes, s + (b * n + off) * item, bytes);
      steps_.step(set, ctx);
      take(off, m, [&](int p) { return part(set, p, whole) + me_ * bytes; });
    });
  }

  // ---- building blocks ---------------------------------------------------------------------------------------

  template <typename F>
  static void chunks(std::int64_t total, std::int64_t per, F&& f) {
    for (std::int64_t off = 0; off < total; off += per) f(off, std::min(per, total - off));
  }

  // Where rank p's part of `bytes` lives in `set`: inline in its flag line when it fits.
  unsigned char* part(int set, int p, std::size_t bytes) const {
    return bytes <= ShmSegment::kInlineBytes ? seg_.line(set, p).data : seg_.slot(set, p);
  }

  // What every rank's operation must agree on: the bytes of its buffer (MPI reports a truncation where it sees one; a
  // reduction or a gather of mismatched sizes would read past what the smaller rank wrote, or the chunk counts differ).
  static std::uint64_t operation_size(const BackendCall& c) {
    switch (c.op) {
      case OpKind::kBcast: return (c.send ? c.send : c.recv)->nbytes();
      case OpKind::kReduceScatter:
      case OpKind::kScatter: return c.recv->nbytes();
      case OpKind::kBarrier: return 0;
      default: return c.send->nbytes();
    }
  }

  ShmSegment seg_;
  CmaPeers cma_;
  int me_, n_;
  std::shared_ptr<AbortState> abort_;
  WaitPolicy policy_;
  ShmSteps steps_;
  ShmP2p p2p_;
  ShmSingleCopy single_copy_;
};

}  // namespace

bool shm_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept {
  switch (op) {
    case OpKind::kAllreduce:
    case OpKind::kReduce:
    case OpKind::kReduceScatter: return reduce_op_supports(reduce, dtype);
    case OpKind::kBcast:
    case OpKind::kAllgather:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAlltoall:
    case OpKind::kBarrier:
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kSendrecv: return true;
    default: return false;
  }
}

std::unique_ptr<Backend> make_shm_backend(MpiCommHandle comm, std::shared_ptr<AbortState> abort_state,
                                          std::string* why, std::vector<int> rank_names, const WaitPolicy* policy,
                                          const CommOptions& options) {
  MPI_Comm c = to_mpi<MPI_Comm>(comm);
  int rank = 0, size = 1, node_size = 0;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size));
  MPI_Comm node = MPI_COMM_NULL;
  SHARDKIT_MPI_CHECK(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(node, &node_size));
  MPI_Comm_free(&node);
  int one_node = node_size == size ? 1 : 0, all = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&one_node, &all, 1, MPI_INT, MPI_MIN, c));
  if (!all) {
    if (why) *why = "its ranks are on more than one node";
    return nullptr;
  }
  ShmSegment seg = ShmSegment::create(comm, why);
  if (!seg.valid()) return nullptr;
  CmaPeers cma = probe_cma(comm, options.shm_single_copy);
  SHARDKIT_ASSERT(rank_names.empty() || static_cast<int>(rank_names.size()) == size, "rank names for ", size,
                  " ranks, got ", rank_names.size());
  const WaitPolicy waits = policy ? *policy : WaitPolicy::for_comm(comm);
  return std::make_unique<ShmBackend>(std::move(seg), std::move(cma), waits, rank, std::move(rank_names),
                                      std::move(abort_state), options.shm_pending_bytes);
}

}  // namespace shardkit::detail
