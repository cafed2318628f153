// The MPI backend: every operation on host buffers (and on GPU buffers, staged through pinned memory unless the MPI
// library is CUDA-aware).
//
// Execution modes: with no timeout and no async request, each operation is one blocking MPI call per chunk (the
// fast path: MPI's tuned blocking collectives, no allocation). With a timeout or async, the nonblocking form is
// issued and either polled to completion against the deadline or returned as a pending token.
//
// Counts above mpi_max_count() (INT_MAX) are handled by splitting element-wise operations into chunks, and by
// point-to-point pieces on the internal communicator for the data-movement collectives.

#include "mpi/mpi_backend.hpp"

#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstring>

#include "backend.hpp"
#include "mpi/mpi_request.hpp"
#include "mpi/mpi_types.hpp"
#include "mpi/staging.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

std::atomic<std::int64_t> g_max_count{INT_MAX};

// Tag of the backend's own point-to-point traffic on the internal communicator.
constexpr int kExchangeTag = 7001;

struct Piece {
  int peer;
  char* ptr;
  std::int64_t count;  // elements
};

// The memory an MPI call uses for one array: the array's own, or a pinned copy (staging). A plain pointer, so that
// the blocking fast path copies no Array (each copy would allocate its shape and strides).
struct Buf {
  char* ptr = nullptr;
  std::int64_t itemsize = 0;
  void* data() const { return ptr; }
};

class MpiBackend final : public Backend {
 public:
  MpiBackend(MpiCommHandle comm, std::function<MpiCommHandle()> internal, std::shared_ptr<AbortState> abort)
      : c_(to_mpi<MPI_Comm>(comm)), internal_(std::move(internal)), abort_(std::move(abort)), cuda_aware_(mpi_cuda_aware()) {
    SHARDKIT_MPI_CHECK(MPI_Comm_rank(c_, &rank_));
    SHARDKIT_MPI_CHECK(MPI_Comm_size(c_, &size_));
  }

  BackendKind kind() const noexcept override { return BackendKind::kMpi; }
  void abort() noexcept override { abort_->aborted = true; }

  // ---- element-wise reductions: chunked ------------------------------------------------------------------------

  Token allreduce(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) override {
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(send.dtype());
    const MPI_Op o = mpi_op(op, send.dtype());
    const bool in_place = send.data() == recv.data();
    if (direct(ctx, send.numel(), send, recv)) {
      SHARDKIT_MPI_CHECK(MPI_Allreduce(in_place ? MPI_IN_PLACE : send.data(), recv.data(),
                                       static_cast<int>(send.numel()), t, o, c_));
      return Token();
    }
    PendingOp p;
    Buf s = in_place ? stage_inout(send, p, nb) : stage_in(send, p, nb);
    Buf r = in_place ? s : stage_out(recv, p, nb);
    for_chunks(send.numel(), [&](std::int64_t off, int n) {
      const void* sp = in_place ? MPI_IN_PLACE : at(s, off);
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Iallreduce(sp, at(r, off), n, t, o, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Allreduce(sp, at(r, off), n, t, o, c_));
    });
    return finish(std::move(p), ctx);
  }

  Token reduce(const Array& send, Array& recv, ReduceOp op, int root, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(send.dtype());
    const MPI_Op o = mpi_op(op, send.dtype());
    const bool is_root = rank_ == root;
    const bool in_place = is_root && send.data() == recv.data();
    Buf s = in_place ? stage_inout(send, p, nb) : stage_in(send, p, nb);
    Buf r = !is_root ? Buf{} : in_place ? s : stage_out(recv, p, nb);
    for_chunks(send.numel(), [&](std::int64_t off, int n) {
      const void* sp = in_place ? MPI_IN_PLACE : at(s, off);
      void* rp = is_root ? at(r, off) : nullptr;
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Ireduce(sp, rp, n, t, o, root, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Reduce(sp, rp, n, t, o, root, c_));
    });
    return finish(std::move(p), ctx);
  }

