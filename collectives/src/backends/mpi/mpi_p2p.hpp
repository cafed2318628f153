#pragma once

// The MPI backend's point-to-point operations: send, recv (any source and tag too) and sendrecv, chunked above the
// per-call count limit; with any source or tag, the first piece fixes the source and tag of the others.

#include "backends/mpi/mpi_staged.hpp"

namespace shardkit::detail {

class MpiPointToPoint : protected MpiStaged {
 public:
  using MpiStaged::MpiStaged;

  Token send(const Array& buf, int dest, int tag, const OpContext& ctx);
  Token recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx);
  Token sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag, RecvStatus* status,
                 const OpContext& ctx);

 private:
  // Receives `b` (chunked) from source; `also` may post more requests (the sends of a sendrecv) after the first
  // receive. With kAnySource, the first chunk fixes the source (and tag) of the following ones.
  Token recv_into(const Buf& b, DType dtype, std::int64_t total, int source, int tag, RecvStatus* status,
                  const OpContext& ctx, PendingOp p, const std::function<void(PendingOp&)>& also);
};

}  // namespace shardkit::detail
