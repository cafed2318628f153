// The NCCL backend: operations on GPU buffers, enqueued on the communicator's own stream. Nothing here blocks the
// host: each operation returns a token holding a CUDA event, and waiting for it polls the event and
// ncclCommGetAsyncError against the deadline, aborting the communicator (ncclCommAbort) on timeout.
//
// NCCL has no complex types, no int16, no bool, no bitwise or logical reductions, no scan and no tags, and its float
// max/min drop NaN:
//  - float32/float64 allreduce max/min is an integer max/min over order keys (core's to_order_keys), which
//    propagates NaN as the MPI backend does; other float max/min reductions are routed to MPI (nccl_caps.cpp);
//  - complex sum is a float/double sum of twice the count; other complex reductions are an error;
//  - bool logical and/or are min/max over uint8; other bool reductions, and int16/uint16 reductions, are errors;
//  - data movement (bcast, gathers, scatter, all-to-all, point-to-point) is done on bytes, so every dtype works;
//  - gather, scatter, all-to-all(v), allgatherv are grouped point-to-point calls;
//  - tags are ignored between two ranks (their messages match in order) and kAnySource is an error (but on a
//    communicator of one rank, where it can only be that rank);
//  - a rank's messages to itself never reach NCCL, which sends to self only within a group that also receives it
//    ("Trying to send to self without a matching recv", and the communicator is lost): a send to itself is a device
//    copy queued until a receive from itself takes it, matched by tag as MPI does (the status has the sender's tag).
// Bootstrap: rank 0's ncclUniqueId is broadcast over MPI; sub-communicators come from ncclCommSplit.

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <deque>
#include <optional>
#include <thread>

#include "nccl_caps.hpp"
#include "nccl_state.hpp"
#include "flight_recorder.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/core/interrupt.hpp"
#include "shardkit/core/kernels.hpp"
#include "shardkit/launch/mpi.hpp"
#include "backends/nccl/nccl_backend.hpp"

namespace shardkit::detail {
namespace {

// nccl_caps.hpp states NCCL's types and reductions without nccl.h; its values are NCCL's.
static_assert(static_cast<int>(NcclType::kInt8) == ncclInt8 && static_cast<int>(NcclType::kUint8) == ncclUint8 &&
              static_cast<int>(NcclType::kInt32) == ncclInt32 && static_cast<int>(NcclType::kUint32) == ncclUint32 &&
              static_cast<int>(NcclType::kInt64) == ncclInt64 && static_cast<int>(NcclType::kUint64) == ncclUint64 &&
              static_cast<int>(NcclType::kFloat16) == ncclFloat16 &&
              static_cast<int>(NcclType::kFloat32) == ncclFloat32 &&
              static_cast<int>(NcclType::kFloat64) == ncclFloat64 &&
              static_cast<int>(NcclType::kBfloat16) == ncclBfloat16);
static_assert(static_cast<int>(NcclOp::kSum) == ncclSum && static_cast<int>(NcclOp::kProd) == ncclProd &&
              static_cast<int>(NcclOp::kMax) == ncclMax && static_cast<int>(NcclOp::kMin) == ncclMin);

// How NCCL runs `op` over `d` in `kind`, from the table (the router sends only what nccl_supports declares).
NcclReduction nccl_form(OpKind kind, ReduceOp op, DType d) {
  const NcclReduction r = nccl_reduction(op, d);
  if (r.type == NcclType::kNone || (r.by_order_keys && kind != OpKind::kAllreduce))
    throw InvalidArgument(nccl_refusal(kind, op, d));
  return r;
}
ncclDataType_t nccl_type(const NcclReduction& r) { return static_cast<ncclDataType_t>(r.type); }
ncclRedOp_t nccl_op(const NcclReduction& r) { return static_cast<ncclRedOp_t>(r.op); }
// Element count NCCL sees for a reduction of `n` elements (complex counts twice).
std::size_t nccl_count(const NcclReduction& r, std::int64_t n) { return static_cast<std::size_t>(r.lanes * n); }

class NcclBackend final : public Backend {
 public:
  NcclBackend(std::shared_ptr<NcclState> state) : state_(std::move(state)) {
    stream_ = cuda::Stream::create(state_->device);
    SHARDKIT_NCCL_CHECK(ncclCommUserRank(state_->comm, &rank_));
    SHARDKIT_NCCL_CHECK(ncclCommCount(state_->comm, &size_));
  }

