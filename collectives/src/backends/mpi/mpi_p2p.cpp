#include "backends/mpi/mpi_p2p.hpp"

#include <utility>

#include "backends/mpi/mpi_types.hpp"

namespace shardkit::detail {
namespace {

// shardkit's wildcards as MPI's.
int mpi_source(int s) {
  return s == kAnySource ? MPI_ANY_SOURCE : s;
}
int mpi_tag(int t) {
  return t == kAnyTag ? MPI_ANY_TAG : t;
}

void fill_status(RecvStatus* out, const MPI_Status& st, DType dtype) {
  if (!out) return;
  out->source = st.MPI_SOURCE;
  out->tag = st.MPI_TAG;
  int n = 0;
  MPI_Get_count(&st, mpi_datatype(dtype), &n);
  out->count = n;
}

// Runs `next` after what the pending operation already runs on completion.
void chain(PendingOp& p, std::function<void(const std::vector<MPI_Status>&)> next) {
  auto prev = std::move(p.on_complete);
  p.on_complete = [prev = std::move(prev), next = std::move(next)](const std::vector<MPI_Status>& st) {
    if (prev) prev(st);
    next(st);
  };
}

}  // namespace

Token MpiPointToPoint::send(const Array& buf, int dest, int tag, const OpContext& ctx) {
  PendingOp p;
  const bool nb = nonblocking(ctx);
  const MPI_Datatype t = mpi_datatype(buf.dtype());
  Buf b = stage(buf, p, nb, Use::kIn);
  for_chunks(max_count_, buf.numel(), [&](std::int64_t off, int n) {
    call_mpi<MPI_Send, MPI_Isend>(p, nb, static_cast<const void*>(at(b, off)), n, t, dest, tag, c_);
  });
  return finish(std::move(p), ctx);
}

Token MpiPointToPoint::recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) {
  PendingOp p;
  const bool nb = nonblocking(ctx);
  Buf b = stage(buf, p, nb, Use::kOut);
  return recv_into(b, buf.dtype(), buf.numel(), source, tag, status, ctx, std::move(p), nullptr);
}

Token MpiPointToPoint::sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag,
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
    SHARDKIT_MPI_CHECK(MPI_Sendrecv(s.data(), static_cast<int>(sn), st, dest, send_tag, r.data(), static_cast<int>(rn),
                                    mpi_datatype(recv.dtype()), mpi_source(source), mpi_tag(recv_tag), c_, &mst));
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

Token MpiPointToPoint::recv_into(const Buf& b, DType dtype, std::int64_t total, int source, int tag, RecvStatus* status,
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
    throw InvalidArgument(
        "recv of more than max_message_elements elements from any source or with any tag needs "
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
    p.requests[first_request] = MPI_REQUEST_NULL;                      // completed (and freed) through `one`
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

}  // namespace shardkit::detail
