#include "routing.hpp"

#include "backend.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

bool nccl_declares(const RouteRequest& r) noexcept { return nccl_supports(r.op, r.dtype, r.reduce); }

}  // namespace

bool shm_by_default(OpKind, std::int64_t) noexcept { return false; }

bool needs_shm(const RouteRequest& r) noexcept {
  if (r.placement != Placement::kHost && r.placement != Placement::kNone) return false;
  if (r.setting != BackendKind::kShm && (r.setting != BackendKind::kAuto || !shm_by_default(r.op, r.bytes)))
    return false;
  return shm_supports(r.op, r.dtype, r.reduce);
}

bool needs_nccl(const RouteRequest& r) noexcept {
  if (r.setting == BackendKind::kMpi || r.placement != Placement::kDevice) return false;
  return nccl_declares(r);
}

BackendKind route(const RouteRequest& r) {
  if (needs_shm(r) && r.shm_available) return BackendKind::kShm;
  if (r.setting == BackendKind::kMpi || r.placement == Placement::kNone) return BackendKind::kMpi;
  if (r.setting == BackendKind::kNccl && (r.placement == Placement::kHost || r.placement == Placement::kMixed))
    throw InvalidArgument(concat(op_name(r.op), ": SHARDKIT_BACKEND=nccl needs GPU buffers, but this rank's are ",
                                 r.placement == Placement::kHost ? "in host memory" : "partly in host memory",
                                 " (the nccl backend cannot run ", op_name(r.op), " on them)"));
  if (r.placement != Placement::kDevice || !nccl_declares(r)) return BackendKind::kMpi;
  return r.nccl_available ? BackendKind::kNccl : BackendKind::kMpi;
}

}  // namespace shardkit::detail
