// Transport choice: every operation × backend setting × buffer placement, against rules written out here (not read from
// the code under test), through the registry's router (transport.hpp) as the pipeline calls it, and every operation
// run on a communicator forced to each setting.

#include <set>
#include <vector>

#include "backends/nccl/nccl_transport.hpp"
#include "backends/shm/shm_transport.hpp"
#include "collective_test_util.hpp"
#include "transport.hpp"

namespace shardkit::testing {
namespace {

using detail::Placement;

// A request with the transports' state beside it: whether the communicator has shm (and of which shape, and whether it
// carries point-to-point operations) and NCCL (agreed on with the communicator: point-to-point may use it).
struct Req : detail::RouteRequest {
  bool shm_available = false;
  bool shm_hierarchical = false;
  bool shm_crowded = false;
  bool p2p_shm = false;
  bool nccl_available = false;

  Req(OpKind kind, BackendKind forced, Placement where, DType type = DType::kFloat32, ReduceOp red = ReduceOp::kSum,
      bool nccl = false)
      : RouteRequest{kind, forced, where, type, red}, nccl_available(nccl) {}

  detail::TransportView shm_view(bool made) const {
    return {made, p2p_shm,
            (shm_hierarchical ? detail::kShmHierarchical : 0u) | (shm_crowded ? detail::kShmCrowded : 0u)};
  }
};

// The router's answer where the communicator's transports stand as `r` says.
BackendKind route(const Req& r) {
  const auto all = detail::transports();
  std::vector<detail::TransportSlot> slots(all.size());
  slots[detail::transport_index(BackendKind::kShm)].view = r.shm_view(r.shm_available);
  slots[detail::transport_index(BackendKind::kNccl)].view = {r.nccl_available, true, 0};
  slots[detail::transport_index(BackendKind::kMpi)].view = {true, true, 0};
  return all[detail::route(r, slots, "routing test")]->kind;
}
// Whether shm would take `r` where the communicator has it.
bool needs_shm(const Req& r) { return detail::shm_transport().takes(r, r.shm_view(true)); }
// Before the shm backend is made: whether either shape would take `r` (the first such collective makes it).
bool may_need_shm(const Req& r) { return detail::shm_transport().may_take(r); }
// Whether `r` starts the ranks' NCCL decision (collective).
bool needs_nccl(const Req& r) { return detail::nccl_transport().may_take(r); }

// The router refuses `r` with an E naming its operation and saying `what`.
template <typename E>
void expect_refusal(const Req& r, const std::string& what) {
  try {
    route(r);
    ADD_FAILURE() << "no refusal";
  } catch (const E& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(op_name(r.op)), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

constexpr OpKind kAllOps[] = {OpKind::kAllreduce, OpKind::kReduce,   OpKind::kBcast,         OpKind::kAllgather,
                              OpKind::kGather,    OpKind::kScatter,  OpKind::kReduceScatter, OpKind::kAlltoall,
                              OpKind::kSend,      OpKind::kRecv,     OpKind::kSendrecv,      OpKind::kBarrier,
                              OpKind::kScan,      OpKind::kAllgatherv, OpKind::kAlltoallv};
static_assert(std::size(kAllOps) == kOpCount, "every operation is listed");

// What NCCL lacks, as its documentation has it: no prefix scan, no barrier.
const std::set<OpKind> kNotInNccl = {OpKind::kScan, OpKind::kBarrier};
const std::set<OpKind> kReducing = {OpKind::kAllreduce, OpKind::kReduce, OpKind::kReduceScatter, OpKind::kScan};

bool has_buffers(OpKind op) { return op != OpKind::kBarrier; }

TEST(Routing, EveryOperationSettingAndPlacement) {
  for (OpKind op : kAllOps) {
    for (BackendKind setting : {BackendKind::kAuto, BackendKind::kMpi, BackendKind::kNccl}) {
      for (Placement where : {Placement::kHost, Placement::kDevice, Placement::kMixed}) {
        for (bool nccl : {false, true}) {
          SCOPED_TRACE(::testing::Message() << op_name(op) << " setting=" << backend_name(setting)
                                            << " placement=" << static_cast<int>(where) << " nccl=" << nccl);
          Req r{op, setting, has_buffers(op) ? where : Placement::kNone};
          r.nccl_available = nccl;
          const bool host_involved = where != Placement::kDevice;
          if (setting == BackendKind::kNccl && has_buffers(op) && host_involved) {
            expect_refusal<InvalidArgument>(r, "SHARDKIT_BACKEND=nccl");
            continue;
          }
          const bool could_nccl =
              setting != BackendKind::kMpi && has_buffers(op) && !host_involved && !kNotInNccl.count(op);
          if (setting == BackendKind::kNccl && could_nccl && !nccl) {
            // Forced, on GPU buffers of an operation NCCL implements, where the ranks have no NCCL.
            expect_refusal<BackendError>(r, "cannot use NCCL");
            continue;
          }
          EXPECT_EQ(route(r), could_nccl && nccl ? BackendKind::kNccl : BackendKind::kMpi);
          // The ranks' NCCL decision (collective) is started exactly where the answer could be NCCL, by an operation
          // every rank runs (never by a point-to-point one).
          const bool p2p = op == OpKind::kSend || op == OpKind::kRecv || op == OpKind::kSendrecv;
          EXPECT_EQ(needs_nccl(r), could_nccl && !p2p);
        }
      }
    }
  }
}

TEST(Routing, ReductionsNcclLacksFallBackToMpi) {
  struct Case {
    DType dtype;
    ReduceOp op;
    bool nccl;
  };
  const Case cases[] = {
      {DType::kFloat32, ReduceOp::kSum, true},      {DType::kInt64, ReduceOp::kMin, true},
      {DType::kBFloat16, ReduceOp::kProd, true},    {DType::kUInt8, ReduceOp::kMax, true},
      {DType::kFloat16, ReduceOp::kMax, false},     {DType::kBFloat16, ReduceOp::kMin, false},
      {DType::kComplex64, ReduceOp::kSum, true},    {DType::kComplex128, ReduceOp::kProd, false},
      {DType::kInt16, ReduceOp::kSum, false},       {DType::kUInt16, ReduceOp::kMax, false},
      {DType::kBool, ReduceOp::kLogicalAnd, true},  {DType::kBool, ReduceOp::kLogicalXor, false},
      {DType::kInt32, ReduceOp::kBitXor, false},    {DType::kUInt8, ReduceOp::kLogicalOr, false},
  };
  for (OpKind op : kReducing) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << op_name(op) << " " << c.dtype << " " << reduce_op_name(c.op));
      Req r{op, BackendKind::kAuto, Placement::kDevice, c.dtype, c.op, true};
      const bool nccl = c.nccl && op != OpKind::kScan;
      EXPECT_EQ(route(r), nccl ? BackendKind::kNccl : BackendKind::kMpi);
      r.setting = BackendKind::kNccl;  // forced: still falls back rather than failing
      EXPECT_EQ(route(r), nccl ? BackendKind::kNccl : BackendKind::kMpi);
    }
  }
  // NCCL's float max/min drop NaN, which shardkit propagates: float32/float64 allreduce runs on NCCL over order keys
  // (in its result buffer); reduce and reduce_scatter, which have no room for the keys, and 16-bit floats go to MPI.
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    for (ReduceOp red : {ReduceOp::kMax, ReduceOp::kMin}) {
      for (OpKind op : kReducing) {
        SCOPED_TRACE(::testing::Message() << op_name(op) << " " << dt << " " << reduce_op_name(red));
        Req r{op, BackendKind::kAuto, Placement::kDevice, dt, red, true};
        EXPECT_EQ(route(r), op == OpKind::kAllreduce ? BackendKind::kNccl : BackendKind::kMpi);
      }
    }
  }
  // Data movement works on every dtype.
  Req r{OpKind::kAllgather, BackendKind::kAuto, Placement::kDevice, DType::kComplex128, ReduceOp::kProd, true};
  EXPECT_EQ(route(r), BackendKind::kNccl);
}

