// The MPI transport (mpi_transport.hpp): every operation on every dtype and defined reduction (host memory, or device
// memory staged through pinned buffers); the fallback of every other transport.

#include "backends/mpi/mpi_transport.hpp"

#include "communicator_impl.hpp"
#include "backends/mpi/mpi_backend.hpp"

namespace shardkit::detail {
namespace {

bool takes(const RouteRequest& r, const TransportView&) noexcept { return mpi_supports(r.op, r.dtype, r.reduce); }

// Over the communicator's own MPI communicator; the control communicator, for its own point-to-point traffic
// (large-count fallbacks), is made on first use (collective).
void make_with_communicator(CommunicatorImpl& c, TransportSlot& slot) {
  CommunicatorImpl* raw = &c;
  slot.backend = make_mpi_backend(c.data, [raw] { return raw->control(); }, c.abort, c.options.max_message_elements);
  slot.decided = true;
  slot.view = {true, true, 0};
}

}  // namespace

const Transport& mpi_transport() noexcept {
  static const Transport t{.kind = BackendKind::kMpi,
                           .name = "mpi",
                           .priority = 0,  // the fallback: asked last
                           .takes = takes,
                           .make_with_communicator = make_with_communicator,
                           .always = true};
  return t;
}

}  // namespace shardkit::detail
