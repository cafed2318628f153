#include "routing.hpp"

#include <limits>

#include "backend.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

bool nccl_declares(const RouteRequest& r) noexcept { return nccl_supports(r.op, r.dtype, r.reduce); }

// The default route's table: per operation, the message sizes (bytes of the first array on each rank) where shm was
// measured faster than MPI, each against MPI in the same run (bench_collectives, 2 ranks; README, "Shared memory").
// Operations and sizes not listed stay on MPI: reduce was not measured; bcast below 512 B (MPI's root returns as soon
// as its message is in the receiver's fast box, shm's waits for the previous bcast's readers) and above 8 KiB, the
// larger allgathers, allreduce past 4 MiB and alltoall past 512 KiB went either way or to MPI. Sendrecv takes shm at
// every size: it was faster or even at all, and one rule for all sizes keeps the two sides of an exchange on one
// backend when their messages differ in size (each side routes by what it sends).
struct ShmWins {
  OpKind op;
  std::int64_t from, upto;  // bytes, inclusive
};
constexpr std::int64_t kAnySize = std::numeric_limits<std::int64_t>::max();
constexpr ShmWins kShmWins[] = {
    {OpKind::kAllreduce, 0, std::int64_t{4} << 20},
    {OpKind::kReduceScatter, 0, kAnySize},
    {OpKind::kBcast, 512, std::int64_t{8} << 10},
    {OpKind::kAllgather, 0, std::int64_t{4} << 10},
    {OpKind::kAlltoall, 0, std::int64_t{512} << 10},
    {OpKind::kBarrier, 0, kAnySize},
    {OpKind::kSendrecv, 0, kAnySize},
};

}  // namespace

bool shm_by_default(OpKind op, std::int64_t bytes) noexcept {
  for (const ShmWins& w : kShmWins)
    if (w.op == op) return bytes >= w.from && bytes <= w.upto;
  return false;
}

bool needs_shm(const RouteRequest& r) noexcept {
  if (r.placement != Placement::kHost && r.placement != Placement::kNone) return false;
  if (r.op == OpKind::kSendrecv && !r.named_peers) return false;
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
