// The MPI backend: every operation on host buffers (and on GPU buffers, staged through pinned memory unless the MPI
// library is CUDA-aware).
//
// Execution modes: with no timeout and no async request, each operation is one blocking MPI call per chunk (the
// fast path: MPI's tuned blocking collectives, no allocation). With a timeout or async, the nonblocking form is
// issued and either polled to completion against the deadline or returned as a pending token.
//
// Counts above the communicator's max_message_elements (INT_MAX by default) are handled by splitting element-wise
// operations into chunks, and by point-to-point pieces on the internal communicator for the data-movement collectives.
// This file holds the collectives; staging and finishing a call are mpi_staged.hpp's, send/recv/sendrecv mpi_p2p's.

#include <mpi.h>

#include <algorithm>
#include <array>
#include <span>

#include "backend.hpp"
#include "backends/mpi/mpi_p2p.hpp"
#include "backends/mpi/mpi_types.hpp"
#include "backends/mpi/mpi_backend.hpp"

namespace shardkit::detail {
namespace {

class MpiBackend final : public Backend, private MpiPointToPoint {
 public:
  using MpiPointToPoint::MpiPointToPoint;

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

  // Whether every count fits one MPI call (the communicator's max_message_elements).
  bool fits_int(std::span<const std::int64_t> v) const {
    for (std::int64_t x : v)
      if (x > max_count_) return false;
    return true;
  }

  Token barrier(const OpContext& ctx) {
    PendingOp p;
    call_mpi<MPI_Barrier, MPI_Ibarrier>(p, nonblocking(ctx), c_);
    return finish(std::move(p), ctx);
  }
};

}  // namespace

bool mpi_supports(OpKind, DType, ReduceOp) noexcept { return true; }

std::unique_ptr<Backend> make_mpi_backend(MpiCommHandle comm, std::function<MpiCommHandle()> internal,
                                          std::shared_ptr<AbortState> abort_state, std::int64_t max_count) {
  return std::make_unique<MpiBackend>(comm, std::move(internal), std::move(abort_state), max_count);
}

}  // namespace shardkit::detail
