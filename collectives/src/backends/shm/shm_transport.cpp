// The shm transport (shm_transport.hpp): its descriptor, the default route's tables, and how a communicator makes it.

#include "backends/shm/shm_transport.hpp"

#include <cstdio>
#include <limits>
#include <span>

#include "backends/shm/hierarchy.hpp"
#include "communicator_impl.hpp"
#include "creation.hpp"
#include "shardkit/core/error.hpp"
#include "backends/shm/shm_backend.hpp"

namespace shardkit::detail {
namespace {

// The default route's table: per operation, the message sizes (bytes of the first array on each rank; a scatter's
// receive buffer) where shm was measured faster than MPI, each against MPI in the same run (bench_collectives, 2 ranks
// on an idle machine, 3 and 4 on 2 cores for the crowded case; docs/shm.md). Operations and sizes not
// listed stay on MPI: bcast above 256 KiB, allgathers past 256 KiB a rank, alltoall past 512 KiB, reduce above 16 KiB
// and gather and scatter above 4 KiB a rank went either way or to MPI.
// Reduce (to rank 0, float32 sum, 2 ranks; 3 and 4 crowded): with a CPU each, 0.13-0.74x MPI from 512 B to 16 KiB and
// 0.76-1.26 at 8-128 B (five runs each), where the MPI route took 1.25-1.9x (the pipeline's own cost beside MPI's
// 0.2 us); crowded 0.34-1.37 from 512 B to 32 KiB, and 4-17x at 128 B (MPI's non-roots return once their message is
// sent). Since a reduce up to 16 KiB is one-way (its non-roots no longer wait for the root; 2026-11-29, twelve runs
// alternating with the binary before, the median of the runs' ratios): 0.84 at 8 B (before 1.01), 0.94 at 32 B
// (1.14), 0.88 at 128 B (0.97); single runs ranged 0.77-1.51 (0.76-1.49 before). From 512 B 0.21-0.56 (three runs).
// Crowded, shm forced, still 4-10x at 8-128 B (one run each at 3 and 4 ranks).
// Above 16 KiB, where each rank folds its share of a chunk, it measured 0.58-0.95 in some runs and 2.8-5.4x in others
// (about half of the runs at 2 ranks: the non-root's copying and folding ran ~5x slower, on the CPU all the time; not
// explained yet), so larger reduces stay on MPI.
// Gather and scatter (root 0, float32, the bytes of the block each rank sends or receives; 2026-11-29, two runs at 2
// ranks, one each at 3 and 4): with a CPU each, shm forced 0.92-1.22x raw MPI at 4-64 B (gather) and 1.01-1.73
// (scatter) where the MPI route took 1.38-1.80, 0.25-0.87 from 256 B to 4 KiB (the MPI route 1.04-1.38), 1.5-7.5 from
// 16 KiB (MPI copies once); crowded 3-44x below 2 KiB, so only with a CPU each, up to 4 KiB.
// A bcast below 512 B takes shm only where the ranks have a CPU each: crowded, MPI's root returns as soon as its
// message is in the receiver's fast box while shm's waits for the previous bcast's readers (16-18x MPI at 3-4 ranks
// on 2 cores), but with a CPU each shm took 0.10 us where the MPI route took 0.16 (raw MPI 0.09).
// Point-to-point operations take shm at every size where the communicator decided so when it was made
// (TransportView::p2p; sends, receives and sendrecvs alike, matched as MPI matches them). Elsewhere (a communicator
// wrapping the caller's, or made before shm could be) the sendrecv row serves only sendrecvs whose peers are known to
// run one too (Peers::kAllSendrecv, a ppermute of every axis index, as a collective); a program's own sendrecv takes
// shm there only where SHARDKIT_BACKEND=shm forces it, and a ppermute whose members send or receive alone never.
struct ShmWins {
  OpKind op;
  std::int64_t from, upto;  // bytes, inclusive
  bool roomy_only = false;  // only where the ranks do not outnumber their CPUs (kShmCrowded)
};
constexpr std::int64_t kAnySize = std::numeric_limits<std::int64_t>::max();
constexpr ShmWins kShmWins[] = {
    {OpKind::kAllreduce, 0, kAnySize},
    {OpKind::kReduceScatter, 0, kAnySize},
    {OpKind::kBcast, 0, 511, true},
    {OpKind::kBcast, 512, std::int64_t{256} << 10},
    {OpKind::kReduce, 0, std::int64_t{16} << 10, true},
    {OpKind::kGather, 0, std::int64_t{4} << 10, true},
    {OpKind::kScatter, 0, std::int64_t{4} << 10, true},
    {OpKind::kAllgather, 0, std::int64_t{256} << 10},
    {OpKind::kAlltoall, 0, std::int64_t{512} << 10},
    {OpKind::kBarrier, 0, kAnySize},
    {OpKind::kSendrecv, 0, kAnySize},
};

// The same for the hierarchical backend (communicators spanning nodes), measured against flat MPI in the same run
// (bench_collectives, 4 ranks on two simulated hosts of scripts/multihost.sh, idle; docs/shm.md):
// allreduce, allgather and reduce_scatter at every size (0.04-0.23x flat MPI from 8 B to 8 KiB, 0.09-0.46x from 8 KiB
// to 8 MiB, two runs each; bytes of this rank's input: the whole input, a block, the whole input), bcast from 512 B
// (1.2-124x below it: MPI's root returns once its small message is sent; 0.11-0.15x from 512 B to 512 KiB), medians.
// Reduce (to rank 0; 2026-11-29, its node part one-way): from 128 B, 0.60-0.67x at 128 B and 0.06-0.45 from 512 B to
// 8 MiB on two hosts of two slots (three runs), 0.97-1.04 from 8 B to 2 KiB and 0.62-0.78 from 8 KiB on three hosts
// of 1, 2 and 1 slots (two runs); 0.5-2.0 at 8-32 B on two hosts. Barrier: 0.11 on two hosts (two runs), 0.42-0.48
// on three (two runs).
constexpr ShmWins kHierWins[] = {
    {OpKind::kAllreduce, 0, kAnySize},
    {OpKind::kBcast, 512, kAnySize},
    {OpKind::kAllgather, 0, kAnySize},
    {OpKind::kReduceScatter, 0, kAnySize},
    {OpKind::kReduce, 128, kAnySize},
    {OpKind::kBarrier, 0, kAnySize},
};

bool wins(std::span<const ShmWins> table, OpKind op, std::int64_t bytes, bool crowded) noexcept {
  for (const ShmWins& w : table)
    if (w.op == op && bytes >= w.from && bytes <= w.upto && !(w.roomy_only && crowded)) return true;
  return false;
}

// Whether a backend of this shape would take `r`: host buffers (or none), an operation it implements, and either the
// shm setting or its default table on auto. Point-to-point operations take it at every size
// where the communicator made it with itself (`p2p`, with MPI's matching: shm_p2p.hpp); elsewhere a sendrecv takes it
// only between named peers, by the table where every rank runs one (Peers::kAllSendrecv, a collective then), where
// forced for a program's own, and never where some peers send or receive alone (on MPI).
bool would_take(const RouteRequest& r, bool hierarchical, bool crowded, bool p2p) noexcept {
  if (r.async) return false;  // its operations complete before returning; an asynchronous communicator asks for overlap
  if (r.placement != Placement::kHost && r.placement != Placement::kNone) return false;
  if (r.point_to_point() && p2p) return r.setting == BackendKind::kAuto || r.setting == BackendKind::kShm;
  if (r.op == OpKind::kSend || r.op == OpKind::kRecv) return false;
  if (r.op == OpKind::kSendrecv && (!r.named_peers || r.peers == Peers::kMixed)) return false;
  const bool by_default = (r.op != OpKind::kSendrecv || r.peers == Peers::kAllSendrecv) &&
                          (hierarchical ? hier_by_default(r.op, r.bytes) : shm_by_default(r.op, r.bytes, crowded));
  if (r.setting != BackendKind::kShm && (r.setting != BackendKind::kAuto || !by_default)) return false;
  return hierarchical ? hier_supports(r.op, r.dtype, r.reduce) : shm_supports(r.op, r.dtype, r.reduce);
}

bool takes(const RouteRequest& r, const TransportView& v) noexcept {
  return v.made && would_take(r, (v.traits & kShmHierarchical) != 0, (v.traits & kShmCrowded) != 0, v.p2p);
}

// Before the backend is made (flat or hierarchical is not known yet): whether either would take `r`.
bool may_take(const RouteRequest& r) noexcept {
  return would_take(r, false, false, false) || would_take(r, true, false, false);
}

// Makes the backend: flat when every rank is on one node, hierarchical when they span nodes (collective, a step of
// the operation `op` that asked for it, under its deadline; where none can be made, the slot's refusal says why).
void decide(CommunicatorImpl& c, TransportSlot& slot, const OpContext& op) {
  if (slot.decided) return;
  slot.decided = true;
  // The set-up makes blocking MPI calls: agree first, under the operation's deadline, that every rank has come. It is
  // part of the operation that asked for it (a timeout names that operation) and takes no sequence number of its own.
  agree_within_operation(c.control(), op, "the shared-memory set-up", c.options.check, *c.abort);
  if (c.options.backend == BackendKind::kAuto && c.some_rank_has_gpu()) {
    // The default route keeps jobs with GPUs on MPI and NCCL. Where only some ranks have one, their staged device
    // buffers and the others' host buffers would take different transports in one operation.
    slot.refusal =
        "a rank has a GPU (the default route keeps such jobs on MPI and NCCL; SHARDKIT_BACKEND=shm forces it)";
    return;
  }
  bool hierarchical = false;
  slot.backend = make_hier_backend(c.control(), c.abort, c.options, &hierarchical, &slot.refusal);
  if (!hierarchical) slot.backend = make_shm_backend(c.control(), c.abort, &slot.refusal, {}, nullptr, c.options);
  if (slot.backend) slot.view = {true, false, slot.backend->route_traits()};
  if (c.options.verbose && c.rank == 0)
    std::fprintf(stderr, "shardkit: communicator '%s': shm %s%s\n", c.options.name.c_str(),
                 !slot.backend ? "refused: " : hierarchical ? "in use, hierarchical (its ranks span nodes)" : "in use",
                 slot.backend ? "" : slot.refusal.c_str());
}

// With the communicator (every rank is here), where the setting may use it: then point-to-point operations take it too
// where it is flat and no rank has a GPU (whose buffers take MPI or NCCL: a send from one and its receive into host
// memory would take different transports).
void make_with_communicator(CommunicatorImpl& c, TransportSlot& slot) {
  if (c.options.async || (c.options.backend != BackendKind::kAuto && c.options.backend != BackendKind::kShm)) return;
  decide(c, slot, OpContext::for_step(OpKind::kBarrier, "the shared-memory set-up", c.options.name, c.options.timeout));
  slot.view.p2p = slot.view.made && !(slot.view.traits & kShmHierarchical) && !c.some_rank_has_gpu();
}

}  // namespace

const Transport& shm_transport() noexcept {
  static const Transport t{.kind = BackendKind::kShm,
                           .name = "shm",
                           .priority = 20,
                           .takes = takes,
                           .may_take = may_take,
                           .assumed_before_decision = true,  // made wherever its segments can be (one node, or each)
                           .decide = decide,
                           .make_with_communicator = make_with_communicator};
  return t;
}

bool shm_by_default(OpKind op, std::int64_t bytes, bool crowded) noexcept {
  return wins(kShmWins, op, bytes, crowded);
}

bool hier_by_default(OpKind op, std::int64_t bytes) noexcept { return wins(kHierWins, op, bytes, false); }

}  // namespace shardkit::detail