  BackendKind kind() const noexcept override { return BackendKind::kNccl; }
  void abort() noexcept override { state_->abort_once("aborted"); }
  const std::shared_ptr<NcclState>& state() const { return state_; }

  // Only the operations nccl_supports() declares reach here (the router sends the others to MPI).
  Token run(const BackendCall& c, const OpContext& ctx) override {
    // The communicator's device for the NCCL calls, events and waits of this operation; the caller's afterwards.
    cuda::DeviceGuard guard(state_->device);
    const OpArgs& a = *c.args;
    static const Array kNone;
    const Array& send = c.send ? *c.send : kNone;
    Array& recv = c.recv ? *c.recv : const_cast<Array&>(kNone);
    switch (c.op) {
      case OpKind::kAllreduce: return allreduce(send, recv, a.reduce, ctx);
      case OpKind::kReduce: return reduce(send, recv, a.reduce, a.root, ctx);
      case OpKind::kBcast: return bcast(c.send ? const_cast<Array&>(*c.send) : recv, a.root, ctx);
      case OpKind::kAllgather: return allgather(send, recv, ctx);
      case OpKind::kGather: return gather(send, recv, a.root, ctx);
      case OpKind::kScatter: return scatter(send, recv, a.root, ctx);
      case OpKind::kReduceScatter: return reduce_scatter(send, recv, a.reduce, ctx);
      case OpKind::kAlltoall: return alltoall(send, recv, ctx);
      case OpKind::kSend: return this->send(send, a.dest, a.send_tag, ctx);
      case OpKind::kRecv: return this->recv(recv, a.source, a.recv_tag, a.status, ctx);
      case OpKind::kSendrecv: return sendrecv(send, a.dest, a.send_tag, recv, a.source, a.recv_tag, a.status, ctx);
      case OpKind::kAllgatherv: return allgatherv(send, recv, a.recv_counts, c.recv_displs, ctx);
      case OpKind::kAlltoallv:
        return alltoallv(send, a.send_counts, c.send_displs, recv, a.recv_counts, c.recv_displs, ctx);
      case OpKind::kScan:
      case OpKind::kBarrier: break;
    }
    throw Error(ErrorCode::kInternal, concat(op_name(c.op), " is not an NCCL operation (nccl_supports)"));
  }

 private:

