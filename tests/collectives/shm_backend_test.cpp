// The shm backend made directly (not through a communicator), where every rank has a CPU: the single-copy allreduce
// and bcast, step counters past 2^31 (their waits for late readers and roots), and the named segments in /dev/shm.
// Through communicators, every operation and dtype: shm_test.cpp.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "backend.hpp"
#include "collective_test_util.hpp"
#include "backends/shm/shm_cma.hpp"
#include "backends/shm/shm_p2p.hpp"
#include "backends/shm/shm_segment.hpp"
#include "backends/shm/shm_steps.hpp"
#include "shm_files.hpp"
#include "backends/shm/shm_backend.hpp"

namespace shardkit::testing {
namespace {

using detail::WaitPolicy;

// A shm backend told that every rank has a CPU (this machine may have fewer CPUs than ranks), which takes the
// single-copy paths kept for that case: made by open(), which leaves it null (the test skipped) where they cannot run,
// its steps starting from `first_step` and its ring line uses from `ring_use` (0, as every backend's; a test hook).
// `run` runs one call on it.
struct RoomyBackend {
  std::shared_ptr<Communicator> world = Communicator::world();
  std::unique_ptr<detail::Backend> backend;

  void open(std::uint32_t first_step = 0, std::uint64_t ring_use = 0) {
    if (on_gpu()) GTEST_SKIP() << "host buffers only";  // the helpers make device arrays there
    if (world->size() < 2 || !world_on_one_node()) GTEST_SKIP() << "single copy needs 2 ranks or more on one node";
    if (!detail::probe_cma(world->mpi_handle(), world->options().shm_single_copy).usable)
      GTEST_SKIP() << "the kernel refuses process_vm_readv here";
    static const WaitPolicy roomy = WaitPolicy::choose(1, 1, 1, 1);
    ASSERT_FALSE(roomy.crowded);
    world->barrier().wait();  // every rank has arrived: the backend's making blocks
    std::string why;
    detail::shm_first_step_for_tests(first_step, ring_use);
    backend = detail::make_shm_backend(world->mpi_handle(), std::make_shared<detail::AbortState>(), &why, {}, &roomy);
    detail::shm_first_step_for_tests(0, 0);
    ASSERT_TRUE(backend) << why;
  }
  void run(OpKind op, const Array* send, Array* recv, const OpArgs& args) {
    static const std::string name = "single copy";
    const Token none;
    auto ctx = detail::OpContext::for_step(op, "a test's operation", name, std::chrono::seconds(60));
    ctx.after = &none;
    backend->run(detail::BackendCall{op, send, recv, &args}, ctx);
  }
  // An allreduce (sum) of `count` float32 elements through it, checked.
  void check_sum(std::int64_t count) {
    SCOPED_TRACE(::testing::Message() << "allreduce count=" << count);
    const Array x = input(DType::kFloat32, {count}, world->rank(), pattern_for(ReduceOp::kSum));
    Array out = Array::empty({count}, DType::kFloat32);
    OpArgs args;
    args.reduce = ReduceOp::kSum;
    run(OpKind::kAllreduce, &x, &out, args);
    EXPECT_TRUE(same(out, reference(DType::kFloat32, {count}, ReduceOp::kSum, 0, world->size() - 1)));
  }
};

// The single-copy allreduce runs only where every rank has a CPU; there it must give the exact sums at 2-4 ranks:
// dtypes of each width, counts that the ranks do not share evenly, from just past the threshold to shares of several
// 128 KiB pieces, in place and not.
TEST(ShmBackend, SingleCopyAllreduceWhereEveryRankHasACpu) {
  RoomyBackend b;
  b.open();
  if (!b.backend) return;
  for (DType dtype : {DType::kInt8, DType::kBFloat16, DType::kFloat32, DType::kComplex128}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      if (!reduce_op_supports(op, dtype)) continue;
      for (const std::size_t bytes : {detail::kCmaReduceBytes * 3 / 2, std::size_t{1} << 20}) {
        const auto n = static_cast<std::int64_t>(bytes / dtype_size(dtype)) + 7;
        const Array want = reference(dtype, {n}, op, 0, b.world->size() - 1);
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << reduce_op_name(op) << " n=" << n
                                            << " in place " << in_place);
          const Array x = input(dtype, {n}, b.world->rank(), pattern_for(op));
          Array buf = x.clone();
          Array out = in_place ? buf : Array::empty({n}, dtype);
          OpArgs args;
          args.reduce = op;
          b.run(OpKind::kAllreduce, &buf, &out, args);
          EXPECT_TRUE(same(out, want));
          if (!in_place) {
            EXPECT_TRUE(same(buf, x));  // the input is not modified
          }
        }
      }
    }
  }
}

