#include "routing.hpp"

#include "backend.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

bool nccl_declares(const RouteRequest& r) noexcept { return nccl_supports(r.op, r.dtype, r.reduce); }

}  // namespace

bool needs_nccl(const RouteRequest& r) noexcept {
  if (r.setting == BackendKind::kMpi || r.placement != Placement::kDevice) return false;
  return nccl_declares(r);
}

BackendKind route(const RouteRequest& r) {
  if (r.setting == BackendKind::kMpi || r.placement == Placement::kNone) return BackendKind::kMpi;
  if (r.setting == BackendKind::kNccl && (r.placement == Placement::kHost || r.placement == Placement::kMixed))
    throw InvalidArgument(concat(op_name(r.op), ": SHARDKIT_BACKEND=nccl needs GPU buffers, but this rank's are ",
                                 r.placement == Placement::kHost ? "in host memory" : "partly in host memory",
                                 " (the nccl backend cannot run ", op_name(r.op), " on them)"));
  if (r.placement != Placement::kDevice || !nccl_declares(r)) return BackendKind::kMpi;
  return r.nccl_available ? BackendKind::kNccl : BackendKind::kMpi;
}

}  // namespace shardkit::detail