  Token scan(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) override {
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(send.dtype());
    const MPI_Op o = mpi_op(op, send.dtype());
    const bool in_place = send.data() == recv.data();
    if (direct(ctx, send.numel(), send, recv)) {
      SHARDKIT_MPI_CHECK(MPI_Scan(in_place ? MPI_IN_PLACE : send.data(), recv.data(), static_cast<int>(send.numel()),
                                  t, o, c_));
      return Token();
    }
    PendingOp p;
    Buf s = in_place ? stage_inout(send, p, nb) : stage_in(send, p, nb);
    Buf r = in_place ? s : stage_out(recv, p, nb);
    for_chunks(send.numel(), [&](std::int64_t off, int n) {
      const void* sp = in_place ? MPI_IN_PLACE : at(s, off);
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Iscan(sp, at(r, off), n, t, o, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Scan(sp, at(r, off), n, t, o, c_));
    });
    return finish(std::move(p), ctx);
  }

  Token bcast(Array& buf, int root, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(buf.dtype());
    Buf b = rank_ == root ? stage_in(buf, p, nb) : stage_out(buf, p, nb);
    for_chunks(buf.numel(), [&](std::int64_t off, int n) {
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Ibcast(at(b, off), n, t, root, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Bcast(at(b, off), n, t, root, c_));
    });
    return finish(std::move(p), ctx);
  }

  Token reduce_scatter(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(send.dtype());
    const MPI_Op o = mpi_op(op, send.dtype());
    Buf s = stage_in(send, p, nb);
    Buf r = stage_out(recv, p, nb);
    const std::int64_t n = recv.numel();
    if (n <= mpi_max_count()) {
      if (nb)
        issue(p, [&](MPI_Request* q) {
          return MPI_Ireduce_scatter_block(s.data(), r.data(), static_cast<int>(n), t, o, c_, q);
        });
      else
        SHARDKIT_MPI_CHECK(MPI_Reduce_scatter_block(s.data(), r.data(), static_cast<int>(n), t, o, c_));
    } else {
      // Block r of the result is a reduction rooted at rank r, chunked like any reduction.
      for (int root = 0; root < size_; ++root) {
        for_chunks(n, [&](std::int64_t off, int c) {
          const void* sp = at(s, root * n + off);
          void* rp = rank_ == root ? at(r, off) : nullptr;
          if (nb)
            issue(p, [&](MPI_Request* q) { return MPI_Ireduce(sp, rp, c, t, o, root, c_, q); });
          else
            SHARDKIT_MPI_CHECK(MPI_Reduce(sp, rp, c, t, o, root, c_));
        });
      }
    }
    return finish(std::move(p), ctx);
  }

  // ---- data movement: native call, or point-to-point pieces when counts exceed the limit ---------------------

  Token allgather(const Array& send, Array& recv, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf s = stage_in(send, p, nb);
    Buf r = stage_out(recv, p, nb);
    const std::int64_t n = send.numel();
    if (n <= mpi_max_count()) {
      const MPI_Datatype t = mpi_datatype(send.dtype());
      const int c = static_cast<int>(n);
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Iallgather(s.data(), c, t, r.data(), c, t, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Allgather(s.data(), c, t, r.data(), c, t, c_));
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      sends.push_back({peer, at(s, 0), n});
      recvs.push_back({peer, at(r, peer * n), n});
    }
    exchange(sends, recvs, send.dtype(), p);
    return finish(std::move(p), ctx);
  }