// Where every rank has a CPU a large bcast's root writes the head of the others' buffers while they read the rest: at
// 2-4 ranks, from every root, sizes whose bytes the ranks do not share evenly (the head ends inside an element) from
// the threshold up, back to back with small bcasts from the segment's ring (one-way: the root runs ahead).
TEST(ShmBackend, SharedBcastWhereEveryRankHasACpu) {
  RoomyBackend b;
  b.open();
  if (!b.backend) return;
  const int n = b.world->size(), me = b.world->rank();
  for (DType dtype : {DType::kInt8, DType::kFloat64}) {
    const auto item = static_cast<std::int64_t>(dtype_size(dtype));
    for (const std::int64_t count : {static_cast<std::int64_t>(detail::kCmaBcastBytes) / item,
                                     static_cast<std::int64_t>(detail::kCmaBcastBytes) / item + 7,
                                     (std::int64_t{1} << 20) / item + 3}) {
      for (int root = 0; root < n; ++root) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " count=" << count << " root=" << root);
        Array buf = input(dtype, {count}, me, Pattern::kData);
        OpArgs args;
        args.root = root;
        b.run(OpKind::kBcast, me == root ? &buf : nullptr, me == root ? nullptr : &buf, args);
        EXPECT_TRUE(same(buf, input(dtype, {count}, root, Pattern::kData)));
        Array small = input(dtype, {3}, me, Pattern::kData);
        b.run(OpKind::kBcast, me == root ? &small : nullptr, me == root ? nullptr : &small, args);
        EXPECT_TRUE(same(small, input(dtype, {3}, root, Pattern::kData)));
      }
    }
  }
}

// Steps are 32 bits and wrap, and a line never posted holds 0, which every step past 2^31 had "reached": a reader of a
// root's first small bcast took the ring line for posted without waiting for the root (a MismatchError naming 0 bytes;
// where the line had been posted with the reader's size, the old bytes), and a reader of a bcast through a buffer set
// took the root's unused ring line for a post there and raised MismatchError. Here the steps start just
// short of 2^31 (a test hook), as if after 2^31 operations: two allreduces post every rank's line of both buffer sets
// (as any long run has), and past 2^31 each root in turn comes late (a sleep before it sends) to bcasts through the
// ring (one line and three), a buffer set and the single copy; every rank must get the root's values, and the sums of
// the allreduces around them. 2-4 ranks.
TEST(ShmBackend, BcastsPastTwoToThe31StepsWaitForTheRoot) {
  RoomyBackend b;
  b.open(0x80000000U - 3);
  if (!b.backend) return;
  const int n = b.world->size(), me = b.world->rank();
  b.check_sum(3);
  b.check_sum(1000);
  const auto ring = static_cast<std::int64_t>(detail::ShmSegment::kRingBcastBytes / 4);
  const auto cma = static_cast<std::int64_t>(detail::kCmaBcastBytes / 4);
  for (int root = 0; root < n; ++root) {
    for (const std::int64_t count : {std::int64_t{2}, ring, ring + 1, cma + 1}) {
      SCOPED_TRACE(::testing::Message() << "count=" << count << " root=" << root);
      Array buf = input(DType::kFloat32, {count}, me, Pattern::kData);
      if (me == root) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      OpArgs args;
      args.root = root;
      b.run(OpKind::kBcast, me == root ? &buf : nullptr, me == root ? nullptr : &buf, args);
      EXPECT_TRUE(same(buf, input(DType::kFloat32, {count}, root, Pattern::kData)));
    }
  }
  b.check_sum(3);
  b.check_sum(2 * cma);
}

// A ring line's root waits, before it writes the line again, until every reader of its last use has read it. It
// remembered each reader's count of ring lines read from 0, and compared counts in 32 bits: once the ring uses passed
// 2^31, a count of 0 had "reached" every use, and a root took readers that had read nothing as done and overwrote
// their lines (a late reader then waited for a step the line no longer held). Here the ring uses start just short of
// 2^31 (a test hook): each root in turn sends more small bcasts than the ring holds (one line and three each) while
// one reader comes late; every reader must get every value. 2-4 ranks.
TEST(ShmBackend, SmallBcastsPastTwoToThe31RingUsesWaitForLateReaders) {
  RoomyBackend b;
  b.open(0, 0x80000000ULL - 5);
  if (!b.backend) return;
  const int n = b.world->size(), me = b.world->rank();
  const auto three = static_cast<std::int64_t>(detail::ShmSegment::kRingBcastBytes / 4);
  for (int root = 0; root < n; ++root) {
    const int late = (root + 1) % n;
    if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    for (int i = 0; i < detail::ShmSegment::kRingLines + 5; ++i) {
      const std::int64_t count = i % 2 ? three : 2;
      SCOPED_TRACE(::testing::Message() << "root=" << root << " i=" << i << " count=" << count);
      Array buf = input(DType::kFloat32, {count}, me == root ? 100 * root + i : -1, Pattern::kData);
      OpArgs args;
      args.root = root;
      b.run(OpKind::kBcast, me == root ? &buf : nullptr, me == root ? nullptr : &buf, args);
      EXPECT_TRUE(same(buf, input(DType::kFloat32, {count}, 100 * root + i, Pattern::kData)));
    }
  }
}

