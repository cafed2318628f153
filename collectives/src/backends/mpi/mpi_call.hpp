#pragma once

// The MPI backend's building blocks: one call in its blocking or nonblocking form, element-count chunks, the buffers
// a call uses, and the point-to-point fallback for data movement above the per-call count limit.

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

/// Posts a nonblocking MPI call; its request joins the pending operation.
template <auto Nonblocking, typename... A>
void post(PendingOp& p, A... args) {
  MPI_Request q = MPI_REQUEST_NULL;
  SHARDKIT_MPI_CHECK(Nonblocking(args..., &q));
  p.requests.push_back(q);
}

/// One MPI call in its blocking or nonblocking form (the same arguments, plus a request for the latter): `nb` picks.
template <auto Blocking, auto Nonblocking, typename... A>
void call_mpi(PendingOp& p, bool nb, A... args) {
  if (nb)
    post<Nonblocking>(p, args...);
  else
    SHARDKIT_MPI_CHECK(Blocking(args...));
}

/// Calls f(offset, count) over [0, total) in pieces of at most `max` elements (once for total == 0, so that empty
/// operations still take part in the collective).
template <typename F>
void for_chunks(std::int64_t max, std::int64_t total, F&& f) {
  std::int64_t off = 0;
  do {
    const std::int64_t n = std::min(max, total - off);
    f(off, static_cast<int>(n));
    off += n;
  } while (off < total);
}

/// The memory an MPI call uses for one array: the array's own, or a pinned copy (staging). A plain pointer, so that
/// the blocking fast path copies no Array (each copy would allocate its shape and strides).
struct Buf {
  char* ptr = nullptr;
  std::int64_t itemsize = 0;
  void* data() const { return ptr; }
};

/// The address of element `elem_offset` of `b`.
inline char* at(const Buf& b, std::int64_t elem_offset) { return b.ptr + elem_offset * b.itemsize; }

/// A run of elements to or from one peer.
struct Piece {
  int peer;
  char* ptr;
  std::int64_t count;  ///< elements
};

/// Moves `sends` and `recvs` as nonblocking point-to-point pieces of at most `max` elements on `internal` (the
/// large-count fallback of the data-movement collectives); pieces from this rank to itself are copied directly.
void exchange(const std::vector<Piece>& sends, const std::vector<Piece>& recvs, DType dtype, MPI_Comm internal,
              int rank, std::int64_t max, PendingOp& p);

}  // namespace shardkit::detail
