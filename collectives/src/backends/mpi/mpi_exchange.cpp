#include <cstring>

#include "backends/mpi/mpi_call.hpp"
#include "backends/mpi/mpi_types.hpp"

namespace shardkit::detail {
namespace {

// Tag of the backend's own point-to-point traffic on the internal communicator.
constexpr int kExchangeTag = 7001;

}  // namespace

void exchange(const std::vector<Piece>& sends, const std::vector<Piece>& recvs, DType dtype, MPI_Comm internal,
              int rank, std::int64_t max, PendingOp& p) {
  const MPI_Datatype t = mpi_datatype(dtype);
  const auto es = static_cast<std::int64_t>(dtype_size(dtype));
  const Piece* self_send = nullptr;
  for (const Piece& r : recvs) {
    if (r.peer == rank) continue;
    for_chunks(max, r.count, [&](std::int64_t off, int n) {
      if (n > 0) post<MPI_Irecv>(p, static_cast<void*>(r.ptr + off * es), n, t, r.peer, kExchangeTag, internal);
    });
  }
  for (const Piece& s : sends) {
    if (s.peer == rank) {
      self_send = &s;
      continue;
    }
    for_chunks(max, s.count, [&](std::int64_t off, int n) {
      if (n > 0) post<MPI_Isend>(p, static_cast<const void*>(s.ptr + off * es), n, t, s.peer, kExchangeTag, internal);
    });
  }
  for (const Piece& r : recvs)
    if (r.peer == rank && self_send && r.count > 0)
      std::memmove(r.ptr, self_send->ptr, static_cast<std::size_t>(r.count * es));
}

}  // namespace shardkit::detail
