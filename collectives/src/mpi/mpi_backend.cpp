// The MPI backend: every operation on host buffers (and on GPU buffers, staged through pinned memory unless the MPI
// library is CUDA-aware).
//
// Execution modes: with no timeout and no async request, each operation is one blocking MPI call per chunk (the
// fast path: MPI's tuned blocking collectives, no allocation). With a timeout or async, the nonblocking form is
// issued and either polled to completion against the deadline or returned as a pending token.
//
// Counts above the communicator's max_message_elements (INT_MAX by default) are handled by splitting element-wise
// operations into chunks, and by point-to-point pieces on the internal communicator for the data-movement collectives.

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>

#include "backend.hpp"
#include "mpi/mpi_call.hpp"
#include "mpi/mpi_request.hpp"
#include "mpi/mpi_types.hpp"
#include "mpi/staging.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

class MpiBackend final : public Backend {
 public:
  MpiBackend(MpiCommHandle comm, std::function<MpiCommHandle()> internal, std::shared_ptr<AbortState> abort,
             std::int64_t max_count)
      : c_(to_mpi<MPI_Comm>(comm)),
        internal_(std::move(internal)),
        abort_(std::move(abort)),
        max_count_(max_count),
        cuda_aware_(mpi_cuda_aware()) {
    SHARDKIT_CHECK(max_count >= 1 && max_count <= INT_MAX, "max_message_elements must be in [1, INT_MAX], got ",
                   max_count);
    SHARDKIT_MPI_CHECK(MPI_Comm_rank(c_, &rank_));
    SHARDKIT_MPI_CHECK(MPI_Comm_size(c_, &size_));
  }

  BackendKind kind() const noexcept override { return BackendKind::kMpi; }
  void abort() noexcept override { abort_->aborted = true; }

  Token run(const BackendCall& c, const OpContext& ctx) override {
    const OpArgs& a = *c.args;
    switch (c.op) {
      case OpKind::kAllreduce: return allreduce(c, a.reduce, ctx);
      case OpKind::kReduce: return reduce(c, a.reduce, a.root, ctx);
      case OpKind::kBcast: return bcast(c.send ? const_cast<Array&>(*c.send) : *c.recv, a.root, ctx);
      case OpKind::kAllgather: return allgather(*c.send, *c.recv, ctx);
      case OpKind::kGather: return gather(*c.send, c.recv, a.root, ctx);
      case OpKind::kScatter: return scatter(c.send, *c.recv, a.root, ctx);
      case OpKind::kReduceScatter: return reduce_scatter(*c.send, *c.recv, a.reduce, ctx);
      case OpKind::kAlltoall: return alltoall(*c.send, *c.recv, ctx);
      case OpKind::kSend: return send(*c.send, a.dest, a.send_tag, ctx);
      case OpKind::kRecv: return recv(*c.recv, a.source, a.recv_tag, a.status, ctx);
      case OpKind::kSendrecv:
        return sendrecv(*c.send, a.dest, a.send_tag, *c.recv, a.source, a.recv_tag, a.status, ctx);
      case OpKind::kBarrier: return barrier(ctx);
      case OpKind::kScan: return scan(c, a.reduce, ctx);
      case OpKind::kAllgatherv: return allgatherv(*c.send, *c.recv, a.recv_counts, c.recv_displs, ctx);
      case OpKind::kAlltoallv:
        return alltoallv(*c.send, a.send_counts, c.send_displs, *c.recv, a.recv_counts, c.recv_displs, ctx);
    }
    SHARDKIT_ASSERT(false, "unknown operation");
  }

 private:

  // ---- element-wise reductions: chunked ------------------------------------------------------------------------