  Token gather(const Array& send, Array& recv, int root, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const bool is_root = rank_ == root;
    Buf s = stage_in(send, p, nb);
    Buf r = is_root ? stage_out(recv, p, nb) : Buf{};
    const std::int64_t n = send.numel();
    if (n <= mpi_max_count()) {
      const MPI_Datatype t = mpi_datatype(send.dtype());
      const int c = static_cast<int>(n);
      void* rp = is_root ? r.data() : nullptr;
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Igather(s.data(), c, t, rp, c, t, root, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Gather(s.data(), c, t, rp, c, t, root, c_));
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends{{root, at(s, 0), n}}, recvs;
    if (is_root)
      for (int peer = 0; peer < size_; ++peer) recvs.push_back({peer, at(r, peer * n), n});
    exchange(sends, recvs, send.dtype(), p);
    return finish(std::move(p), ctx);
  }

  Token scatter(const Array& send, Array& recv, int root, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const bool is_root = rank_ == root;
    Buf s = is_root ? stage_in(send, p, nb) : Buf{};
    Buf r = stage_out(recv, p, nb);
    const std::int64_t n = recv.numel();
    if (n <= mpi_max_count()) {
      const MPI_Datatype t = mpi_datatype(recv.dtype());
      const int c = static_cast<int>(n);
      const void* sp = is_root ? s.data() : nullptr;
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Iscatter(sp, c, t, r.data(), c, t, root, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Scatter(sp, c, t, r.data(), c, t, root, c_));
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs{{root, at(r, 0), n}};
    if (is_root)
      for (int peer = 0; peer < size_; ++peer) sends.push_back({peer, at(s, peer * n), n});
    exchange(sends, recvs, recv.dtype(), p);
    return finish(std::move(p), ctx);
  }

  Token alltoall(const Array& send, Array& recv, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf s = stage_in(send, p, nb);
    Buf r = stage_out(recv, p, nb);
    const std::int64_t n = size_ == 0 ? 0 : send.numel() / size_;
    if (n <= mpi_max_count()) {
      const MPI_Datatype t = mpi_datatype(send.dtype());
      const int c = static_cast<int>(n);
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Ialltoall(s.data(), c, t, r.data(), c, t, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Alltoall(s.data(), c, t, r.data(), c, t, c_));
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      sends.push_back({peer, at(s, peer * n), n});
      recvs.push_back({peer, at(r, peer * n), n});
    }
    exchange(sends, recvs, send.dtype(), p);
    return finish(std::move(p), ctx);
  }

  Token allgatherv(const Array& send, Array& recv, std::span<const std::int64_t> counts,
                   std::span<const std::int64_t> displs, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf s = stage_in(send, p, nb);
    Buf r = stage_out(recv, p, nb);
    if (fits_int(counts) && fits_int(displs)) {
      const MPI_Datatype t = mpi_datatype(send.dtype());
      std::vector<int> ic(counts.begin(), counts.end()), id(displs.begin(), displs.end());
      const int c = ic[rank_];
      if (nb) {
        issue(p, [&](MPI_Request* q) {
          return MPI_Iallgatherv(s.data(), c, t, r.data(), ic.data(), id.data(), t, c_, q);
        });
        // The count arrays must outlive the nonblocking call.
        auto keep = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(std::move(ic), std::move(id));
        chain(p, [keep](const std::vector<MPI_Status>&) {});
      } else {
        SHARDKIT_MPI_CHECK(MPI_Allgatherv(s.data(), c, t, r.data(), ic.data(), id.data(), t, c_));
      }
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      sends.push_back({peer, at(s, 0), counts[rank_]});
      recvs.push_back({peer, at(r, displs[peer]), counts[peer]});
    }
    exchange(sends, recvs, send.dtype(), p);
    return finish(std::move(p), ctx);
  }

  Token alltoallv(const Array& send, std::span<const std::int64_t> send_counts,
                  std::span<const std::int64_t> send_displs, Array& recv, std::span<const std::int64_t> recv_counts,
                  std::span<const std::int64_t> recv_displs, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf s = stage_in(send, p, nb);
    Buf r = stage_out(recv, p, nb);
    if (fits_int(send_counts) && fits_int(send_displs) && fits_int(recv_counts) && fits_int(recv_displs)) {
      const MPI_Datatype t = mpi_datatype(send.dtype());
      auto v = std::make_shared<std::array<std::vector<int>, 4>>();
      (*v)[0].assign(send_counts.begin(), send_counts.end());
      (*v)[1].assign(send_displs.begin(), send_displs.end());
      (*v)[2].assign(recv_counts.begin(), recv_counts.end());
      (*v)[3].assign(recv_displs.begin(), recv_displs.end());
      auto& a = *v;
      if (nb) {
        issue(p, [&](MPI_Request* q) {
          return MPI_Ialltoallv(s.data(), a[0].data(), a[1].data(), t, r.data(), a[2].data(), a[3].data(), t, c_, q);
        });
        chain(p, [v](const std::vector<MPI_Status>&) {});
      } else {
        SHARDKIT_MPI_CHECK(
            MPI_Alltoallv(s.data(), a[0].data(), a[1].data(), t, r.data(), a[2].data(), a[3].data(), t, c_));
      }
      return finish(std::move(p), ctx);
    }
    std::vector<Piece> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      sends.push_back({peer, at(s, send_displs[peer]), send_counts[peer]});
      recvs.push_back({peer, at(r, recv_displs[peer]), recv_counts[peer]});
    }
    exchange(sends, recvs, send.dtype(), p);
    return finish(std::move(p), ctx);
  }

  // ---- point to point ----------------------------------------------------------------------------------------------

  Token send(const Array& buf, int dest, int tag, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype t = mpi_datatype(buf.dtype());
    Buf b = stage_in(buf, p, nb);
    for_chunks(buf.numel(), [&](std::int64_t off, int n) {
      if (nb)
        issue(p, [&](MPI_Request* q) { return MPI_Isend(at(b, off), n, t, dest, tag, c_, q); });
      else
        SHARDKIT_MPI_CHECK(MPI_Send(at(b, off), n, t, dest, tag, c_));
    });
    return finish(std::move(p), ctx);
  }

  Token recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    Buf b = stage_out(buf, p, nb);
    return recv_into(b, buf.dtype(), buf.numel(), source, tag, status, ctx, std::move(p), nullptr);
  }

