// The shm backend's surroundings: which route each operation takes (on auto by size across hosts, by the block for a
// scatter, point-to-point by how the communicator was made, never shm on the mpi setting), the wait policy (spin with a
// CPU per rank, yield and sleep when crowded), and that nothing is left in /dev/shm. The operations' results are
// shm_test.cpp's.

#include <sched.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "backend.hpp"
#include "collective_test_util.hpp"
#include "flight_recorder.hpp"
#include "backends/shm/shm_transport.hpp"
#include "shardkit/launch/runtime.hpp"
#include "backends/shm/shm_segment.hpp"
#include "shm_files.hpp"

namespace shardkit::testing {
namespace {

using detail::WaitPolicy;

// This rank's flight-recorder records of communicator `name` for `op`: "<count> <backend>" each, oldest first (from a
// dump of this rank alone).
std::vector<std::string> recorded_routes(const std::string& name, OpKind op) {
  static int dumps = 0;
  char dir[] = "/tmp/shardkit-routes-XXXXXX";
  if (mkdtemp(dir) == nullptr) return {"mkdtemp failed"};
  const ProcessSettings saved = ProcessSettings::current();
  ProcessSettings here = saved;
  here.dump_dir = dir;
  ProcessSettings::set(here);
  const std::string path =
      detail::dump_flight_records("routes of '" + name + "' #" + std::to_string(++dumps), /*local=*/false);
  ProcessSettings::set(saved);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::filesystem::remove_all(dir);
  const std::string dump = text.str();
  const std::size_t at = dump.find("\"name\": \"" + name + "\"");
  if (at == std::string::npos) return {"no communicator '" + name + "' in the dump: " + dump};
  const std::string mine = dump.substr(at, dump.find("]}", at) - at);
  const std::regex record(
      std::string("\"op\": \"") + op_name(op) +
      R"re(", "dtype": (?:"\w+"|null), "count": (-?\d+), "peer": -?\d+, [^{}]*?"backend": "(\w+)")re");
  std::vector<std::string> out;
  for (auto m = std::sregex_iterator(mine.begin(), mine.end(), record); m != std::sregex_iterator(); ++m)
    out.push_back((*m)[1].str() + " " + (*m)[2].str());
  return out;
}

// On the default route (auto), across hosts: allgather, reduce_scatter, reduce (to the last rank, which does not lead
// its node where ranks fill each node's slots in turn) and barrier take the hierarchical path where its table says
// (hier_by_default: at least the largest size here, past a chunk too; reduce not at the smallest) and MPI elsewhere,
// with exact results either way; the flight recorder says which route each call took. A job where some rank has a
// GPU stays on MPI (and NCCL) on the default route, host buffers included: its ranks could pass device buffers in one
// operation and host buffers in another, or some ranks one and some the other, and each operation must take one
// backend on every rank (shm_transport.cpp's decision, from the NCCL decision every rank shares; SHARDKIT_BACKEND=shm still forces shm):
// there every route is MPI, across hosts as on one node (the simulated-GPU build runs this across hosts with a GPU per
// rank; before 2026-12 it expected the hierarchy's table there and failed). On one node the flat table routes them:
// the results are checked, not the route.
class ShmAuto : public ::testing::TestWithParam<DType> {};

// Whether some rank of `c` has a GPU (this rank's Runtime device, over every rank).
bool gpu_somewhere(Communicator& c) {
  const Array mine = Array::from_values<std::int32_t>({Runtime::instance().device().kind == DeviceKind::kCUDA});
  return c.allreduce(mine, ReduceOp::kMax).value.to_vector<std::int32_t>()[0] != 0;
}

TEST_P(ShmAuto, AllgatherReduceScatterReduceAndBarrierRouteBySize) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  const DType dtype = GetParam();
  CommOptions o;
  o.name = "shm auto " + std::string(dtype_name(dtype));
  o.backend = BackendKind::kAuto;
  auto comm = Communicator::world(o);
  Communicator& c = *comm;
  const int rank = c.rank(), size = c.size();
  const auto item = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t large = static_cast<std::int64_t>(detail::ShmSegment::kSlotBytes) / item + 3;
  std::vector<std::string> gathers, scatters, reduces, barriers;
  const bool gpu_job = gpu_somewhere(c);
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, large}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const Array x = input(dtype, {n}, rank, Pattern::kData);
    Array want = Array::empty({size, n}, dtype);
    for (int r = 0; r < size; ++r) want.slice(0, r, r + 1).copy_from(input(dtype, {1, n}, r, Pattern::kData));
    EXPECT_TRUE(same(c.allgather(x).value, want));
    const Array blocks = input(dtype, {size * n}, rank, Pattern::kArithmetic);
    Array y = Array::empty({n}, dtype);
    c.reduce_scatter(blocks, y, ReduceOp::kSum).wait();
    EXPECT_TRUE(same(y, reference(dtype, {n}, ReduceOp::kSum, 0, size - 1, rank * n)));
    const Array mine = input(dtype, {n}, rank, Pattern::kArithmetic);
    Array sum = Array::empty({n}, dtype);
    c.reduce(mine, sum, ReduceOp::kSum, size - 1).wait();
    if (rank == size - 1) {
      EXPECT_TRUE(same(sum, reference(dtype, {n}, ReduceOp::kSum, 0, size - 1)));
    }
    c.barrier().wait();
    const auto route = [&](OpKind op, std::int64_t bytes) {
      return !gpu_job && detail::hier_by_default(op, bytes) ? "shm" : "mpi";
    };
    gathers.push_back(std::to_string(n) + " " + route(OpKind::kAllgather, n * item));
    scatters.push_back(std::to_string(size * n) + " " + route(OpKind::kReduceScatter, size * n * item));
    reduces.push_back(std::to_string(n) + " " + route(OpKind::kReduce, n * item));
    barriers.push_back(std::string("-1 ") + route(OpKind::kBarrier, 0));
  }
  if (world_on_one_node()) return;
  const std::string taken = gpu_job ? " mpi" : " shm";
  EXPECT_EQ(gathers.back(), std::to_string(large) + taken);
  EXPECT_EQ(reduces.front(), "0 mpi");
  EXPECT_EQ(reduces.back(), std::to_string(large) + taken);
  EXPECT_EQ(barriers.back(), "-1" + taken);
  EXPECT_EQ(recorded_routes(o.name, OpKind::kAllgather), gathers);
  EXPECT_EQ(recorded_routes(o.name, OpKind::kReduceScatter), scatters);
  EXPECT_EQ(recorded_routes(o.name, OpKind::kReduce), reduces);
  EXPECT_EQ(recorded_routes(o.name, OpKind::kBarrier), barriers);
}