  // allreduce and scan: the same shape of call (in place or not, every rank reads and writes).
  template <auto Blocking, auto Nonblocking>
  Token elementwise(const BackendCall& c, ReduceOp op, const OpContext& ctx) {
    const Array& send = *c.send;
    Array& recv = *c.recv;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(send.dtype());
    const MPI_Op o = mpi_op(op, send.dtype());
    const bool in_place = c.in_place();
    if (direct(ctx, send.numel(), send, recv)) {
      SHARDKIT_MPI_CHECK(Blocking(in_place ? MPI_IN_PLACE : send.data(), recv.data(), static_cast<int>(send.numel()),
                                  t, o, c_));
      return Token();
    }
    PendingOp p;
    Buf s = stage(send, p, nb, in_place ? Use::kInOut : Use::kIn);
    Buf r = in_place ? s : stage(recv, p, nb, Use::kOut);
    for_chunks(max_count_, send.numel(), [&](std::int64_t off, int n) {
      const void* sp = in_place ? MPI_IN_PLACE : at(s, off);
      call_mpi<Blocking, Nonblocking>(p, nb, sp, at(r, off), n, t, o, c_);
    });
    return finish(std::move(p), ctx);
  }
  Token allreduce(const BackendCall& c, ReduceOp op, const OpContext& ctx) {
    return elementwise<MPI_Allreduce, MPI_Iallreduce>(c, op, ctx);
  }
  Token scan(const BackendCall& c, ReduceOp op, const OpContext& ctx) {
    return elementwise<MPI_Scan, MPI_Iscan>(c, op, ctx);
  }

  // On the root `c.recv` is set (== c.send in place); elsewhere it is null.
  Token reduce(const BackendCall& c, ReduceOp op, int root, const OpContext& ctx) {
    PendingOp p;
    const Array& send = *c.send;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(send.dtype());
    const MPI_Op o = mpi_op(op, send.dtype());
    const bool in_place = c.in_place();
    Buf s = stage(send, p, nb, in_place ? Use::kInOut : Use::kIn);
    Buf r = !c.recv ? Buf{} : in_place ? s : stage(*c.recv, p, nb, Use::kOut);
    for_chunks(max_count_, send.numel(), [&](std::int64_t off, int n) {
      const void* sp = in_place ? MPI_IN_PLACE : at(s, off);
      void* rp = c.recv ? at(r, off) : nullptr;
      call_mpi<MPI_Reduce, MPI_Ireduce>(p, nb, sp, rp, n, t, o, root, c_);
    });
    return finish(std::move(p), ctx);
  }

