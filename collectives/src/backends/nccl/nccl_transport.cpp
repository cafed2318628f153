// The NCCL transport (nccl_transport.hpp): its descriptor, the ranks' decision on it, and its splits. In every build:
// without NCCL the decision says "not built" (nccl_stub.cpp makes no backend).

#include "backends/nccl/nccl_transport.hpp"

#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backends/mpi/mpi_request.hpp"
#include "communicator_impl.hpp"
#include "op_table.hpp"
#include "shardkit/collectives/launch_fence.hpp"
#include "shardkit/core/error.hpp"
#include "backends/nccl/nccl_backend.hpp"

namespace shardkit::detail {
namespace {

bool declares(const RouteRequest& r) noexcept { return nccl_supports(r.op, r.dtype, r.reduce); }

// GPU buffers, an operation NCCL implements, a setting that allows it.
bool wants(const RouteRequest& r) noexcept {
  return r.setting != BackendKind::kMpi && r.placement == Placement::kDevice && declares(r);
}

// Point-to-point operations only where the ranks agreed on NCCL when the communicator was made (a decision made later,
// by the first collective on GPU buffers, could not be made by a send between two ranks, and a send before it and its
// receive after it would take different transports).
bool takes(const RouteRequest& r, const TransportView& v) noexcept {
  return v.made && wants(r) && (!r.point_to_point() || v.p2p);
}

// The decision is started by a collective (never by a point-to-point operation).
bool may_take(const RouteRequest& r) noexcept { return wants(r) && !r.point_to_point(); }

// SHARDKIT_BACKEND=nccl: host buffers are an error (InvalidArgument); GPU buffers of an operation NCCL implements where
// the ranks have no NCCL (or, for point-to-point, agreed on it only after the communicator was made) a BackendError.
// Operations NCCL does not implement fall back to MPI.
void refuse(const RouteRequest& r, const TransportView& v, const std::string& refusal, const std::string& comm) {
  if (r.placement == Placement::kHost || r.placement == Placement::kMixed)
    throw InvalidArgument(concat(op_name(r.op), ": SHARDKIT_BACKEND=nccl needs GPU buffers, but this rank's are ",
                                 r.placement == Placement::kHost ? "in host memory" : "partly in host memory",
                                 " (the nccl backend cannot run ", op_name(r.op), " on them)"));
  if (r.placement != Placement::kDevice || !declares(r)) return;
  throw BackendError("NCCL", 0,
                     concat("SHARDKIT_BACKEND=nccl but ", op_name(r.op), " on communicator '", comm,
                            "' cannot use NCCL (",
                            !refusal.empty() ? refusal
                            : v.made         ? "point-to-point on a communicator that agreed on NCCL only after it "
                                               "was made"
                                             : "the ranks have not agreed on NCCL",
                            ")"));
}

// True on every rank alike when two ranks of `comm` use one GPU of one host. NCCL refuses such a communicator
// (ncclCommInitRank: "Duplicate GPU detected"), so ranks sharing a GPU agree to stay on MPI instead.
bool gpu_shared(MPI_Comm comm, int device) {
  struct Where {
    char host[64];
    int device;
  };
  Where me{};
  gethostname(me.host, sizeof me.host - 1);
  me.device = device;
  int size = 0;
  SHARDKIT_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<Where> all(static_cast<std::size_t>(size));
  SHARDKIT_MPI_CHECK(MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, comm));
  for (int i = 0; i < size; ++i)
    for (int j = 0; j < i; ++j)
      if (all[i].device >= 0 && all[i].device == all[j].device && std::strcmp(all[i].host, all[j].host) == 0)
        return true;
  return false;
}

// Agrees with the other ranks on NCCL (collective): used only when every rank has a GPU, NCCL is built and the setting
// is not MPI (else the refusal says why). The same exchange tells every rank whether some rank has a GPU.
void decide(CommunicatorImpl& c, TransportSlot& slot, const OpContext&) {
  if (slot.decided) return;
  slot.decided = true;
  // {whether this rank wants NCCL, minus whether it has a GPU}: the minimum says whether all want it and whether any
  // has a GPU.
  const bool wants = nccl_built() && c.device >= 0 && c.options.backend != BackendKind::kMpi;
  struct Exchange {
    int mine[2], least[2];
  };
  // On the heap: MPI may still write it after a timeout has left this frame.
  auto x = std::make_shared<Exchange>(Exchange{{wants ? 1 : 0, c.device >= 0 ? -1 : 0}, {0, 0}});
  MPI_Comm comm = to_mpi<MPI_Comm>(c.control());
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  SHARDKIT_MPI_CHECK(MPI_Iallreduce(x->mine, x->least, 2, MPI_INT, MPI_MIN, comm, req.data()));
  const OpContext ctx =
      OpContext::for_step(OpKind::kAllreduce, "the NCCL decision", c.options.name, c.options.timeout);
  wait_or_raise(req, x, ctx, *c.abort, "not every rank arrived");
  const int all = x->least[0];
  c.learn_gpu(x->least[1] < 0);
  // Every rank has arrived: the exchange of hosts and devices below cannot wait for a missing one.
  const bool shared = all && gpu_shared(comm, c.device);
  if (all && !shared) {
    slot.backend = make_nccl_backend(c.control(), c.device, c.abort, c.options.timeout);
    slot.view.made = slot.backend != nullptr;
  } else {
    slot.refusal = shared            ? "ranks share a GPU, which NCCL refuses"
                   : !nccl_built()   ? "not built"
                   : c.device < 0    ? "this rank has no GPU"
                                     : "another rank has no GPU";
  }
}

// With the communicator, on every rank of a build with NCCL, with or without a GPU (a rank without one says no;
// skipping the decision there would leave the others waiting for it): point-to-point operations on GPU buffers may
// use NCCL then, without bootstrapping it between two ranks only.
void make_with_communicator(CommunicatorImpl& c, TransportSlot& slot) {
  if (!nccl_built()) return;
  decide(c, slot, OpContext::for_step(OpKind::kAllreduce, "the NCCL decision", c.options.name, c.options.timeout));
  slot.view.p2p = true;
}

// The launch fence (launch_fence.hpp) puts this thread's NCCL launches, and its set-up, after the compiled programs
// dispatched before: run for every operation that may reach NCCL.
void before_routing(const RouteRequest& r) {
  if (r.placement != Placement::kHost || r.setting == BackendKind::kNccl) run_nccl_launch_fence();
}

// A part of a communicator with NCCL splits NCCL's own communicator (ncclCommSplit, collective over the parent),
// decided with the split by every rank of the parent: point-to-point operations may use it. A parent that agreed not
// to use NCCL (or has not decided yet) passes that on.
void split(const CommunicatorImpl& parent, const TransportSlot& from, int color, int key,
           std::shared_ptr<AbortState> abort, TransportSlot& to) {
  to.decided = from.decided;
  to.refusal = from.refusal;
  to.view.p2p = from.decided;  // known to every rank of the split alike
  if (!from.backend) return;
  to.backend = split_nccl_backend(*from.backend, color, key, std::move(abort), parent.options.timeout);
  to.view.made = to.backend != nullptr;
}

}  // namespace

const Transport& nccl_transport() noexcept {
  static const Transport t{.kind = BackendKind::kNccl,
                           .name = "nccl",
                           .priority = 30,
                           .stream_ordered = true,
                           .on_device = true,
                           .takes = takes,
                           .may_take = may_take,
                           .before_routing = before_routing,
                           .refuse = refuse,
                           .decide = decide,
                           .make_with_communicator = make_with_communicator,
                           .split = split};
  return t;
}

}  // namespace shardkit::detail