// What the shm backend implements: issue 21's operations, and gather and scatter.
const std::set<OpKind> kInShm = {OpKind::kAllreduce, OpKind::kReduce,        OpKind::kBcast,
                                 OpKind::kAllgather, OpKind::kReduceScatter, OpKind::kAlltoall,
                                 OpKind::kBarrier,   OpKind::kSendrecv,      OpKind::kGather,
                                 OpKind::kScatter};

// SHARDKIT_BACKEND=shm: shm for what it implements on host buffers (or none) when the communicator has it; MPI for the
// rest and when it has not; GPU buffers route as on auto. mpi never takes shm; auto takes it only by its table.
TEST(Routing, ShmSetting) {
  for (OpKind op : kAllOps) {
    for (Placement where : {Placement::kNone, Placement::kHost, Placement::kDevice, Placement::kMixed}) {
      for (bool available : {false, true}) {
        SCOPED_TRACE(::testing::Message() << op_name(op) << " placement=" << static_cast<int>(where)
                                          << " shm available=" << available);
        Req r{op, BackendKind::kShm, where};
        r.shm_available = available;
        const bool host = where == Placement::kHost || where == Placement::kNone;
        EXPECT_EQ(needs_shm(r), host && kInShm.count(op) > 0);
        if (host) {
          EXPECT_EQ(route(r), available && kInShm.count(op) ? BackendKind::kShm : BackendKind::kMpi);
        }
        r.setting = BackendKind::kMpi;
        EXPECT_FALSE(needs_shm(r));
        EXPECT_EQ(route(r), BackendKind::kMpi);
        r.setting = BackendKind::kAuto;
        r.bytes = 8;
        // (a sendrecv takes the table only where its peers run one too: RoutesSendrecvByWhatThePeersRun)
        EXPECT_EQ(needs_shm(r),
                  host && kInShm.count(op) && detail::shm_by_default(op, 8) && op != OpKind::kSendrecv);
      }
    }
  }
}