  Token allreduce(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) {
    const NcclReduction r = nccl_form(OpKind::kAllreduce, op, send.dtype());
    begin(ctx, {send, recv});
    if (r.by_order_keys) {
      // NCCL's fmaxf/fminf drop NaN: an integer max/min over order keys (in the result's memory) propagates it.
      Array keys = Array::borrow(recv.data(), recv.shape(), order_key_dtype(send.dtype()), recv.device(), nullptr);
      to_order_keys(send, keys, op == ReduceOp::kMax, s());
      SHARDKIT_NCCL_CHECK(ncclAllReduce(keys.data(), keys.data(), nccl_count(r, keys.numel()), nccl_type(r),
                                        nccl_op(r), comm(), s()));
      from_order_keys(keys, recv, s());
    } else {
      SHARDKIT_NCCL_CHECK(ncclAllReduce(send.data(), recv.data(), nccl_count(r, send.numel()), nccl_type(r),
                                        nccl_op(r), comm(), s()));
    }
    return end(ctx, {send, recv});
  }
  Token reduce(const Array& send, Array& recv, ReduceOp op, int root, const OpContext& ctx) {
    const NcclReduction r = nccl_form(OpKind::kReduce, op, send.dtype());
    begin(ctx, {send, recv});
    void* rp = rank_ == root ? recv.data() : nullptr;
    SHARDKIT_NCCL_CHECK(ncclReduce(send.data(), rp, nccl_count(r, send.numel()), nccl_type(r), nccl_op(r), root,
                                   comm(), s()));
    return end(ctx, {send, recv});
  }
  Token bcast(Array& buf, int root, const OpContext& ctx) {
    begin(ctx, {buf});
    SHARDKIT_NCCL_CHECK(ncclBroadcast(buf.data(), buf.data(), buf.nbytes(), ncclInt8, root, comm(), s()));
    return end(ctx, {buf});
  }
  Token allgather(const Array& send, Array& recv, const OpContext& ctx) {
    begin(ctx, {send, recv});
    SHARDKIT_NCCL_CHECK(ncclAllGather(send.data(), recv.data(), send.nbytes(), ncclInt8, comm(), s()));
    return end(ctx, {send, recv});
  }
  Token reduce_scatter(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) {
    const NcclReduction r = nccl_form(OpKind::kReduceScatter, op, recv.dtype());
    begin(ctx, {send, recv});
    SHARDKIT_NCCL_CHECK(ncclReduceScatter(send.data(), recv.data(), nccl_count(r, recv.numel()), nccl_type(r),
                                          nccl_op(r), comm(), s()));
    return end(ctx, {send, recv});
  }
  Token gather(const Array& send, Array& recv, int root, const OpContext& ctx) {
    return rooted(send, recv, root, /*to_root=*/true, ctx);
  }
  Token scatter(const Array& send, Array& recv, int root, const OpContext& ctx) {
    return rooted(send, recv, root, /*to_root=*/false, ctx);
  }
  // gather (to_root) and scatter: every rank exchanges its piece with the root (itself included), in one group; the
  // root's side is one piece per rank.
  Token rooted(const Array& send, Array& recv, int root, bool to_root, const OpContext& ctx) {
    begin(ctx, {send, recv});
    const std::size_t bytes = to_root ? send.nbytes() : recv.nbytes();
    const Array& many = to_root ? recv : send;
    const auto move = [&](void* buf, int peer, bool in) {
      SHARDKIT_NCCL_CHECK(in ? ncclRecv(buf, bytes, ncclInt8, peer, comm(), s())
                             : ncclSend(buf, bytes, ncclInt8, peer, comm(), s()));
    };
    group([&] {
      if (rank_ == root)
        for (int r = 0; r < size_; ++r) move(byte_at(many, r * bytes), r, to_root);
      move(to_root ? send.data() : recv.data(), root, !to_root);
    });
    return end(ctx, {send, recv});
  }
  Token alltoall(const Array& send, Array& recv, const OpContext& ctx) {
    begin(ctx, {send, recv});
    const std::size_t bytes = size_ ? send.nbytes() / static_cast<std::size_t>(size_) : 0;
    group([&] {
      for (int r = 0; r < size_; ++r) {
        SHARDKIT_NCCL_CHECK(ncclSend(byte_at(send, r * bytes), bytes, ncclInt8, r, comm(), s()));
        SHARDKIT_NCCL_CHECK(ncclRecv(byte_at(recv, r * bytes), bytes, ncclInt8, r, comm(), s()));
      }
    });
    return end(ctx, {send, recv});
  }
  Token allgatherv(const Array& send, Array& recv, std::span<const std::int64_t> counts,
                   std::span<const std::int64_t> displs, const OpContext& ctx) {
    begin(ctx, {send, recv});
    const std::size_t es = send.itemsize();
    group([&] {
      for (int r = 0; r < size_; ++r) {
        SHARDKIT_NCCL_CHECK(ncclSend(send.data(), counts[rank_] * es, ncclInt8, r, comm(), s()));
        SHARDKIT_NCCL_CHECK(ncclRecv(byte_at(recv, displs[r] * es), counts[r] * es, ncclInt8, r, comm(), s()));
      }
    });
    return end(ctx, {send, recv});
  }
  Token alltoallv(const Array& send, std::span<const std::int64_t> send_counts,
                  std::span<const std::int64_t> send_displs, Array& recv, std::span<const std::int64_t> recv_counts,
                  std::span<const std::int64_t> recv_displs, const OpContext& ctx) {
    begin(ctx, {send, recv});
    const std::size_t es = send.itemsize();
    group([&] {
      for (int r = 0; r < size_; ++r) {
        SHARDKIT_NCCL_CHECK(ncclSend(byte_at(send, send_displs[r] * es), send_counts[r] * es, ncclInt8, r, comm(), s()));
        SHARDKIT_NCCL_CHECK(ncclRecv(byte_at(recv, recv_displs[r] * es), recv_counts[r] * es, ncclInt8, r, comm(), s()));
      }
    });
    return end(ctx, {send, recv});
  }
  Token send(const Array& buf, int dest, int tag, const OpContext& ctx) {
    begin(ctx, {buf});
    if (dest == rank_) return end(ctx, {buf, send_to_self(buf, tag)});
    SHARDKIT_NCCL_CHECK(ncclSend(buf.data(), buf.nbytes(), ncclInt8, dest, comm(), s()));
    return end(ctx, {buf});
  }
  Token recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) {
    source = definite(source);
    if (source == rank_) {
      const std::size_t m = find_from_self(OpKind::kRecv, buf, tag);  // before begin(): an error enqueues nothing
      begin(ctx, {buf});
      return end(ctx, {buf, receive_from_self(m, buf, status)});
    }
    begin(ctx, {buf});
    SHARDKIT_NCCL_CHECK(ncclRecv(buf.data(), buf.nbytes(), ncclInt8, source, comm(), s()));
    fill(status, source, 0, buf.numel());
    return end(ctx, {buf});
  }
  // The halves with another rank are one NCCL group; a half with this rank is a queued copy (send_to_self), the
  // send queued first, so that the receive may take it.
  Token sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag,
                 RecvStatus* status, const OpContext& ctx) {
    source = definite(source);
    const SelfMessage own{send, send_tag};
    const std::size_t m =
        source == rank_ ? find_from_self(OpKind::kSendrecv, recv, recv_tag, dest == rank_ ? &own : nullptr) : 0;
    begin(ctx, {send, recv});
    const Array sent = dest == rank_ ? send_to_self(send, send_tag) : Array();
    const Array taken = source == rank_ ? receive_from_self(m, recv, status) : Array();
    if (source != rank_ || dest != rank_) {
      group([&] {
        if (dest != rank_) SHARDKIT_NCCL_CHECK(ncclSend(send.data(), send.nbytes(), ncclInt8, dest, comm(), s()));
        if (source != rank_) SHARDKIT_NCCL_CHECK(ncclRecv(recv.data(), recv.nbytes(), ncclInt8, source, comm(), s()));
      });
      if (source != rank_) fill(status, source, 0, recv.numel());
    }
    return end(ctx, {send, recv, sent, taken});
  }