// The lines of the buffer sets are posted at every use of their set, and small bcasts use none: past 2^31 steps of
// small bcasts alone, a line last posted before them (or never: 0) had "reached" every step, and the next operation
// on a set read a rank's part before that rank wrote it (a MismatchError naming 0 bytes, or its old bytes). Here the
// steps start past 2^31 with every line still 0 (a test hook): each rank in turn comes late to an allreduce (in the
// line, and in a slot), an allgather, a one-way reduce and a bcast through a set; every rank gets every result.
TEST(ShmBackend, SetLinesUnpostedFor2To31StepsAreWaitedFor) {
  RoomyBackend b;
  b.open(0x80000000U + 7);
  if (!b.backend) return;
  const int n = b.world->size(), me = b.world->rank();
  for (int late = 0; late < n; ++late) {
    for (const std::int64_t count : {std::int64_t{3}, std::int64_t{1000}}) {
      SCOPED_TRACE(::testing::Message() << "late=" << late << " count=" << count);
      if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      b.check_sum(count);
      if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const Array mine = input(DType::kFloat32, {count}, me, Pattern::kData);
      Array all = Array::empty({n * count}, DType::kFloat32);
      b.run(OpKind::kAllgather, &mine, &all, {});
      for (int r = 0; r < n; ++r)
        EXPECT_TRUE(same(all.slice(0, r * count, (r + 1) * count), input(DType::kFloat32, {count}, r, Pattern::kData)));
      if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const Array x = input(DType::kFloat32, {count}, me, pattern_for(ReduceOp::kSum));
      OpArgs sum;
      sum.reduce = ReduceOp::kSum;
      sum.root = late;
      Array reduced = Array::empty({count}, DType::kFloat32);
      b.run(OpKind::kReduce, &x, me == late ? &reduced : nullptr, sum);
      if (me == late) {
        EXPECT_TRUE(same(reduced, reference(DType::kFloat32, {count}, ReduceOp::kSum, 0, n - 1)));
      }
      if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      Array buf = input(DType::kFloat32, {count * 100}, me, Pattern::kData);
      OpArgs from;
      from.root = late;
      b.run(OpKind::kBcast, me == late ? &buf : nullptr, me == late ? nullptr : &buf, from);
      EXPECT_TRUE(same(buf, input(DType::kFloat32, {count * 100}, late, Pattern::kData)));
    }
  }
}

// Where a rank cannot open rank 0's unnamed file through /proc, the segment is a file in /dev/shm (a test hook takes
// that way here), unlinked once every rank has mapped it; one that a killed job left (its maker's process gone) is
// removed by the next segment made on the node, and one of a live process is not (nor one made in the last seconds).
// 1-4 ranks.
TEST(ShmBackend, NamedSegmentsLeaveNothingAndSweepWhatKilledJobsLeft) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  auto world = Communicator::world();
  if (!world_on_one_node()) GTEST_SKIP() << "one node's /dev/shm";
  std::string orphan, alive;
  if (world->rank() == 0) {
    const pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, nullptr, 0);  // a process id that no process has now
    orphan = "/shardkit-" + std::to_string(child) + "-0-0";
    alive = "/shardkit-" + std::to_string(getpid()) + "-99999-0";
    for (const std::string& name : {orphan, alive}) {
      const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
      ASSERT_GE(fd, 0) << name;
      const timespec an_hour_ago[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
      futimens(fd, an_hour_ago);  // the sweep leaves files made moments ago alone
      close(fd);
    }
  }
  world->barrier().wait();
  detail::shm_segment_hooks_for_tests(true, nullptr);
  std::string why;
  auto backend = detail::make_shm_backend(world->mpi_handle(), std::make_shared<detail::AbortState>(), &why);
  detail::shm_segment_hooks_for_tests(false, nullptr);
  EXPECT_TRUE(backend) << why;
  if (world->rank() == 0) {
    EXPECT_EQ(access(("/dev/shm" + orphan).c_str(), F_OK), -1) << orphan << " was not swept";
    EXPECT_EQ(access(("/dev/shm" + alive).c_str(), F_OK), 0) << alive << " (a live process's) was swept";
    shm_unlink(alive.c_str());
    EXPECT_EQ(own_shm_segments(), 0);  // the named segment itself was unlinked once every rank had mapped it
  }
  if (backend) {  // and it works: a sum through it
    const Array x = input(DType::kInt32, {5}, world->rank(), pattern_for(ReduceOp::kSum));
    Array out = Array::empty({5}, DType::kInt32);
    OpArgs args;
    args.reduce = ReduceOp::kSum;
    const Token none;
    static const std::string name = "named segment";
    auto ctx = detail::OpContext::for_step(OpKind::kAllreduce, "a test's operation", name, std::chrono::seconds(60));
    ctx.after = &none;
    backend->run(detail::BackendCall{OpKind::kAllreduce, &x, &out, &args}, ctx);
    EXPECT_TRUE(same(out, reference(DType::kInt32, {5}, ReduceOp::kSum, 0, world->size() - 1)));
  }
}

}  // namespace
}  // namespace shardkit::testing