// A hierarchical shm backend (ranks on several nodes) serves allreduce, reduce, bcast, barrier, allgather and
// reduce_scatter on SHARDKIT_BACKEND=shm, its own table on auto, never on mpi; the other operations take MPI.
TEST(Routing, HierarchicalShm) {
  const std::set<OpKind> hierarchical = {OpKind::kAllreduce, OpKind::kReduce,    OpKind::kBcast,
                                         OpKind::kBarrier,   OpKind::kAllgather, OpKind::kReduceScatter};
  for (OpKind op : kAllOps) {
    SCOPED_TRACE(op_name(op));
    Req r{op, BackendKind::kShm, Placement::kHost};
    r.shm_available = true;
    r.shm_hierarchical = true;
    EXPECT_EQ(needs_shm(r), hierarchical.count(op) > 0);
    EXPECT_EQ(route(r), hierarchical.count(op) ? BackendKind::kShm : BackendKind::kMpi);
    r.setting = BackendKind::kMpi;
    EXPECT_EQ(route(r), BackendKind::kMpi);
    r.setting = BackendKind::kAuto;
    for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{8}, std::int64_t{1} << 20}) {
      r.bytes = bytes;
      EXPECT_EQ(needs_shm(r), hierarchical.count(op) && detail::hier_by_default(op, bytes));
      // Before the backend is made, either table may ask for it.
      Req flat = r;
      flat.shm_hierarchical = false;
      EXPECT_EQ(may_need_shm(r), needs_shm(r) || needs_shm(flat));
    }
  }
  // The measured crossovers: allreduce, allgather, reduce_scatter and barrier at every size, bcast from 512 B, reduce
  // from 128 B.
  for (OpKind op : {OpKind::kAllreduce, OpKind::kAllgather, OpKind::kReduceScatter, OpKind::kBarrier}) {
    for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{8}, std::int64_t{1} << 20, std::int64_t{64} << 20})
      EXPECT_TRUE(detail::hier_by_default(op, bytes)) << op_name(op) << " " << bytes;
  }
  EXPECT_TRUE(detail::hier_by_default(OpKind::kBcast, 512));
  EXPECT_FALSE(detail::hier_by_default(OpKind::kBcast, 511));
  EXPECT_TRUE(detail::hier_by_default(OpKind::kReduce, 128));
  EXPECT_TRUE(detail::hier_by_default(OpKind::kReduce, std::int64_t{64} << 20));
  EXPECT_FALSE(detail::hier_by_default(OpKind::kReduce, 127));
}