// A scatter's root holds every rank's block, the others only their own: the route is chosen by the block (what every
// rank has), so that all ranks take the same one. Here blocks of 3 KiB, under the table's 4 KiB where the root's
// whole input (6-12 KiB) is past it: were the root to route by its input, it would take MPI while the others wait on
// shm, until the timeout. On one node the flight recorder shows one route on every rank (shm with a CPU each).
TEST(ShmAutoScatter, EveryRankRoutesByTheBlock) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  CommOptions o;
  o.name = "shm auto scatter";
  o.backend = BackendKind::kAuto;
  o.timeout = std::chrono::seconds(20);
  auto comm = Communicator::world(o);
  Communicator& c = *comm;
  const std::int64_t n = (std::int64_t{3} << 10) / 4;
  for (int root = 0; root < c.size(); ++root) {
    const Array rows = input(DType::kFloat32, {c.size(), n}, root, Pattern::kData);
    Array got = Array::empty({n}, DType::kFloat32);
    c.scatter(c.rank() == root ? rows : Array::zeros({c.size(), n}, DType::kFloat32), got, root).wait();
    EXPECT_TRUE(same(got, rows.slice(0, c.rank(), c.rank() + 1).contiguous().reshape({n})));
  }
  if (!world_on_one_node() || c.size() == 1) return;
  const std::vector<std::string> routes = recorded_routes(o.name, OpKind::kScatter);
  ASSERT_EQ(routes.size(), static_cast<std::size_t>(c.size()));
  const std::string route = routes[0].substr(routes[0].find(' ') + 1);
  for (const std::string& r : routes) EXPECT_EQ(r.substr(r.find(' ') + 1), route);
  // Every rank's flight recorder: one route on all ranks.
  Array mine = Array::from_values<std::int32_t>({route == "shm" ? 1 : 0});
  const std::vector<std::int32_t> all = c.allgather(mine).value.to_vector<std::int32_t>();
  for (std::int32_t v : all) EXPECT_EQ(v, all[0]);
}

