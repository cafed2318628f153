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
//  - tags are ignored (messages between two ranks match in order) and kAnySource is an error.
// Bootstrap: rank 0's ncclUniqueId is broadcast over MPI; sub-communicators come from ncclCommSplit.

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <optional>
#include <thread>

#include "nccl_caps.hpp"
#include "nccl_state.hpp"
#include "flight_recorder.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/core/interrupt.hpp"
#include "shardkit/core/kernels.hpp"
#include "shardkit/launch/mpi.hpp"
#include "shardkit/launch/runtime.hpp"

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
      case OpKind::kSend: return this->send(send, a.dest, ctx);
      case OpKind::kRecv: return this->recv(recv, a.source, a.status, ctx);
      case OpKind::kSendrecv: return sendrecv(send, a.dest, recv, a.source, a.status, ctx);
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
  Token send(const Array& buf, int dest, const OpContext& ctx) {
    begin(ctx, {buf});
    SHARDKIT_NCCL_CHECK(ncclSend(buf.data(), buf.nbytes(), ncclInt8, dest, comm(), s()));
    return end(ctx, {buf});
  }
  Token recv(Array& buf, int source, RecvStatus* status, const OpContext& ctx) {
    check_source(source);
    begin(ctx, {buf});
    SHARDKIT_NCCL_CHECK(ncclRecv(buf.data(), buf.nbytes(), ncclInt8, source, comm(), s()));
    fill(status, source, buf.numel());
    return end(ctx, {buf});
  }
  Token sendrecv(const Array& send, int dest, Array& recv, int source, RecvStatus* status, const OpContext& ctx) {
    check_source(source);
    begin(ctx, {send, recv});
    group([&] {
      SHARDKIT_NCCL_CHECK(ncclSend(send.data(), send.nbytes(), ncclInt8, dest, comm(), s()));
      SHARDKIT_NCCL_CHECK(ncclRecv(recv.data(), recv.nbytes(), ncclInt8, source, comm(), s()));
    });
    fill(status, source, recv.numel());
    return end(ctx, {send, recv});
  }
  ncclComm_t comm() const { return state_->comm; }
  cudaStream_t s() const { return stream_.handle(); }
  static void* byte_at(const Array& a, std::size_t bytes) { return static_cast<char*>(a.data()) + bytes; }

  static void check_source(int source) {
    SHARDKIT_CHECK(source != kAnySource, "NCCL cannot receive from any source; name the source rank or use MPI");
  }
  static void fill(RecvStatus* st, int source, std::int64_t n) {
    if (!st) return;
    st->source = source;
    st->tag = 0;
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
      state.abort_once(concat(what, " was interrupted by a signal"));
      end_job_at_exit(state.abort->reason);
      throw_interrupted(what, "the NCCL communicator was aborted and the job will end at exit");
    }
    if (Clock::now() >= deadline) {
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