  Token sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag,
                 RecvStatus* status, const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    const MPI_Datatype st = mpi_datatype(send.dtype());
    Buf s = stage_in(send, p, nb);
    Buf r = stage_out(recv, p, nb);
    const std::int64_t sn = send.numel(), rn = recv.numel();
    if (!nb && sn <= mpi_max_count() && rn <= mpi_max_count()) {
      MPI_Status mst;
      SHARDKIT_MPI_CHECK(MPI_Sendrecv(s.data(), static_cast<int>(sn), st, dest, send_tag, r.data(),
                                      static_cast<int>(rn), mpi_datatype(recv.dtype()), mpi_source(source),
                                      mpi_tag(recv_tag), c_, &mst));
      fill_status(status, mst, recv.dtype());
      return finish(std::move(p), ctx);
    }
    // Nonblocking or chunked: post the receive first, then the sends, then complete both together.
    return recv_into(r, recv.dtype(), rn, source, recv_tag, status, ctx, std::move(p), [&](PendingOp& op) {
      for_chunks(sn, [&](std::int64_t off, int n) {
        issue(op, [&](MPI_Request* q) { return MPI_Isend(at(s, off), n, st, dest, send_tag, c_, q); });
      });
    });
  }

  Token barrier(const OpContext& ctx) override {
    PendingOp p;
    const bool nb = nonblocking(ctx);
    if (nb)
      issue(p, [&](MPI_Request* q) { return MPI_Ibarrier(c_, q); });
    else
      SHARDKIT_MPI_CHECK(MPI_Barrier(c_));
    return finish(std::move(p), ctx);
  }

 private:
  static bool nonblocking(const OpContext& ctx) { return ctx.async || ctx.has_deadline(); }

  static char* at(const Buf& b, std::int64_t elem_offset) { return b.ptr + elem_offset * b.itemsize; }

  static bool fits_int(std::span<const std::int64_t> v) {
    for (std::int64_t x : v)
      if (x > mpi_max_count()) return false;
    return true;
  }

  // Calls f(offset, count) over [0, total) in pieces of at most mpi_max_count() elements (once for total == 0,
  // so that empty operations still take part in the collective).
  template <typename F>
  static void for_chunks(std::int64_t total, F&& f) {
    const std::int64_t max = mpi_max_count();
    std::int64_t off = 0;
    do {
      const std::int64_t n = std::min(max, total - off);
      f(off, static_cast<int>(n));
      off += n;
    } while (off < total);
  }

  template <typename F>
  static void issue(PendingOp& p, F&& f) {
    MPI_Request q = MPI_REQUEST_NULL;
    SHARDKIT_MPI_CHECK(f(&q));
    p.requests.push_back(q);
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
    if (nonblocking(ctx) || count > mpi_max_count() || needs_staging(a) || needs_staging(b)) return false;
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
  Buf stage_in(const Array& a, PendingOp& p, bool nb) { return stage(a, p, nb, Use::kIn); }
  Buf stage_out(const Array& a, PendingOp& p, bool nb) { return stage(a, p, nb, Use::kOut); }
  Buf stage_inout(const Array& a, PendingOp& p, bool nb) { return stage(a, p, nb, Use::kInOut); }

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
      for_chunks(total, [&](std::int64_t off, int n) {
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
      if (status && total > mpi_max_count()) status->count = total;
      return finish(std::move(p), ctx);
    }
    if (total > mpi_max_count() && (source == kAnySource || tag == kAnyTag))
      throw InvalidArgument("recv of more than mpi_max_count() elements with a wildcard source or tag is only "
                            "supported in blocking mode");
    const std::size_t first_request = p.requests.size();
    for_chunks(total, [&](std::int64_t off, int n) {
      issue(p, [&](MPI_Request* q) { return MPI_Irecv(at(b, off), n, t, mpi_source(source), mpi_tag(tag), c_, q); });
    });
    if (also) also(p);
    if (status) {
      p.want_statuses = true;
      chain(p, [status, first_request, total, dtype](const std::vector<MPI_Status>& st) {
        if (st.size() > first_request) fill_status(status, st[first_request], dtype);
        if (total > mpi_max_count()) status->count = total;
      });
    }
    return finish(std::move(p), ctx);
  }

  // Point-to-point pieces on the internal communicator (large-count fallback). Pieces to or from this rank are
  // copied directly.
  void exchange(const std::vector<Piece>& sends, const std::vector<Piece>& recvs, DType dtype, PendingOp& p) {
    const MPI_Datatype t = mpi_datatype(dtype);
    const MPI_Comm internal = to_mpi<MPI_Comm>(internal_());
    const std::size_t es = dtype_size(dtype);
    const Piece* self_send = nullptr;
    for (const Piece& r : recvs) {
      if (r.peer == rank_) continue;
      for_chunks(r.count, [&](std::int64_t off, int n) {
        if (n > 0)
          issue(p, [&](MPI_Request* q) {
            return MPI_Irecv(r.ptr + off * static_cast<std::int64_t>(es), n, t, r.peer, kExchangeTag, internal, q);
          });
      });
    }
    for (const Piece& s : sends) {
      if (s.peer == rank_) {
        self_send = &s;
        continue;
      }
      for_chunks(s.count, [&](std::int64_t off, int n) {
        if (n > 0)
          issue(p, [&](MPI_Request* q) {
            return MPI_Isend(s.ptr + off * static_cast<std::int64_t>(es), n, t, s.peer, kExchangeTag, internal, q);
          });
      });
    }
    for (const Piece& r : recvs)
      if (r.peer == rank_ && self_send && r.count > 0)
        std::memmove(r.ptr, self_send->ptr, static_cast<std::size_t>(r.count) * es);
  }

  MPI_Comm c_;
  std::function<MpiCommHandle()> internal_;
  std::shared_ptr<AbortState> abort_;
  int rank_ = 0, size_ = 1;
  bool cuda_aware_;
};

}  // namespace

std::int64_t mpi_max_count() noexcept { return g_max_count.load(std::memory_order_relaxed); }
void set_mpi_max_count(std::int64_t count) {
  SHARDKIT_CHECK(count >= 1 && count <= INT_MAX, "mpi max count must be in [1, INT_MAX], got ", count);
  g_max_count.store(count);
}

std::unique_ptr<Backend> make_mpi_backend(MpiCommHandle comm, std::function<MpiCommHandle()> internal,
                                          std::shared_ptr<AbortState> abort_state) {
  return std::make_unique<MpiBackend>(comm, internal, std::move(abort_state));
}

}  // namespace shardkit::detail