INSTANTIATE_TEST_SUITE_P(SomeDTypes, ShmAuto,
                         ::testing::Values(DType::kInt8, DType::kBFloat16, DType::kInt32, DType::kFloat64,
                                           DType::kComplex64),
                         dtype_param_name);

// Which point-to-point operations take shm. On a communicator made with shm on one node (TransportView::p2p): every
// send, recv and sendrecv, whatever the peers run, on auto and forced alike. On one that wraps the caller's (shm made
// later, by its first collective) only sendrecvs that every rank runs (a ppermute of every axis index, a matmul ring)
// by default, a program's own only where forced, those whose peers send or receive alone (a ppermute chain) never,
// and plain sends and receives never. Across hosts (the hierarchical backend) none. The flight recorder says which
// route each call took, in call order; the results are checked too.
TEST(ShmPointToPoint, RoutesByHowTheCommunicatorWasMade) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  for (const bool wrapped : {false, true}) {
    for (BackendKind setting : {BackendKind::kAuto, BackendKind::kShm}) {
      CommOptions o;
      o.name = std::string(wrapped ? "wrapped" : "made") + (setting == BackendKind::kAuto ? " on auto" : " forced");
      o.backend = setting;
      auto c = wrapped ? Communicator::wrap_mpi(from_mpi(MPI_COMM_WORLD), o) : Communicator::world(o);
      c->barrier().wait();  // a wrapped communicator makes its shm here
      const int right = (c->rank() + 1) % c->size(), left = (c->rank() + c->size() - 1) % c->size();
      const bool flat = world_on_one_node();
      std::vector<std::string> want, want_plain;
      for (Peers peers : {Peers::kAllSendrecv, Peers::kUnknown, Peers::kMixed, Peers::kAllSendrecv}) {
        SCOPED_TRACE(::testing::Message() << o.name << " peers=" << static_cast<int>(peers));
        const Array x = input(DType::kFloat64, {5}, c->rank(), Pattern::kData);
        Array y = Array::empty({5}, DType::kFloat64);
        c->sendrecv_into(x, right, y, left, /*send_tag=*/3, /*recv_tag=*/3, nullptr, {}, peers).wait();
        EXPECT_TRUE(same(y, input(DType::kFloat64, {5}, left, Pattern::kData)));
        const bool shm = flat && (!wrapped || peers == Peers::kAllSendrecv ||
                                  (peers == Peers::kUnknown && setting == BackendKind::kShm));
        want.push_back(std::string("5 ") + (shm ? "shm" : "mpi"));
      }
      // A send to the right and a receive from the left, one after the other (ranks in turn, so that none waits for
      // the next to send first).
      const Array x = input(DType::kFloat64, {3}, c->rank(), Pattern::kData);
      Array y = Array::empty({3}, DType::kFloat64);
      if (c->rank() % 2 == 0) c->send(x, right, 4).wait();
      c->recv_into(y, left, 4).wait();
      if (c->rank() % 2 == 1) c->send(x, right, 4).wait();
      EXPECT_TRUE(same(y, input(DType::kFloat64, {3}, left, Pattern::kData)));
      want_plain.push_back(std::string("3 ") + (flat && !wrapped ? "shm" : "mpi"));
      EXPECT_EQ(recorded_routes(o.name, OpKind::kSendrecv), want) << o.name;
      EXPECT_EQ(recorded_routes(o.name, OpKind::kSend), want_plain) << o.name;
      EXPECT_EQ(recorded_routes(o.name, OpKind::kRecv), want_plain) << o.name;
      for (OpKind op : {OpKind::kSend, OpKind::kRecv})
        EXPECT_EQ(c->backend_for(op, Device::cpu()), flat && !wrapped ? BackendKind::kShm : BackendKind::kMpi)
            << o.name << " " << op_name(op);
    }
  }
}