  // A message from this rank to itself: a device copy of the bytes sent, taken by the first receive from this rank
  // whose tag matches (MPI's order: the earliest such send).
  struct SelfMessage {
    Array bytes;
    int tag = 0;
  };
  Array send_to_self(const Array& buf, int tag) {
    Array copy = Array::empty({static_cast<std::int64_t>(buf.nbytes())}, DType::kUInt8, buf.device());
    if (buf.nbytes() > 0) cuda::memcpy_async(copy.data(), buf.data(), buf.nbytes(), s());
    self_.push_back({copy, tag});
    return copy;
  }
  // The queue position of the message a receive into `buf` with `tag` takes (`next`, when given, stands for a send
  // about to be queued). Throws where MPI would hang (no such message) or report a truncation (it does not fit `buf`).
  std::size_t find_from_self(OpKind op, const Array& buf, int tag, const SelfMessage* next = nullptr) const {
    for (std::size_t i = 0; i <= self_.size(); ++i) {
      const SelfMessage* m = i < self_.size() ? &self_[i] : next;
      if (!m || (tag != kAnyTag && m->tag != tag)) continue;
      if (m->bytes.nbytes() > buf.nbytes())
        throw InvalidArgument(concat(op_name(op), ": the message rank ", rank_, " sent itself (tag ", m->tag, ", ",
                                     m->bytes.nbytes(), " bytes) does not fit the receive buffer (", buf.nbytes(),
                                     " bytes)"));
      return i;
    }
    throw InvalidArgument(concat(op_name(op), ": rank ", rank_, " receives from itself",
                                 tag == kAnyTag ? std::string() : concat(" with tag ", tag),
                                 ", but sent itself no such message before: the receive would never complete"));
  }
  // Takes the message at queue position `i` into `buf`; returns its copy (to keep until the receive completes).
  Array receive_from_self(std::size_t i, Array& buf, RecvStatus* status) {
    const SelfMessage m = self_.at(i);
    self_.erase(self_.begin() + static_cast<std::ptrdiff_t>(i));
    if (m.bytes.nbytes() > 0) cuda::memcpy_async(buf.data(), m.bytes.data(), m.bytes.nbytes(), s());
    fill(status, rank_, m.tag, buf.itemsize() ? m.bytes.nbytes() / buf.itemsize() : 0);
    return m.bytes;
  }
  ncclComm_t comm() const { return state_->comm; }
  cudaStream_t s() const { return stream_.handle(); }
  static void* byte_at(const Array& a, std::size_t bytes) { return static_cast<char*>(a.data()) + bytes; }