// The default route's table reads whether the shm backend's ranks outnumber their CPUs: small bcasts, reduces up to
// 16 KiB and gathers and scatters up to 4 KiB a rank take shm only where they do not (crowded, shm's bcast measured
// 16-18x MPI's, its reduce 0.34-17x, gather and scatter 3-44x below 2 KiB), and before the backend is made the first
// small bcast may ask for it. Nothing else in the table depends on it.
TEST(Routing, SmallRootedOperationsTakeShmOnlyWithACpuPerRank) {
  Req r{OpKind::kBcast, BackendKind::kAuto, Placement::kHost};
  r.shm_available = true;
  for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{8}, std::int64_t{511}}) {
    SCOPED_TRACE(bytes);
    r.bytes = bytes;
    r.shm_crowded = false;
    EXPECT_EQ(route(r), BackendKind::kShm);
    EXPECT_TRUE(may_need_shm(r));
    r.shm_crowded = true;
    EXPECT_EQ(route(r), BackendKind::kMpi);
  }
  r.bytes = 512;
  EXPECT_EQ(route(r), BackendKind::kShm);  // still crowded: from 512 B shm wins either way
  for (OpKind op : kAllOps) {
    if (op == OpKind::kBcast || op == OpKind::kReduce || op == OpKind::kGather || op == OpKind::kScatter) continue;
    for (std::int64_t bytes : {std::int64_t{8}, std::int64_t{4} << 10, std::int64_t{64} << 20})
      EXPECT_EQ(detail::shm_by_default(op, bytes, true), detail::shm_by_default(op, bytes));
  }
  // The measured crossovers at 2-4 ranks: allreduce at every size, allgather up to 256 KiB a rank, bcast up to 256 KiB.
  EXPECT_TRUE(detail::shm_by_default(OpKind::kAllreduce, std::int64_t{64} << 20));
  for (bool crowded : {false, true}) {
    EXPECT_TRUE(detail::shm_by_default(OpKind::kBcast, std::int64_t{256} << 10, crowded));
    EXPECT_FALSE(detail::shm_by_default(OpKind::kBcast, (std::int64_t{256} << 10) + 1, crowded));
  }
  EXPECT_TRUE(detail::shm_by_default(OpKind::kAllgather, std::int64_t{256} << 10));
  EXPECT_FALSE(detail::shm_by_default(OpKind::kAllgather, (std::int64_t{256} << 10) + 1));
  // Reduce: up to 16 KiB, only where the ranks have a CPU each.
  for (bool crowded : {false, true}) {
    EXPECT_EQ(detail::shm_by_default(OpKind::kReduce, 0, crowded), !crowded);
    EXPECT_EQ(detail::shm_by_default(OpKind::kReduce, 8, crowded), !crowded);
    EXPECT_EQ(detail::shm_by_default(OpKind::kReduce, std::int64_t{16} << 10, crowded), !crowded);
    EXPECT_FALSE(detail::shm_by_default(OpKind::kReduce, (std::int64_t{16} << 10) + 1, crowded));
    EXPECT_FALSE(detail::shm_by_default(OpKind::kReduce, std::int64_t{64} << 20, crowded));
  }
  // Gather and scatter: up to 4 KiB a rank (the block each rank sends or receives), only with a CPU each.
  for (OpKind op : {OpKind::kGather, OpKind::kScatter}) {
    for (bool crowded : {false, true}) {
      EXPECT_EQ(detail::shm_by_default(op, 0, crowded), !crowded);
      EXPECT_EQ(detail::shm_by_default(op, std::int64_t{4} << 10, crowded), !crowded);
      EXPECT_FALSE(detail::shm_by_default(op, (std::int64_t{4} << 10) + 1, crowded));
    }
  }
}

