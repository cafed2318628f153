// reshard: the plan (a pure function, checked on abstract meshes against hand-worked cases and against a count done
// element by element) and the executor at 1-4 ranks over every pair of specs, on even, uneven and size-zero arrays:
// values, collectives issued, elements moved per rank and staging memory.

#include <numeric>
#include <set>

#include "sharding_test_util.hpp"

namespace shardkit::testing {
namespace {

std::int64_t numel_of(const Box& b) {
  std::int64_t n = 1;
  for (const auto& r : b) n *= r.size();
  return n;
}

bool holds(const Box& b, const std::vector<std::int64_t>& e) {
  for (std::size_t d = 0; d < b.size(); ++d)
    if (e[d] < b[d].start || e[d] >= b[d].stop) return false;
  return true;
}

// The fewest elements a reshard can move, counted element by element: rank q must receive each element of its
// target block that its source block lacks (whoever sends it), and `needed` says whether any rank lacks anything
// (then exactly one collective is needed, none otherwise).
struct Traffic {
  std::vector<std::int64_t> received;
  std::int64_t total = 0;
  bool needed = false;
};

Traffic count_traffic(const Shape& global, const NamedSharding& from, const NamedSharding& to) {
  const int p = static_cast<int>(from.mesh().size());
  std::vector<Box> src(p), dst(p);
  for (int r = 0; r < p; ++r) {
    src[r] = from.index(global, r);
    dst[r] = to.index(global, r);
  }
  Traffic t{std::vector<std::int64_t>(p, 0), 0, false};
  std::int64_t total = 1;
  for (auto s : global) total *= s;
  std::vector<std::int64_t> e(global.size(), 0);
  for (std::int64_t flat = 0; flat < total; ++flat) {
    std::int64_t rest = flat;
    for (std::size_t d = global.size(); d-- > 0;) {
      e[d] = rest % global[d];
      rest /= global[d];
    }
    for (int q = 0; q < p; ++q) {
      if (!holds(dst[q], e) || holds(src[q], e)) continue;
      t.needed = true;
      ++t.received[q];
      ++t.total;
    }
  }
  return t;
}

// Elements sent by every rank, from every rank's plan.
std::vector<std::int64_t> sent_by_rank(const Shape& global, const NamedSharding& from, const NamedSharding& to) {
  std::vector<std::int64_t> out;
  for (int r = 0; r < from.mesh().size(); ++r) out.push_back(plan_reshard(global, from, to, r).elements_sent());
  return out;
}

std::int64_t overlap(const Box& a, const Box& b) {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < a.size(); ++d)
    n *= std::max<std::int64_t>(0, std::min(a[d].stop, b[d].stop) - std::max(a[d].start, b[d].start));
  return n;
}

// Elements each rank sends under the rule plan_reshard documents, worked out from the blocks alone: in an all_gather,
// a rank sends its block to every other member of its group; in an all_to_all-v, the replicas of a source block take
// turns, in rank order, over the other ranks that need part of it (in rank order), so replicas share the sending.
std::vector<std::int64_t> expected_sent(const Shape& global, const NamedSharding& from, const NamedSharding& to) {
  const int p = static_cast<int>(from.mesh().size());
  std::vector<std::int64_t> sent(p, 0);
  std::vector<Box> src(p), dst(p);
  for (int r = 0; r < p; ++r) {
    src[r] = from.index(global, r);
    dst[r] = to.index(global, r);
  }
  const ReshardKind kind = plan_reshard(global, from, to, 0).kind;
  if (kind == ReshardKind::kAllGather) {
    for (int r = 0; r < p; ++r)
      sent[r] = numel_of(src[r]) * static_cast<std::int64_t>(plan_reshard(global, from, to, r).members.size() - 1);
    return sent;
  }
  if (kind != ReshardKind::kAllToAll) return sent;
  for (int r = 0; r < p; ++r) {
    std::vector<int> replicas;
    for (int q = 0; q < p; ++q)
      if (src[q] == src[r]) replicas.push_back(q);
    if (numel_of(src[r]) == 0 || replicas.front() != r) continue;  // each distinct block once
    std::size_t turn = 0;
    for (int q = 0; q < p; ++q) {
      if (src[q] == src[r] || overlap(src[r], dst[q]) == 0) continue;
      sent[replicas[turn++ % replicas.size()]] += overlap(src[r], dst[q]);
    }
  }
  return sent;
}

// Checks every rank's plan against the others' and against the element count.
void check_plans(const Shape& global, const NamedSharding& from, const NamedSharding& to) {
  const int p = static_cast<int>(from.mesh().size());
  std::vector<ReshardPlan> plans;
  for (int r = 0; r < p; ++r) plans.push_back(plan_reshard(global, from, to, r));
  const Traffic t = count_traffic(global, from, to);
  const std::int64_t largest = std::max(shape_numel(from.shard_shape(global)), shape_numel(to.shard_shape(global)));
  std::int64_t sent = 0;
  for (int r = 0; r < p; ++r) {
    const ReshardPlan& pl = plans[r];
    SCOPED_TRACE("rank " + std::to_string(r) + " " + to_string(pl.kind));
    EXPECT_EQ(pl.kind, plans[0].kind);
    EXPECT_EQ(pl.collectives(), t.needed ? 1 : 0);
    EXPECT_EQ(pl.elements_received(), t.received[r]);
    sent += pl.elements_sent();
    // Staging: one target block to receive into; one source block to send from (each distinct piece packed once,
    // and the pieces of different targets are disjoint parts of the source block), even or uneven.
    EXPECT_LE(pl.recv_staging, numel_of(pl.target));
    EXPECT_LE(pl.send_staging, numel_of(pl.source));
    EXPECT_LE(pl.send_staging, largest);
    // What r sends to a member is what that member expects from r.
    for (std::size_t j = 0; j < pl.members.size(); ++j) {
      const ReshardPlan& peer = plans[pl.members[j]];
      const auto it = std::find(peer.members.begin(), peer.members.end(), r);
      ASSERT_NE(it, peer.members.end());
      const auto back = static_cast<std::size_t>(it - peer.members.begin());
      EXPECT_EQ(numel_of(pl.send[j]), numel_of(peer.recv[back]));
      if (numel_of(pl.send[j]) > 0) {
        EXPECT_EQ(pl.send[j], peer.recv[back]);
      }
    }
    // The received pieces and the own part fill the target block exactly.
    std::int64_t filled = numel_of(pl.self);
    for (const Box& b : pl.recv) filled += numel_of(b);
    if (pl.kind != ReshardKind::kAllGather) {
      EXPECT_EQ(filled, numel_of(pl.target));
    }
  }
  // Each missing element travels once, and the replicas of a block share the sending.
  EXPECT_EQ(sent, t.total);
  EXPECT_EQ(sent_by_rank(global, from, to), expected_sent(global, from, to));
}

struct Case {
  Shape shape;
  bool uneven;
};

std::vector<Case> cases_for(std::int64_t p) {
  // 12 divides by 1..4 and 6 (the abstract meshes); 7, 5, 3 and 2 leave remainders, 2 empty shards.
  return {{{12, 24}, false}, {{0, 12}, false}, {{7, 5}, true}, {{2, 3}, true}, {{5, 0}, true}, {{3 * p + 1, 2}, true}};
}

// ---- the plan, without processes -------------------------------------------------------------------------------

TEST(ReshardPlan, TransposeOnA2x2MeshIsOneSwapBetweenOffDiagonalRanks) {
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"});
  const NamedSharding from(m, P("x", "y")), to(m, P("y", "x"));
  // Rank (0,1) holds rows 0:2, cols 2:4 and needs rows 2:4, cols 0:2: the block of rank (1,0), and the reverse.
  const int r01 = m.rank_at({0, 1}), r10 = m.rank_at({1, 0}), r00 = m.rank_at({0, 0});
  const ReshardPlan a = plan_reshard({4, 4}, from, to, r01);
  EXPECT_EQ(a.kind, ReshardKind::kAllToAll);
  EXPECT_EQ(a.collectives(), 1);
  EXPECT_EQ(a.elements_sent(), 4);
  EXPECT_EQ(a.elements_received(), 4);
  EXPECT_EQ(a.send_counts[r10], 4);
  EXPECT_EQ(a.recv_counts[r10], 4);
  EXPECT_EQ(a.recv[r10], (Box{{2, 4}, {0, 2}}));
  EXPECT_EQ(a.send[r10], (Box{{0, 2}, {2, 4}}));
  // Whole blocks: sent from and received into the blocks themselves, no staging.
  EXPECT_EQ(a.send_staging, 0);
  EXPECT_EQ(a.recv_staging, 0);
  // The diagonal keeps its block.
  const ReshardPlan d = plan_reshard({4, 4}, from, to, r00);
  EXPECT_EQ(d.elements_sent(), 0);
  EXPECT_EQ(d.elements_received(), 0);
  EXPECT_EQ(d.self, (Box{{0, 2}, {0, 2}}));
}

TEST(ReshardPlan, ShardToReplicatedIsOneAllGather) {
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"});
  const ReshardPlan all = plan_reshard({4, 4}, NamedSharding(m, P("x", "y")), NamedSharding(m, P()), 3);
  EXPECT_EQ(all.kind, ReshardKind::kAllGather);
  EXPECT_EQ(all.gather_axes, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(all.recv_counts, (std::vector<std::int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(all.elements_received(), 12);
  EXPECT_EQ(all.elements_sent(), 12);  // its 4 elements to each of 3 ranks
  EXPECT_EQ(all.recv_staging, 16);     // 2x2 blocks interleave in the rows of the result
  // Gathering y only: the group of rank (1,0) is (1,0), (1,1); column blocks interleave too.
  const int r10 = m.rank_at({1, 0}), r11 = m.rank_at({1, 1});
  const ReshardPlan y = plan_reshard({4, 4}, NamedSharding(m, P("x", "y")), NamedSharding(m, P("x")), r10);
  EXPECT_EQ(y.kind, ReshardKind::kAllGather);
  EXPECT_EQ(y.gather_axes, (std::vector<std::string>{"y"}));
  EXPECT_EQ(y.members, (std::vector<int>{r10, r11}));
  EXPECT_EQ(y.elements_received(), 4);
  // Uneven rows (7 over 4: 2, 2, 2, 1) are consecutive in the result: gathered straight into it.
  const Mesh line = Mesh::abstract({4}, {"x"});
  const ReshardPlan u = plan_reshard({7, 3}, NamedSharding(line, P("x"), true), NamedSharding(line, P(), true), 3);
  EXPECT_EQ(u.kind, ReshardKind::kAllGather);
  EXPECT_EQ(u.recv_counts, (std::vector<std::int64_t>{6, 6, 6, 3}));
  EXPECT_EQ(u.elements_received(), 18);
  EXPECT_EQ(u.elements_sent(), 9);
  EXPECT_EQ(u.recv_staging, 0);
}

TEST(ReshardPlan, ReplicatedToShardedAndSameBlocksNeedNoCollective) {
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"});
  const NamedSharding rep(m, P()), xy(m, P("x", "y"));
  for (int r = 0; r < 4; ++r) {
    const ReshardPlan local = plan_reshard({4, 6}, rep, xy, r);
    EXPECT_EQ(local.kind, ReshardKind::kLocal);
    EXPECT_EQ(local.collectives(), 0);
    EXPECT_EQ(local.self, xy.index({4, 6}, r));
    EXPECT_EQ(plan_reshard({4, 6}, NamedSharding(m, P("x")), NamedSharding(m, P("x", kNone)), r).kind,
              ReshardKind::kKeep);
    EXPECT_EQ(plan_reshard({4, 6}, NamedSharding(m, P("x")), NamedSharding(m, P("x"), true), r).kind,
              ReshardKind::kKeep);
    // Size zero: nothing to move whatever the specs.
    EXPECT_EQ(plan_reshard({0, 6}, NamedSharding(m, P("x", "y")), NamedSharding(m, P("y", "x")), r).collectives(), 0);
  }
  const Mesh thin = Mesh::abstract({2, 1}, {"x", "y"});
  EXPECT_EQ(plan_reshard({4}, NamedSharding(thin, P("y")), NamedSharding(thin, P()), 1).kind, ReshardKind::kKeep);
}

TEST(ReshardPlan, UnevenMovesOnlyWhatIsMissing) {
  // 7x2 over 3 ranks: rows 0:3, 3:6, 6:7 -> columns 0:1, 1:2 and an empty one.
  const Mesh m = Mesh::abstract({3}, {"x"});
  const NamedSharding rows(m, P("x"), true), cols(m, P(kNone, "x"), true);
  const ReshardPlan p0 = plan_reshard({7, 2}, rows, cols, 0);
  EXPECT_EQ(p0.kind, ReshardKind::kAllToAll);
  EXPECT_EQ(p0.recv_counts, (std::vector<std::int64_t>{0, 3, 1}));  // rows 3:6 and row 6 of column 0
  EXPECT_EQ(p0.send_counts, (std::vector<std::int64_t>{0, 3, 0}));  // rows 0:3 of column 1
  EXPECT_EQ(p0.self, (Box{{0, 3}, {0, 1}}));
  const ReshardPlan p2 = plan_reshard({7, 2}, rows, cols, 2);
  EXPECT_EQ(p2.send_counts, (std::vector<std::int64_t>{1, 1, 0}));
  EXPECT_EQ(p2.elements_received(), 0);
  EXPECT_EQ(p2.recv_staging, 0);
  // Column pieces of a row block are strided in it: packed before sending.
  EXPECT_EQ(p0.send_staging, 3);
}

TEST(ReshardPlan, FanOutWhereTheTargetReplicatesMore) {
  // P(x, y) -> P(y) on 2x2: rank (0,1)'s block (rows 0:2, cols 2:4) is needed by both ranks with y = 0, and it
  // alone holds it; it needs rows 2:4 in full, from (1,0) and (1,1).
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"});
  const ReshardPlan p =
      plan_reshard({4, 4}, NamedSharding(m, P("x", "y")), NamedSharding(m, P("y")), m.rank_at({0, 1}));
  EXPECT_EQ(p.kind, ReshardKind::kAllToAll);
  EXPECT_EQ(p.elements_sent(), 8);
  EXPECT_EQ(p.elements_received(), 8);
  EXPECT_EQ(p.send_staging, 4);  // its block, packed once: both ranks that need it read the same copy
  std::vector<std::int64_t> displs;
  for (std::size_t j = 0; j < p.send_counts.size(); ++j)
    if (p.send_counts[j] > 0) displs.push_back(p.send_displs[j]);
  EXPECT_EQ(displs, (std::vector<std::int64_t>{0, 0}));
  EXPECT_EQ(p.recv_staging, 8);  // the two column halves interleave in the rows of the result
}

TEST(ReshardPlan, ReplicasOfABlockTakeTurnsSendingIt) {
  // P(x) -> P(None, x) on 2x2, 4x4 float32: the row block of x = 0 is held by (0,0) and (0,1) and needed (its columns
  // 2:4) by (1,0) and (1,1); each replica serves one of them. Every rank sends 4 elements (16 bytes), not 8, 0, 8, 0.
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"});
  const NamedSharding from(m, P("x")), to(m, P(kNone, "x"));
  std::vector<std::int64_t> bytes;
  for (int r = 0; r < 4; ++r) {
    const ReshardPlan plan = plan_reshard({4, 4}, from, to, r);
    EXPECT_EQ(plan.kind, ReshardKind::kAllToAll);
    EXPECT_EQ(plan.elements_received(), 4);
    bytes.push_back(plan.elements_sent() * static_cast<std::int64_t>(dtype_size(DType::kFloat32)));
  }
  EXPECT_EQ(bytes, (std::vector<std::int64_t>{16, 16, 16, 16}));
  // Three replicas, two ranks in need. P(x) -> P(y, x) on 2x3, 6x4: rows 0:3 (ranks 0-2) are needed by rank 3 (its
  // rows 0:2, cols 2:4: 4 elements) and rank 4 (row 2, cols 2:4: 2); rows 3:6 (ranks 3-5) by rank 1 (row 3, cols 0:2:
  // 2) and rank 2 (rows 4:6, cols 0:2: 4). The first replica serves the first rank in need, the second the second.
  const Mesh wide = Mesh::abstract({2, 3}, {"x", "y"});
  EXPECT_EQ(sent_by_rank({6, 4}, NamedSharding(wide, P("x")), NamedSharding(wide, P("y", "x"))),
            (std::vector<std::int64_t>{4, 2, 0, 2, 4, 0}));
}

TEST(ReshardPlan, EveryPairOnAbstractMeshesMatchesTheElementCount) {
  // Planning alone, the same at every world size: the ranks share the pairs (each checks every world-size-th one), so
  // that the sweep costs one rank's time at 1-4 ranks alike (at 4 under the sanitizers it took 52 s a rank).
  const auto world = Communicator::world();
  std::int64_t pair = 0;
  const std::vector<Mesh> meshes{Mesh::abstract({1}, {"x"}),         Mesh::abstract({3}, {"x"}),
                                 Mesh::abstract({2, 2}, {"x", "y"}), Mesh::abstract({2, 3}, {"x", "y"}),
                                 Mesh::abstract({4, 1}, {"x", "y"}), Mesh::abstract({2, 1, 2}, {"x", "y", "z"})};
  for (const Mesh& m : meshes) {
    const auto specs = test_specs(m);
    for (const Case& c : cases_for(m.size())) {
      for (const auto& from : specs) {
        for (const auto& to : specs) {
          if (pair++ % world->size() != world->rank()) continue;
          SCOPED_TRACE(m.to_string() + " " + shape_to_string(c.shape) + " " + from.to_string() + " -> " +
                       to.to_string());
          const NamedSharding sf(m, from, c.uneven), st(m, to, c.uneven);
          check_plans(c.shape, sf, st);
        }
      }
    }
  }
}

TEST(ReshardPlan, RefusesAnotherMeshAndARankOutside) {
  const Mesh a = Mesh::abstract({2}, {"x"}), b = Mesh::abstract({2}, {"y"});
  EXPECT_THROW(plan_reshard({4}, NamedSharding(a, P("x")), NamedSharding(b, P("y")), 0), InvalidArgument);
  EXPECT_THROW(plan_reshard({4}, NamedSharding(a, P("x")), NamedSharding(a, P()), 2), InvalidArgument);
  EXPECT_THROW(plan_reshard({5}, NamedSharding(a, P("x")), NamedSharding(a, P()), 0), InvalidArgument);
}

// ---- the executor, at 1-4 ranks ----------------------------------------------------------------------------------

// The meshes for the world size, with every communicator reshard may use created up front (creating one is itself
// collective, and would disturb the counts).
std::vector<Mesh> meshes_with_comms() {
  std::vector<Mesh> out = test_meshes();
  auto world = Communicator::world();
  const std::int64_t n = world->size();
  if (n == 2 || n == 3) out.emplace_back(std::vector<std::int64_t>{1, n}, std::vector<std::string>{"x", "y"}, world);
  if (n == 3) out.emplace_back(std::vector<std::int64_t>{n, 1}, std::vector<std::string>{"x", "y"}, world);
  return out;
}

// Every communicator of the mesh (its own and one per non-empty subset of axes, in mesh order).
std::vector<std::shared_ptr<Communicator>> comms_of(const Mesh& m) {
  std::set<Communicator*> seen;
  std::vector<std::shared_ptr<Communicator>> out;
  const auto& names = m.axis_names();
  for (unsigned mask = 0; mask < (1u << names.size()); ++mask) {
    std::vector<std::string> axes;
    for (std::size_t i = 0; i < names.size(); ++i)
      if (mask & (1u << i)) axes.push_back(names[i]);
    auto c = axes.empty() ? m.comm() : m.axis_comm(Axes(axes));
    if (seen.insert(c.get()).second) out.push_back(c);
  }
  return out;
}

std::uint64_t issued(const std::vector<std::shared_ptr<Communicator>>& comms) {
  std::uint64_t n = 0;
  for (const auto& c : comms) n += c->sequence();
  return n;
}

TEST(Reshard, EveryPairIssuesThePlannedCollectiveAndMovesTheFewestElements) {
  for (const Mesh& m : meshes_with_comms()) {
    const auto comms = comms_of(m);
    const auto specs = test_specs(m);
    for (const Case& c : cases_for(m.size())) {
      if (!c.uneven && (c.shape[0] % m.size() != 0 || c.shape[1] % m.size() != 0)) continue;
      const Array g = iota(c.shape);
      for (const auto& from : specs) {
        const NamedSharding sf(m, from, c.uneven);
        const ShardedArray x = from_local(block(g, sf, m.rank()), c.shape, sf);
        for (const auto& to : specs) {
          SCOPED_TRACE(m.to_string() + " " + shape_to_string(c.shape) + (c.uneven ? " uneven " : " ") +
                       from.to_string() + " -> " + to.to_string());
          const NamedSharding st(m, to, c.uneven);
          const ReshardPlan plan = plan_reshard(c.shape, sf, st, m.rank());
          const Traffic t = count_traffic(c.shape, sf, st);
          const std::uint64_t before = issued(comms);
          const ShardedArray y = reshard(x, st);
          const std::uint64_t after = issued(comms);
          // (a) values
          EXPECT_EQ(y.sharding(), st);
          EXPECT_TRUE(equal(y.local(), block(g, st, m.rank())));
          // (b) collectives: as planned, and one exactly when some rank lacks part of its target block
          EXPECT_EQ(after - before, static_cast<std::uint64_t>(plan.collectives()));
          EXPECT_EQ(plan.collectives(), t.needed ? 1 : 0);
          // (c) elements moved: each rank receives what it lacks; all ranks together send that, each element once
          const std::int64_t largest =
              std::max(shape_numel(sf.shard_shape(c.shape)), shape_numel(st.shard_shape(c.shape)));
          EXPECT_EQ(plan.elements_received(), t.received[m.rank()]);
          const auto sent = sent_by_rank(c.shape, sf, st);
          EXPECT_EQ(std::accumulate(sent.begin(), sent.end(), std::int64_t{0}), t.total);
          EXPECT_EQ(sent, expected_sent(c.shape, sf, st));
          // (d) staging: one target block to receive; one source block to send from, even or uneven
          EXPECT_LE(plan.recv_staging, y.local().numel());
          EXPECT_LE(plan.send_staging, x.local().numel());
          EXPECT_LE(plan.send_staging, largest);
        }
      }
    }
  }
}

TEST(Reshard, TransposeMovesEachOffDiagonalBlockOnce) {
  // Hand count on a 2x2 mesh, 12x12 of doubles: blocks are 6x6; the two off-diagonal ranks swap theirs.
  const Mesh* mesh = nullptr;
  for (const Mesh& m : test_meshes())
    if (m.shape() == std::vector<std::int64_t>{2, 2}) mesh = &m;
  if (mesh == nullptr) GTEST_SKIP() << "needs 4 ranks";
  const Mesh& m = *mesh;
  const auto comms = comms_of(m);
  const Array g = iota({12, 12});
  const NamedSharding from(m, P("x", "y")), to(m, P("y", "x"));
  const ShardedArray x = from_local(block(g, from, m.rank()), {12, 12}, from);
  const std::uint64_t before = m.comm()->sequence(), all_before = issued(comms);
  const ShardedArray y = reshard(x, to);
  EXPECT_EQ(m.comm()->sequence() - before, 1u);
  EXPECT_EQ(issued(comms) - all_before, 1u);
  const std::vector<std::int64_t> c = m.coords(m.rank());
  const ReshardPlan plan = plan_reshard({12, 12}, from, to, m.rank());
  EXPECT_EQ(plan.elements_sent() * 8, c[0] == c[1] ? 0 : 288);
  EXPECT_TRUE(equal(y.local(), block(g, to, m.rank())));
}

}  // namespace
}  // namespace shardkit::testing