TEST(ShmFiles, NothingLeftInDevShmOnceMadeAndAfterAnError) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  auto c = Communicator::world({.backend = BackendKind::kShm, .name = "shm files"});
  c->barrier().wait();  // makes the segment
  EXPECT_EQ(c->backend_for(OpKind::kBarrier, Device::cpu()), shm_route(OpKind::kBarrier));
  EXPECT_EQ(own_shm_segments(), 0);
  // An operation that throws (a reduction the dtype does not define) leaves nothing either.
  EXPECT_THROW(c->allreduce(Array::zeros({3}, DType::kFloat32), ReduceOp::kBitXor), InvalidArgument);
  c->barrier().wait();
  EXPECT_EQ(own_shm_segments(), 0);
  c.reset();
  EXPECT_EQ(own_shm_segments(), 0);
}

TEST(ShmWaitPolicy, SpinsWhileEveryRankHasACpuAndYieldsWhenCrowded) {
  const WaitPolicy spin = WaitPolicy::choose(2, 2, 2, 2), crowded = WaitPolicy::choose(4, 2, 4, 2);
  EXPECT_GT(spin.spins, 1000);
  EXPECT_LT(crowded.spins, 100);
  EXPECT_EQ(WaitPolicy::choose(2, 1, 2, 2).spins, crowded.spins);  // both ranks bound to one core
  EXPECT_EQ(WaitPolicy::choose(2, 2, 4, 2).spins, crowded.spins);  // a sub-communicator of a crowded job
  EXPECT_EQ(WaitPolicy::choose(2, 2, 0, 2).spins, spin.spins);     // the launcher does not say
  EXPECT_EQ(WaitPolicy::choose(1, 1, 1, 1).spins, spin.spins);
}

TEST(ShmWaitPolicy, RanksBoundToACoreEachStillSpin) {
  // As mpirun's default binding (one core per rank up to the core count): each rank's mask is one CPU wide, and the
  // ranks together have as many CPUs as ranks, so they are not crowded.
  cpu_set_t saved, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  auto world = Communicator::world();
  CPU_ZERO(&one);
  CPU_SET(world->rank() % online, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const WaitPolicy p = WaitPolicy::for_comm(world->mpi_handle());
  sched_setaffinity(0, sizeof saved, &saved);
  EXPECT_EQ(p.spins, (world->size() <= online ? WaitPolicy::choose(1, 1, 1, 1) : WaitPolicy::choose(2, 1, 2, 1)).spins)
      << world->size() << " ranks, " << online << " CPUs";
}

// The default route sends a bcast below 512 B to shm only where the ranks have a CPU each (shm_transport.cpp): the
// communicator reads that from its shm backend's wait policy, once the first collective has made the backend.
TEST(ShmRoute, SmallBcastsTakeShmOnlyWhereEveryRankHasACpu) {
  auto c = Communicator::world({.backend = BackendKind::kAuto, .name = "auto bcast"});
  EXPECT_EQ(c->allreduce(Array::from_values<float>({1, 1}), ReduceOp::kSum).value.to_vector<float>(),
            std::vector<float>(2, static_cast<float>(c->size())));
  if (c->size() < 2 || !world_on_one_node() || c->backend_for(OpKind::kAllreduce, Device::cpu()) != BackendKind::kShm)
    GTEST_SKIP() << "no flat shm backend on this communicator";
  const bool crowded = WaitPolicy::for_comm(c->mpi_handle()).crowded;
  EXPECT_EQ(c->backend_for(OpKind::kBcast, Device::cpu()), crowded ? BackendKind::kMpi : BackendKind::kShm)
      << c->size() << " ranks, crowded " << crowded;
  for (std::int64_t n : {0, 1, 5, 127}) expect_bcast(*c, DType::kFloat32, n, c->size() - 1);
}

TEST(ShmRoute, MpiSettingNeverUsesShm) {
  auto c = Communicator::world({.backend = BackendKind::kMpi, .name = "mpi only"});
  EXPECT_EQ(c->backend_for(OpKind::kAllreduce, Device::cpu()), BackendKind::kMpi);
  Array x = Array::from_values<float>({1, 1, 1});
  EXPECT_EQ(c->allreduce(x, ReduceOp::kSum).value.to_vector<float>(),
            std::vector<float>(3, static_cast<float>(c->size())));
}

}  // namespace
}  // namespace shardkit::testing