// On a communicator that made shm with itself (RouteRequest::p2p_shm), every send, recv and sendrecv takes it on auto
// and where forced, whatever its size, its peers (wildcards too) and what they run; never on the mpi setting, and never
// with GPU buffers. Without p2p_shm, plain sends and receives never take shm, not even forced.
TEST(Routing, PointToPointTakesShmWhereTheCommunicatorMadeItWithItself) {
  for (OpKind op : {OpKind::kSend, OpKind::kRecv, OpKind::kSendrecv}) {
    for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{8}, std::int64_t{64} << 20}) {
      SCOPED_TRACE(::testing::Message() << op_name(op) << " bytes=" << bytes);
      Req r{op, BackendKind::kAuto, Placement::kHost};
      r.shm_available = true;
      r.p2p_shm = true;
      r.bytes = bytes;
      r.named_peers = false;
      for (Peers peers : {Peers::kUnknown, Peers::kAllSendrecv, Peers::kMixed}) {
        r.peers = peers;
        for (BackendKind setting : {BackendKind::kAuto, BackendKind::kShm}) {
          r.setting = setting;
          EXPECT_EQ(route(r), BackendKind::kShm);
        }
        r.setting = BackendKind::kMpi;
        EXPECT_EQ(route(r), BackendKind::kMpi);
      }
      r.setting = BackendKind::kAuto;
      r.placement = Placement::kDevice;
      EXPECT_FALSE(needs_shm(r));
      r.placement = Placement::kHost;
      r.p2p_shm = false;
      r.named_peers = true;
      r.peers = Peers::kUnknown;
      r.setting = BackendKind::kShm;
      EXPECT_EQ(route(r), op == OpKind::kSendrecv ? BackendKind::kShm : BackendKind::kMpi);
    }
  }
}

// A sendrecv takes shm only between named peers, both this rank or neither: a wildcard source could be any rank's
// message, and shm's channels pair each send with the peer's receive in the same call.
TEST(Routing, ShmSendrecvNeedsNamedPeers) {
  for (Peers peers : {Peers::kUnknown, Peers::kAllSendrecv}) {
    Req r{OpKind::kSendrecv, BackendKind::kShm, Placement::kHost};
    r.shm_available = true;
    r.peers = peers;
    EXPECT_EQ(route(r), BackendKind::kShm);
    r.named_peers = false;
    EXPECT_FALSE(needs_shm(r));
    EXPECT_EQ(route(r), BackendKind::kMpi);
  }
}