  // NCCL names the rank it receives from: any source is this rank on a communicator of one, else an error.
  int definite(int source) const {
    if (source == kAnySource && size_ == 1) return rank_;
    SHARDKIT_CHECK(source != kAnySource, "NCCL cannot receive from any source; name the source rank or use MPI");
    return source;
  }
  static void fill(RecvStatus* st, int source, int tag, std::int64_t n) {
    if (!st) return;
    st->source = source;
    st->tag = tag;
    st->count = n;
  }

  // Orders the operation after `after` and after pending writes to its buffers, on the device.
  void begin(const OpContext& ctx, std::initializer_list<Array> arrays) {
    if (ctx.after) ctx.after->order_stream(s());
    for (const Array& a : arrays)
      if (a.ready_event()) a.ready_event()->enqueue_wait(s());
  }

  Token end(const OpContext& ctx, std::initializer_list<Array> arrays) {
    settle(ctx);
    state_->reap();
    return Token(std::make_shared<NcclEvent>(s(), state_, ctx, arrays));
  }

  // The communicator is non-blocking (see nonblocking_config): after a call NCCL may report ncclInProgress while it
  // finishes enqueueing, and the next call must wait for that, under the operation's deadline. An error is left to
  // the token's poll to report.
  void settle(const OpContext& ctx) {
    std::optional<InterruptibleWait> waiting;
    for (long spin = 0;; ++spin) {
      ncclResult_t st = ncclInProgress;
      SHARDKIT_NCCL_CHECK(ncclCommGetAsyncError(comm(), &st));
      if (st != ncclInProgress) return;
      if (!waiting) waiting.emplace();
      if (interrupt_signal() != 0 || Clock::now() >= ctx.deadline)
        state_->fail_wait(ctx, ": NCCL was still enqueueing it (ncclInProgress)");
      if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  template <typename F>
  void group(F&& f) {
    SHARDKIT_NCCL_CHECK(ncclGroupStart());
    try {
      f();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    SHARDKIT_NCCL_CHECK(ncclGroupEnd());
  }

  std::shared_ptr<NcclState> state_;
  cuda::Stream stream_;
  int rank_ = 0, size_ = 1;
  std::deque<SelfMessage> self_;  // sent by this rank to itself, not yet received (send_to_self)
};

}  // namespace

bool nccl_built() noexcept { return true; }

namespace {

// Non-blocking creation (ncclConfig_t::blocking = 0): a blocking ncclCommInitRank/ncclCommSplit waiting on a lost
// peer can never time out. The calls return at once; the state is polled against the deadline.
ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

void await_created(NcclState& state, std::chrono::milliseconds timeout, const char* what) {
  const Clock::time_point deadline = deadline_after(timeout);
  const InterruptibleWait waiting;
  for (long spin = 0;; ++spin) {
    ncclResult_t st = ncclInProgress;
    SHARDKIT_NCCL_CHECK(ncclCommGetAsyncError(state.comm, &st));
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) {
      state.abort_once(concat(what, " failed"));
      throw BackendError("NCCL", static_cast<int>(st), concat(what, " failed: ", ncclGetErrorString(st), " (",
                                                              ncclGetLastError(nullptr), ")"));
    }
    if (interrupt_signal() != 0) {
      fail_current_operation();  // an operation this creation is part of: failed, in the dump below
      state.abort_once(concat(what, " was interrupted by a signal"));
      end_job_at_exit(state.abort->reason);
      throw_interrupted(what, "the NCCL communicator was aborted and the job will end at exit");
    }
    if (Clock::now() >= deadline) {
      fail_current_operation();
      state.abort_once(concat(what, " timed out"));
      end_job_at_exit(state.abort->reason);
      throw TimeoutError(concat(what, " did not complete within ", timeout.count() / 1000.0,
                                " s (a rank did not join, or NCCL's bootstrap is blocked); the NCCL communicator was "
                                "aborted"));
    }
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(MpiCommHandle mpi_comm, int device, std::shared_ptr<AbortState> abort,
                                           std::chrono::milliseconds timeout) {
  MPI_Comm c = to_mpi<MPI_Comm>(mpi_comm);
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size));
  ncclUniqueId id{};
  if (rank == 0) SHARDKIT_NCCL_CHECK(ncclGetUniqueId(&id));
  SHARDKIT_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, c));
  auto state = std::make_shared<NcclState>();
  state->device = device;
  state->abort = std::move(abort);
  state->timeout = timeout;
  cuda::DeviceGuard guard(device);
  ncclConfig_t config = nonblocking_config();
  SHARDKIT_NCCL_CHECK(ncclCommInitRankConfig(&state->comm, size, id, rank, &config));
  await_created(*state, timeout, "creating the NCCL communicator (ncclCommInitRankConfig)");
  return std::make_unique<NcclBackend>(std::move(state));
}

std::unique_ptr<Backend> split_nccl_backend(Backend& parent, int color, int key, std::shared_ptr<AbortState> abort,
                                            std::chrono::milliseconds timeout) {
  auto& p = dynamic_cast<NcclBackend&>(parent);
  auto state = std::make_shared<NcclState>();
  state->device = p.state()->device;
  state->abort = std::move(abort);
  state->timeout = timeout;
  cuda::DeviceGuard guard(state->device);
  ncclConfig_t config = nonblocking_config();
  SHARDKIT_NCCL_CHECK(
      ncclCommSplit(p.state()->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &state->comm, &config));
  // The parent is in progress until the split is done (it is collective over the parent).
  await_created(*p.state(), timeout, "splitting the NCCL communicator (ncclCommSplit)");
  if (color < 0 || state->comm == nullptr) return nullptr;
  await_created(*state, timeout, "splitting the NCCL communicator (ncclCommSplit)");
  return std::make_unique<NcclBackend>(std::move(state));
}

}  // namespace shardkit::detail
