#include "shardkit/sharding/reshard.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "box.hpp"
#include "layout.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/sharding/sharded_array.hpp"

namespace shardkit {
namespace {

using detail::numel_of;
using detail::shape_of;
using detail::view_of;

Box empty_box(std::size_t nd) {
  return Box(nd, IndexRange{0, 0});
}

// An empty box lies inside anything (its ranges may sit anywhere).
bool contains(const Box& outer, const Box& inner) {
  if (numel_of(inner) == 0) return true;
  for (std::size_t d = 0; d < outer.size(); ++d)
    if (inner[d].start < outer[d].start || inner[d].stop > outer[d].stop) return false;
  return true;
}

Box intersect(const Box& a, const Box& b) {
  Box out(a.size());
  for (std::size_t d = 0; d < a.size(); ++d) {
    const std::int64_t lo = std::max(a[d].start, b[d].start), hi = std::min(a[d].stop, b[d].stop);
    if (hi <= lo) return empty_box(a.size());
    out[d] = {lo, hi};
  }
  return out;
}

// The elements [begin, end) that a non-empty `inner` covers in the row-major layout of `outer` (which contains it),
// when they are consecutive there: dimensions before some k of extent 1, dimension k partial, the rest full.
std::optional<IndexRange> flat_range(const Box& inner, const Box& outer) {
  std::int64_t begin = 0;
  for (std::size_t d = 0; d < outer.size(); ++d) begin = begin * outer[d].size() + (inner[d].start - outer[d].start);
  std::size_t k = 0;  // the first dimension where inner has extent above 1
  while (k < inner.size() && inner[k].size() == 1) ++k;
  for (std::size_t d = k + 1; d < inner.size(); ++d)
    if (inner[d] != outer[d]) return std::nullopt;
  return IndexRange{begin, begin + numel_of(inner)};
}

// When the non-empty pieces, in order, lie back to back in the row-major layout of `outer`: the range they fill.
// (An all-empty list gives an empty range.)
std::optional<IndexRange> consecutive_run(const std::vector<Box>& pieces, const Box& outer) {
  std::optional<IndexRange> run;
  for (const Box& p : pieces) {
    if (numel_of(p) == 0) continue;
    const auto r = flat_range(p, outer);
    if (!r || (run && r->start != run->stop)) return std::nullopt;
    run = run ? IndexRange{run->start, r->stop} : *r;
  }
  return run ? run : IndexRange{0, 0};
}

bool is_used(const PartitionSpec& spec, const std::string& axis) {
  const auto used = spec.used_axes();
  return std::find(used.begin(), used.end(), axis) != used.end();
}

}  // namespace

std::string to_string(ReshardKind kind) {
  switch (kind) {
    case ReshardKind::kKeep:
      return "keep";
    case ReshardKind::kLocal:
      return "local";
    case ReshardKind::kAllGather:
      return "all_gather";
    case ReshardKind::kAllToAll:
      break;
  }
  return "all_to_all";
}

std::int64_t ReshardPlan::elements_sent() const noexcept {
  std::int64_t n = 0;
  for (const Box& b : send) n += numel_of(b);
  return n;
}

std::int64_t ReshardPlan::elements_received() const noexcept {
  std::int64_t n = 0;
  for (const Box& b : recv) n += numel_of(b);
  return n;
}

ReshardPlan plan_reshard(const Shape& global, const NamedSharding& from, const NamedSharding& to, int rank) {
  const Mesh& mesh = from.mesh();
  SHARDKIT_CHECK(to.mesh() == mesh, "reshard: the target sharding is on another mesh (", to.mesh().to_string(), " vs ",
                 mesh.to_string(), ")");
  from.validate(global);
  to.validate(global);
  const int p = static_cast<int>(mesh.size());
  const std::size_t nd = global.size();
  // Every rank's blocks: the kind must come out the same on every rank, so it looks at all of them.
  ReshardPlan plan;
  plan.source = from.index(global, rank);  // also rejects a rank outside the mesh
  plan.target = to.index(global, rank);
  std::vector<Box> src(p), dst(p);
  for (int r = 0; r < p; ++r) {
    src[r] = from.index(global, r);
    dst[r] = to.index(global, r);
  }
  plan.self = empty_box(nd);

  bool same = true, inside = true;
  for (int r = 0; r < p; ++r) {
    same = same && src[r] == dst[r];
    inside = inside && contains(src[r], dst[r]);
  }
  if (same || inside) {
    plan.kind = same ? ReshardKind::kKeep : ReshardKind::kLocal;
    plan.self = plan.target;
    return plan;
  }

  // Mesh axes the source cuts along and the target does not: data must spread along them.
  std::vector<std::string> spread;
  for (const std::string& a : mesh.axis_names())
    if (is_used(from.spec(), a) && !is_used(to.spec(), a)) spread.push_back(a);

  // One all_gather over `spread` when the source blocks of each group along it tile the group's target block (the
  // target does not cut along `spread`, so the group shares one target block): every rank's source block lies in
  // its target block and, the group's blocks being disjoint, the totals match.
  if (!spread.empty()) {
    const std::int64_t k = mesh.axis_size(Axes(spread));
    bool tiles = true;
    std::int64_t held = 0, needed = 0;
    for (int r = 0; r < p; ++r) {
      tiles = tiles && contains(dst[r], src[r]);
      held += numel_of(src[r]);
      needed += numel_of(dst[r]);
    }
    if (tiles && held * k == needed) {
      plan.kind = ReshardKind::kAllGather;
      plan.gather_axes = spread;
      if (spread.size() == mesh.axis_names().size()) {
        // Over every axis: the mesh communicator itself, in its rank order.
        for (int r = 0; r < p; ++r) plan.members.push_back(r);
      } else {
        const Axes axes(spread);
        const std::vector<std::int64_t> mine = mesh.coords(rank);
        plan.members.assign(static_cast<std::size_t>(k), -1);
        for (int r = 0; r < p; ++r) {
          const std::vector<std::int64_t> c = mesh.coords(r);
          bool same_group = true;
          for (std::size_t i = 0; i < c.size(); ++i)
            same_group = same_group && (axes.contains(mesh.axis_names()[i]) || c[i] == mine[i]);
          if (same_group) plan.members[static_cast<std::size_t>(mesh.axis_index(axes, r))] = r;
        }
      }
      const std::size_t m = plan.members.size();
      plan.send.assign(m, empty_box(nd));
      plan.recv.assign(m, empty_box(nd));
      plan.send_counts.assign(m, 0);
      plan.recv_counts.assign(m, 0);
      std::vector<Box> blocks(m);
      for (std::size_t j = 0; j < m; ++j) {
        const int r = plan.members[j];
        blocks[j] = src[r];
        plan.recv_counts[j] = numel_of(src[r]);
        if (r == rank) continue;
        plan.send[j] = plan.source;
        plan.send_counts[j] = numel_of(plan.source);
        plan.recv[j] = src[r];
      }
      plan.self = plan.source;
      // The received blocks land straight in the result when they follow each other in it, in member order.
      const auto run = consecutive_run(blocks, plan.target);
      if (!run || run->size() != numel_of(plan.target)) plan.recv_staging = numel_of(plan.target);
      return plan;
    }
  }

  // One all_to_all-v over the mesh. Each distinct non-empty source block is held by its replicas; the other ranks
  // whose target block overlaps it are dealt out over the replicas in turn (both in rank order), so replicas share
  // the sending and each missing element comes from exactly one rank, never this one.
  plan.kind = ReshardKind::kAllToAll;
  std::map<std::vector<std::int64_t>, std::vector<int>> holders;  // source block -> its replicas
  for (int r = 0; r < p; ++r) {
    if (numel_of(src[r]) == 0) continue;
    std::vector<std::int64_t> key;
    for (const IndexRange& range : src[r]) key.insert(key.end(), {range.start, range.stop});
    holders[key].push_back(r);
  }
  plan.send.assign(p, empty_box(nd));
  plan.recv.assign(p, empty_box(nd));
  plan.send_counts.assign(p, 0);
  plan.recv_counts.assign(p, 0);
  for (int q = 0; q < p; ++q) plan.members.push_back(q);
  for (const auto& [key, replicas] : holders) {
    const Box& block = src[replicas.front()];
    std::size_t turn = 0;
    for (int q = 0; q < p; ++q) {
      if (src[q] == block) continue;
      Box piece = intersect(block, dst[q]);
      if (numel_of(piece) == 0) continue;
      const int sender = replicas[turn++ % replicas.size()];
      if (sender == rank) plan.send[q] = piece;
      if (q == rank) plan.recv[sender] = std::move(piece);
    }
  }
  for (int q = 0; q < p; ++q) {
    plan.send_counts[q] = numel_of(plan.send[q]);
    plan.recv_counts[q] = numel_of(plan.recv[q]);
  }
  plan.self = intersect(plan.source, plan.target);
  // Pieces that follow each other in rank order in the source (target) block go (arrive) without staging. Otherwise
  // each distinct piece is packed once: members that get the same piece (a block the target replicates) read the
  // same copy, so the staging holds disjoint parts of the source block, at most one block.
  plan.send_displs.assign(p, 0);
  std::int64_t off = 0;
  const bool send_run = consecutive_run(plan.send, plan.source).has_value();
  for (int q = 0; q < p; ++q) {
    if (plan.send_counts[q] == 0) continue;
    int first = -1;
    for (int j = 0; j < q && first < 0 && !send_run; ++j)
      if (plan.send_counts[j] > 0 && plan.send[j] == plan.send[q]) first = j;
    if (first >= 0) {
      plan.send_displs[q] = plan.send_displs[first];
    } else {
      plan.send_displs[q] = off;
      off += plan.send_counts[q];
    }
  }
  if (!send_run) plan.send_staging = off;
  if (!consecutive_run(plan.recv, plan.target)) plan.recv_staging = plan.elements_received();
  return plan;
}

// ---- the executor --------------------------------------------------------------------------------------------------

ShardedArray reshard(const ShardedArray& x, const NamedSharding& target) {
  const Mesh& mesh = x.mesh();
  const ReshardPlan plan = plan_reshard(x.shape(), x.sharding(), target, mesh.rank());
  const Array& in = x.local();
  if (plan.kind == ReshardKind::kKeep) return ShardedArray(x.shape(), target, in);
  if (plan.kind == ReshardKind::kLocal) {
    // An empty target block may lie outside the source block (its ranges are only clamped to the array).
    Array block = numel_of(plan.target) == 0 ? Array::empty(shape_of(plan.target), x.dtype(), x.device())
                                             : view_of(in, plan.source, plan.target).contiguous();
    return ShardedArray(x.shape(), target, block);
  }

  Array out = Array::empty(shape_of(plan.target), x.dtype(), x.device());
  Array flat_out = out.reshape({out.numel()});
  const Array flat_in = detail::packed(in).reshape({in.numel()});
  // Copies packed pieces laid end to end in `buf` into their places in the result.
  auto unpack = [&](const Array& buf, const std::vector<Box>& pieces) {
    std::int64_t off = 0;
    for (const Box& b : pieces) {
      const std::int64_t n = numel_of(b);
      if (n == 0) continue;
      Array dst = view_of(out, plan.target, b);
      dst.copy_from(buf.slice(0, off, off + n).reshape(shape_of(b)));
      off += n;
    }
  };

  if (plan.kind == ReshardKind::kAllGather) {
    Communicator& comm =
        plan.gather_axes.size() == mesh.axis_names().size() ? *mesh.comm() : *mesh.axis_comm(Axes(plan.gather_axes));
    SHARDKIT_ASSERT(comm.size() == static_cast<int>(plan.members.size()), "one member per rank of the group");
    if (plan.recv_staging == 0) {
      comm.allgatherv(flat_in, flat_out, plan.recv_counts).wait();
    } else {
      Array buf = Array::empty({plan.recv_staging}, x.dtype(), x.device());
      comm.allgatherv(flat_in, buf, plan.recv_counts).wait();
      std::vector<Box> blocks = plan.recv;
      for (std::size_t j = 0; j < blocks.size(); ++j)
        if (plan.members[j] == mesh.rank()) blocks[j] = plan.self;
      unpack(buf, blocks);
    }
    return ShardedArray(x.shape(), target, out);
  }

  // kAllToAll: this rank's own part is a local copy; the rest is one alltoallv.
  Communicator& comm = *mesh.comm();
  if (numel_of(plan.self) > 0) {
    Array dst = view_of(out, plan.target, plan.self);
    dst.copy_from(view_of(in, plan.source, plan.self));
  }
  Array send;
  if (plan.send_staging == 0) {
    const IndexRange run = *consecutive_run(plan.send, plan.source);
    send = flat_in.slice(0, run.start, run.stop);
  } else {
    send = Array::empty({plan.send_staging}, x.dtype(), x.device());
    std::int64_t packed_to = 0;  // pieces are placed in order; a shared piece's later members point back
    for (std::size_t q = 0; q < plan.send.size(); ++q) {
      const std::int64_t n = plan.send_counts[q], at = plan.send_displs[q];
      if (n == 0 || at < packed_to) continue;
      Array dst = send.slice(0, at, at + n).reshape(shape_of(plan.send[q]));
      dst.copy_from(view_of(in, plan.source, plan.send[q]));
      packed_to = at + n;
    }
  }
  auto exchange = [&](Array& recv) {
    OpArgs args{.send = &send, .recv = &recv, .send_counts = plan.send_counts, .recv_counts = plan.recv_counts,
                .send_displs = plan.send_displs};
    comm.run(OpKind::kAlltoallv, args).wait();
  };
  if (plan.recv_staging == 0) {
    const IndexRange run = *consecutive_run(plan.recv, plan.target);
    Array recv = flat_out.slice(0, run.start, run.stop);
    exchange(recv);
  } else {
    Array recv = Array::empty({plan.recv_staging}, x.dtype(), x.device());
    exchange(recv);
    unpack(recv, plan.recv);
  }
  return ShardedArray(x.shape(), target, out);
}

}  // namespace shardkit