// And by what its peers run (OpArgs::peers), since shm pairs a sendrecv only with the peer's sendrecv: where every
// rank runs one, by the table on auto (every size); a program's own (which MPI may answer with a plain send or recv)
// only where forced; where some peers send or receive alone (on MPI), never. Not on the hierarchical backend.
TEST(Routing, RoutesSendrecvByWhatThePeersRun) {
  for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{8}, std::int64_t{1} << 20, std::int64_t{64} << 20}) {
    SCOPED_TRACE(::testing::Message() << "bytes=" << bytes);
    Req r{OpKind::kSendrecv, BackendKind::kAuto, Placement::kHost};
    r.shm_available = true;
    r.bytes = bytes;
    const auto on = [&](BackendKind setting, Peers peers) {
      r.setting = setting;
      r.peers = peers;
      return route(r);
    };
    EXPECT_EQ(on(BackendKind::kAuto, Peers::kAllSendrecv), BackendKind::kShm);
    EXPECT_EQ(on(BackendKind::kShm, Peers::kAllSendrecv), BackendKind::kShm);
    EXPECT_EQ(on(BackendKind::kAuto, Peers::kUnknown), BackendKind::kMpi);
    EXPECT_EQ(on(BackendKind::kShm, Peers::kUnknown), BackendKind::kShm);
    EXPECT_EQ(on(BackendKind::kAuto, Peers::kMixed), BackendKind::kMpi);
    EXPECT_EQ(on(BackendKind::kShm, Peers::kMixed), BackendKind::kMpi);
    EXPECT_EQ(on(BackendKind::kMpi, Peers::kAllSendrecv), BackendKind::kMpi);
    r.shm_hierarchical = true;
    EXPECT_EQ(on(BackendKind::kAuto, Peers::kAllSendrecv), BackendKind::kMpi);
    r.shm_hierarchical = false;
  }
}

// Every operation on host buffers, on communicators forced to each backend setting: auto, mpi and shm run it, nccl
// refuses it naming the operation (barrier, which has no buffers, runs on MPI).
TEST(Routing, EveryOperationOnEverySetting) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  const int n = world()->size(), r = world()->rank();
  for (BackendKind setting : {BackendKind::kAuto, BackendKind::kMpi, BackendKind::kNccl, BackendKind::kShm}) {
    CommOptions o;
    o.backend = setting;
    o.name = std::string("forced ") + backend_name(setting);
    auto comm = Communicator::world(o);
    Communicator& c = *comm;
    for (OpKind op : kAllOps) {
      SCOPED_TRACE(::testing::Message() << op_name(op) << " on " << o.name);
      Array send = Array::arange(2 * n, DType::kInt32), recv = Array::zeros({2 * n}, DType::kInt32);
      Array one = Array::arange(2, DType::kInt32), two = Array::zeros({2}, DType::kInt32);
      std::vector<std::int64_t> counts(n, 2), gcounts(n, 2);
      OpArgs a{.send = &send, .recv = &recv};
      if (op == OpKind::kAllgather || op == OpKind::kGather || op == OpKind::kAllgatherv) a.send = &one;
      if (op == OpKind::kScatter || op == OpKind::kReduceScatter) a.recv = &two;
      if (op == OpKind::kAllgatherv) a.recv_counts = gcounts;
      if (op == OpKind::kAlltoallv) a.send_counts = a.recv_counts = counts;
      // Point to point: a ring.
      a.dest = (r + 1) % n;
      a.source = (r + n - 1) % n;
      a.recv_tag = a.send_tag = 3;
      const bool p2p_alone = op == OpKind::kSend || op == OpKind::kRecv;
      if (setting == BackendKind::kNccl && has_buffers(op)) {
        try {
          c.run(op, a);
          ADD_FAILURE() << "no InvalidArgument";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(op_name(op)), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("nccl"), std::string::npos) << e.what();
        }
        continue;
      }
      if (p2p_alone) {
        // A send is matched by the receive of the next operation in the list (kRecv follows kSend).
        if (op == OpKind::kSend) {
          a.send = &one;
          c.run(op, a).wait();
        } else {
          a.recv = &two;
          c.run(op, a).wait();
          EXPECT_EQ(two.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 1}));
        }
        continue;
      }
      if (op == OpKind::kSendrecv) a.recv = &two, a.send = &one;
      EXPECT_NO_THROW(c.run(op, a).wait());
      if (setting == BackendKind::kShm) {
        EXPECT_EQ(c.backend_for(op, Device::cpu()), kInShm.count(op) ? shm_route(op) : BackendKind::kMpi);
      }
    }
  }
}

}  // namespace
}  // namespace shardkit::testing