  Token bcast(Array& buf, int root, const OpContext& ctx) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(buf.dtype());
    Buf b = stage(buf, p, nb, rank_ == root ? Use::kIn : Use::kOut);
    for_chunks(max_count_, buf.numel(), [&](std::int64_t off, int n) {
      call_mpi<MPI_Bcast, MPI_Ibcast>(p, nb, at(b, off), n, t, root, c_);
    });
    return finish(std::move(p), ctx);
  }

  Token reduce_scatter(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(send.dtype());
    const MPI_Op o = mpi_op(op, send.dtype());
    Buf s = stage(send, p, nb, Use::kIn);
    Buf r = stage(recv, p, nb, Use::kOut);
    const std::int64_t n = recv.numel();
    if (n <= max_count_) {
      call_mpi<MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block>(p, nb, static_cast<const void*>(s.data()),
                                                                    r.data(), static_cast<int>(n), t, o, c_);
    } else {
      // Block r of the result is a reduction rooted at rank r, chunked like any reduction.
      for (int root = 0; root < size_; ++root) {
        for_chunks(max_count_, n, [&](std::int64_t off, int c) {
          const void* sp = at(s, root * n + off);
          void* rp = rank_ == root ? at(r, off) : nullptr;
          call_mpi<MPI_Reduce, MPI_Ireduce>(p, nb, sp, rp, c, t, o, root, c_);
        });
      }
    }
    return finish(std::move(p), ctx);
  }

  // ---- data movement: native call, or point-to-point pieces when counts exceed the limit ---------------------

  // allgather, gather, scatter and alltoall: stage the buffers (`send` null off a scatter's root, `recv` off a
  // gather's), then one native call when each rank's part (`n` elements) fits an MPI count, else point-to-point pieces
  // over the internal communicator, which `pieces(s, r, sends, recvs)` lists.
  template <auto Blocking, auto Nonblocking, typename Pieces, typename... Root>
  Token movement(const Array* send, Array* recv, DType dtype, std::int64_t n, const OpContext& ctx, Pieces&& pieces,
                 Root... root) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf s = send ? stage(*send, p, nb, Use::kIn) : Buf{};
    Buf r = recv ? stage(*recv, p, nb, Use::kOut) : Buf{};
    if (n <= max_count_) {
      const MPI_Datatype t = mpi_datatype(dtype);
      const int k = static_cast<int>(n);
      call_mpi<Blocking, Nonblocking>(p, nb, static_cast<const void*>(s.data()), k, t, r.data(), k, t, root..., c_);
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs;
    pieces(s, r, sends, recvs);
    exchange(sends, recvs, dtype, to_mpi<MPI_Comm>(internal_()), rank_, max_count_, p);
    return finish(std::move(p), ctx);
  }

  Token allgather(const Array& send, Array& recv, const OpContext& ctx) {
    const std::int64_t n = send.numel();
    return movement<MPI_Allgather, MPI_Iallgather>(&send, &recv, send.dtype(), n, ctx,
                                                   [&](auto& s, auto& r, auto& to, auto& from) {
                                                     for (int peer = 0; peer < size_; ++peer) {
                                                       to.push_back({peer, at(s, 0), n});
                                                       from.push_back({peer, at(r, peer * n), n});
                                                     }
                                                   });
  }

  // `recv` is set on the root only.
  Token gather(const Array& send, Array* recv, int root, const OpContext& ctx) {
    const std::int64_t n = send.numel();
    return movement<MPI_Gather, MPI_Igather>(
        &send, recv, send.dtype(), n, ctx,
        [&](auto& s, auto& r, auto& to, auto& from) {
          to.push_back({root, at(s, 0), n});
          if (recv)
            for (int peer = 0; peer < size_; ++peer) from.push_back({peer, at(r, peer * n), n});
        },
        root);
  }

  // `send` is set on the root only.
  Token scatter(const Array* send, Array& recv, int root, const OpContext& ctx) {
    const std::int64_t n = recv.numel();
    return movement<MPI_Scatter, MPI_Iscatter>(
        send, &recv, recv.dtype(), n, ctx,
        [&](auto& s, auto& r, auto& to, auto& from) {
          from.push_back({root, at(r, 0), n});
          if (send)
            for (int peer = 0; peer < size_; ++peer) to.push_back({peer, at(s, peer * n), n});
        },
        root);
  }

  Token alltoall(const Array& send, Array& recv, const OpContext& ctx) {
    const std::int64_t n = size_ == 0 ? 0 : send.numel() / size_;
    return movement<MPI_Alltoall, MPI_Ialltoall>(&send, &recv, send.dtype(), n, ctx,
                                                 [&](auto& s, auto& r, auto& to, auto& from) {
                                                   for (int peer = 0; peer < size_; ++peer) {
                                                     to.push_back({peer, at(s, peer * n), n});
                                                     from.push_back({peer, at(r, peer * n), n});
                                                   }
                                                 });
  }

  Token allgatherv(const Array& send, Array& recv, std::span<const std::int64_t> counts,
                   std::span<const std::int64_t> displs, const OpContext& ctx) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf s = stage(send, p, nb, Use::kIn);
    Buf r = stage(recv, p, nb, Use::kOut);
    if (fits_int(counts) && fits_int(displs)) {
      const MPI_Datatype t = mpi_datatype(send.dtype());
      const auto [n, at] = mpi_ints<2>(p, {counts, displs});
      call_mpi<MPI_Allgatherv, MPI_Iallgatherv>(p, nb, static_cast<const void*>(s.data()), n[rank_], t, r.data(), n,
                                                at, t, c_);
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      sends.push_back({peer, at(s, 0), counts[rank_]});
      recvs.push_back({peer, at(r, displs[peer]), counts[peer]});
    }
    exchange(sends, recvs, send.dtype(), to_mpi<MPI_Comm>(internal_()), rank_, max_count_, p);
    return finish(std::move(p), ctx);
  }

  Token alltoallv(const Array& send, std::span<const std::int64_t> send_counts,
                  std::span<const std::int64_t> send_displs, Array& recv, std::span<const std::int64_t> recv_counts,
                  std::span<const std::int64_t> recv_displs, const OpContext& ctx) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf s = stage(send, p, nb, Use::kIn);
    Buf r = stage(recv, p, nb, Use::kOut);
    if (fits_int(send_counts) && fits_int(send_displs) && fits_int(recv_counts) && fits_int(recv_displs)) {
      const MPI_Datatype t = mpi_datatype(send.dtype());
      const auto [sn, sat, rn, rat] = mpi_ints<4>(p, {send_counts, send_displs, recv_counts, recv_displs});
      call_mpi<MPI_Alltoallv, MPI_Ialltoallv>(p, nb, static_cast<const void*>(s.data()), sn, sat, t, r.data(), rn, rat,
                                              t, c_);
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      sends.push_back({peer, at(s, send_displs[peer]), send_counts[peer]});
      recvs.push_back({peer, at(r, recv_displs[peer]), recv_counts[peer]});
    }
    exchange(sends, recvs, send.dtype(), to_mpi<MPI_Comm>(internal_()), rank_, max_count_, p);
    return finish(std::move(p), ctx);
  }

  // ---- point to point ----------------------------------------------------------------------------------------------

  Token send(const Array& buf, int dest, int tag, const OpContext& ctx) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(buf.dtype());
    Buf b = stage(buf, p, nb, Use::kIn);
    for_chunks(max_count_, buf.numel(), [&](std::int64_t off, int n) {
      call_mpi<MPI_Send, MPI_Isend>(p, nb, static_cast<const void*>(at(b, off)), n, t, dest, tag, c_);
    });
    return finish(std::move(p), ctx);
  }

  Token recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf b = stage(buf, p, nb, Use::kOut);
    return recv_into(b, buf.dtype(), buf.numel(), source, tag, status, ctx, std::move(p), nullptr);
  }

  Token sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag,
                 RecvStatus* status, const OpContext& ctx) {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype st = mpi_datatype(send.dtype());
    Buf s = stage(send, p, nb, Use::kIn);
    Buf r = stage(recv, p, nb, Use::kOut);
    const std::int64_t sn = send.numel(), rn = recv.numel();
    if (s.ptr < r.ptr + rn * r.itemsize && r.ptr < s.ptr + sn * s.itemsize) [[unlikely]] {
      // In place (the buffers overlap): MPI forbids a send buffer that the receive writes; the message goes from a copy.
      p.keep_alive.push_back(send.clone());
      s.ptr = static_cast<char*>(p.keep_alive.back().data());
    }
    if (!nb && sn <= max_count_ && rn <= max_count_) {
      MPI_Status mst;
      SHARDKIT_MPI_CHECK(MPI_Sendrecv(s.data(), static_cast<int>(sn), st, dest, send_tag, r.data(),
                                      static_cast<int>(rn), mpi_datatype(recv.dtype()), mpi_source(source),
                                      mpi_tag(recv_tag), c_, &mst));
      fill_status(status, mst, recv.dtype());
      return finish(std::move(p), ctx);
    }
    // Nonblocking or chunked: post the receive first, then the sends, then complete both together.
    return recv_into(r, recv.dtype(), rn, source, recv_tag, status, ctx, std::move(p), [&](PendingOp& op) {
      for_chunks(max_count_, sn, [&](std::int64_t off, int n) {
        post<MPI_Isend>(op, static_cast<const void*>(at(s, off)), n, st, dest, send_tag, c_);
      });
    });
  }

  Token barrier(const OpContext& ctx) {
    PendingOp p;
    call_mpi<MPI_Barrier, MPI_Ibarrier>(p, nonblocking(ctx), c_);
    return finish(std::move(p), ctx);
  }

 private:
  static bool nonblocking(const OpContext& ctx) { return ctx.async || ctx.has_deadline(); }

  // MPI's int copies of a v-collective's counts and displacements (`rows`, checked by fits_int), one after another in
  // an array the pending operation keeps (keep_alive) while MPI may read it: through a blocking call, until a
  // nonblocking one completes, and for good once abandoned. Returns where each row starts.
  template <std::size_t N>
  static std::array<const int*, N> mpi_ints(PendingOp& p, const std::array<std::span<const std::int64_t>, N>& rows) {
    std::int64_t total = 0;
    for (const auto& row : rows) total += std::ssize(row);
    Array ints = Array::empty({total}, DType::kInt32);
    int* out = static_cast<int*>(ints.data());
    std::array<const int*, N> starts{};
    for (std::size_t i = 0; i < N; ++i) {
      starts[i] = out;
      out = std::transform(rows[i].begin(), rows[i].end(), out, [](std::int64_t x) { return static_cast<int>(x); });
    }
    p.keep_alive.push_back(std::move(ints));
    return starts;
  }

  bool fits_int(std::span<const std::int64_t> v) const {
    for (std::int64_t x : v)
      if (x > max_count_) return false;
    return true;
  }

  static void chain(PendingOp& p, std::function<void(const std::vector<MPI_Status>&)> next) {
    auto prev = std::move(p.on_complete);
    p.on_complete = [prev = std::move(prev), next = std::move(next)](const std::vector<MPI_Status>& st) {
      if (prev) prev(st);
      next(st);
    };
  }

  // Takes the operation by reference (moved from only when a pending token takes it): a blocking operation, the
  // common case, builds and destroys one PendingOp.
  Token finish(PendingOp&& p, const OpContext& ctx) {
    if (p.requests.empty()) {
      if (!p.copy_back.empty() || p.on_complete) p.finish({});  // blocking: done, only staged copies may remain
      return Token();
    }
    if (ctx.async) return pending_token(std::move(p), ctx, abort_);
    complete(p, ctx, *abort_);
    return Token();
  }

  // GPU memory for a library that cannot read it: a pinned host copy (filled now for inputs).
  bool needs_staging(const Array& a) const { return a.device().kind == DeviceKind::kCUDA && !cuda_aware_; }

  // True when an operation can be one blocking MPI call on the buffers themselves: no timeout and not async, one
  // chunk, and memory MPI reads (no staging); the buffers' ready events are then waited for. The per-call hot path
  // of small reductions (psum, mpi4jax's allreduce): no pending-operation state to build.
  bool direct(const OpContext& ctx, std::int64_t count, const Array& a, const Array& b) const {
    if (nonblocking(ctx) || count > max_count_ || needs_staging(a) || needs_staging(b)) return false;
    a.wait_ready();
    b.wait_ready();
    return true;
  }

  // The memory an operation uses for `a`: its own (kept alive by the pending operation when nonblocking), or, for GPU
  // memory MPI cannot read, a pinned host copy: filled now for inputs, copied back after completion for outputs.
  // The first case, every host buffer's, stays inline: it is the per-call cost of every small operation.
  enum class Use { kIn, kOut, kInOut };
  [[gnu::always_inline]] Buf stage(const Array& a, PendingOp& p, bool nb, Use use) {
    a.wait_ready();
    if (needs_staging(a)) [[unlikely]]
      return stage_pinned(a, p, use);
    if (nb) p.keep_alive.push_back(a);
    return {static_cast<char*>(a.data()), static_cast<std::int64_t>(a.itemsize())};
  }
  [[gnu::noinline]] Buf stage_pinned(const Array& a, PendingOp& p, Use use) {
    Array host = pinned_like(a);
    if (use != Use::kOut) host.copy_from(a);
    if (use == Use::kIn)
      p.keep_alive.push_back(host);
    else
      p.copy_back.emplace_back(host, a);
    return {static_cast<char*>(host.data()), static_cast<std::int64_t>(host.itemsize())};
  }

  static int mpi_source(int s) { return s == kAnySource ? MPI_ANY_SOURCE : s; }
  static int mpi_tag(int t) { return t == kAnyTag ? MPI_ANY_TAG : t; }

  static void fill_status(RecvStatus* out, const MPI_Status& st, DType dtype) {
    if (!out) return;
    out->source = st.MPI_SOURCE;
    out->tag = st.MPI_TAG;
    int n = 0;
    MPI_Get_count(&st, mpi_datatype(dtype), &n);
    out->count = n;
  }

  // Receives `b` (chunked) from source; `also` may post more requests (the sends of a sendrecv) after the first
  // receive. With kAnySource, the first chunk fixes the source (and tag) of the following ones.
  Token recv_into(const Buf& b, DType dtype, std::int64_t total, int source, int tag, RecvStatus* status,
                  const OpContext& ctx, PendingOp p, const std::function<void(PendingOp&)>& also) {
    const MPI_Datatype t = mpi_datatype(dtype);
    const bool nb = nonblocking(ctx) || static_cast<bool>(also);
    if (!nb) {
      MPI_Status first{};
      int src = mpi_source(source), tg = mpi_tag(tag);
      bool is_first = true;
      for_chunks(max_count_, total, [&](std::int64_t off, int n) {
        MPI_Status st;
        SHARDKIT_MPI_CHECK(MPI_Recv(at(b, off), n, t, src, tg, c_, &st));
        if (is_first) {
          first = st;
          src = st.MPI_SOURCE;
          tg = st.MPI_TAG;
          is_first = false;
        }
      });
      fill_status(status, first, dtype);
      if (status && total > max_count_) status->count = total;
      return finish(std::move(p), ctx);
    }
    const bool wildcard_chunks = total > max_count_ && (source == kAnySource || tag == kAnyTag);
    if (wildcard_chunks && ctx.async)
      throw InvalidArgument("recv of more than max_message_elements elements from any source or with any tag needs "
                            "the first piece to arrive before the others are posted: name the source and tag, or "
                            "use a communicator without CommOptions::async");
    const std::size_t first_request = p.requests.size();
    int src = mpi_source(source), tg = mpi_tag(tag);
    for_chunks(max_count_, total, [&](std::int64_t off, int n) {
      post<MPI_Irecv>(p, static_cast<void*>(at(b, off)), n, t, src, tg, c_);
      if (off > 0) return;
      if (also) also(p);  // a sendrecv's sends go out before its first piece is waited for
      if (!wildcard_chunks) return;
      // The first piece fixes the source and tag of the others, as in the blocking path: wait for it (deadline kept).
      std::vector<MPI_Request> one{p.requests[first_request]};
      std::vector<MPI_Status> st(1);
      if (!wait_all(one, &st, ctx.deadline)) complete(p, ctx, *abort_);  // past the deadline or interrupted: raises
      p.requests[first_request] = MPI_REQUEST_NULL;  // completed (and freed) through `one`
      src = st[0].MPI_SOURCE;
      tg = st[0].MPI_TAG;
      if (status) fill_status(status, st[0], dtype);
    });
    if (status && wildcard_chunks) {
      status->count = total;
    } else if (status) {
      p.want_statuses = true;
      chain(p, [status, first_request, total, dtype, max = max_count_](const std::vector<MPI_Status>& st) {
        if (st.size() > first_request) fill_status(status, st[first_request], dtype);
        if (total > max) status->count = total;
      });
    }
    return finish(std::move(p), ctx);
  }

  MPI_Comm c_;
  std::function<MpiCommHandle()> internal_;
  std::shared_ptr<AbortState> abort_;
  std::int64_t max_count_;
  int rank_ = 0, size_ = 1;
  bool cuda_aware_;
};

}  // namespace

bool mpi_supports(OpKind, DType, ReduceOp) noexcept { return true; }

std::unique_ptr<Backend> make_mpi_backend(MpiCommHandle comm, std::function<MpiCommHandle()> internal,
                                          std::shared_ptr<AbortState> abort_state, std::int64_t max_count) {
  return std::make_unique<MpiBackend>(comm, std::move(internal), std::move(abort_state), max_count);
}

}  // namespace shardkit::detail
