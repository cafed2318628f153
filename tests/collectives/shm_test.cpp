// The shm backend (CommOptions::backend = shm) against exact references: every dtype x every reduction it allows, at
// sizes 0, 1, odd, just past the inline bytes of a flag line, past the size where the reduction is split across ranks,
// and past two slots (chunked); in place and not. At 3-4 ranks on one node a smaller set of dtypes. Alltoall and
// sendrecv also past the single-copy threshold and, sendrecv, past its chunk and its inline bytes, on every ring shift
// (0: to itself). Run across hosts (multihost_collectives) the same bodies test the hierarchical path, every dtype,
// with roots that do and do not lead their node. Also: the route is shm for what it implements (across hosts: what the
// hierarchy implements). Which route the default takes, the wait policy and /dev/shm: shm_route_test.cpp.

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

std::shared_ptr<Communicator>& shm_world() {
  static std::shared_ptr<Communicator> c = [] {
    return Communicator::world({.backend = BackendKind::kShm, .name = "shm"});
  }();
  return c;
}

// Element counts for `dtype`: 0, 1, odd, past a flag line's inline bytes, a small bcast's ring lines full and past
// them, past the split size, past two slots.
std::vector<std::int64_t> shm_counts(DType dtype, bool large) {
  const auto item = static_cast<std::int64_t>(dtype_size(dtype));
  auto of = [item](std::size_t bytes) { return static_cast<std::int64_t>(bytes) / item; };
  const std::int64_t ring = of(detail::ShmSegment::kRingBcastBytes);
  std::vector<std::int64_t> c = {
      0, 1, 7, of(detail::ShmSegment::kInlineBytes) + 1, ring, ring + 1, of(detail::kShmSplitBytes) + 5};
  if (large) c.push_back(2 * of(detail::ShmSegment::kSlotBytes) + 3);
  return c;
}

class Shm : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (on_gpu()) GTEST_SKIP() << "host buffers only";
    // At 3 and 4 ranks on one node, a few dtypes: one of each size and kind that reduces differently. Across nodes
    // (the multihost tests: the hierarchical path) every dtype.
    static const DType few[] = {DType::kBool, DType::kInt8, DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                DType::kComplex128};
    if (size() >= 3 && world_on_one_node() && std::find(std::begin(few), std::end(few), dtype()) == std::end(few))
      GTEST_SKIP() << "covered at 1-2 ranks";
  }
  DType dtype() const { return GetParam(); }
  // The first and last rank, and rank 1: across nodes (ranks filling each node's slots in turn) a rank that does not
  // lead its node, whose result takes one more step in the hierarchical path.
  std::vector<int> roots() {
    std::vector<int> r = {0};
    for (int x : {1, size() - 1})
      if (x < size() && std::find(r.begin(), r.end(), x) == r.end()) r.push_back(x);
    return r;
  }
  Communicator& comm() { return *shm_world(); }
  int rank() { return comm().rank(); }
  int size() { return comm().size(); }
};

TEST_P(Shm, Allreduce) {
  for (ReduceOp op : kAllReduceOps) {
    if (!reduce_op_supports(op, dtype())) continue;
    // The sizes past a slot on two reductions: the reference is computed element by element on the host.
    const bool large = op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kLogicalXor;
    for (std::int64_t n : shm_counts(dtype(), large)) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " op=" << reduce_op_name(op));
      const Array x = input(dtype(), {n}, rank(), pattern_for(op));
      const Array want = reference(dtype(), {n}, op, 0, size() - 1);
      EXPECT_TRUE(same(comm().allreduce(x, op).value, want));
      EXPECT_TRUE(same(x, input(dtype(), {n}, rank(), pattern_for(op))));  // the input is not modified
      Array buf = x.clone();
      comm().allreduce_inplace(buf, op).wait();
      EXPECT_TRUE(same(buf, want));
    }
  }
  EXPECT_EQ(comm().backend_for(OpKind::kAllreduce, Device::cpu()), shm_route());
}

TEST_P(Shm, Reduce) {
  for (int root : roots()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kBitXor}) {
      if (!reduce_op_supports(op, dtype())) continue;
      for (std::int64_t n : shm_counts(dtype(), op == ReduceOp::kSum)) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " root=" << root << " op=" << reduce_op_name(op));
        const Array x = input(dtype(), {n}, rank(), pattern_for(op));
        const Array want = rank() == root ? reference(dtype(), {n}, op, 0, size() - 1) : x;
        EXPECT_TRUE(same(comm().reduce(x, op, root).value, want));
        Array buf = x.clone();
        comm().reduce(buf, buf, op, root).wait();
        EXPECT_TRUE(same(buf, want));
      }
    }
  }
  EXPECT_EQ(comm().backend_for(OpKind::kReduce, Device::cpu()), shm_route(OpKind::kReduce));
}

TEST_P(Shm, Bcast) {
  for (int root : roots()) {
    for (std::int64_t n : shm_counts(dtype(), true)) expect_bcast(comm(), dtype(), n, root);
  }
  EXPECT_EQ(comm().backend_for(OpKind::kBcast, Device::cpu()), shm_route(OpKind::kBcast));
}

// A bcast's (and a scatter's) root returns without waiting for the readers, and runs up to two bcasts ahead of them
// (small ones, which fit a flag line: a ring ahead, the next test): runs of
// back-to-back bcasts from one root (which could run ahead of a slow reader and overwrite what it has not read yet),
// roots changing between runs, sizes alternating between a flag line's inline bytes and a slot (n 0: alternating,
// with the last rank late for every bcast it does not send), and now and then an operation whose parts every rank
// writes, must still read what was sent (float32 only, a dtype the fixture runs at 1-4 ranks: the rule is the same for
// every dtype). Without the wait for the bcast two back, the late rank reads a later bcast's value (seen at 2-4 ranks).
TEST_P(Shm, BcastsBackToBackWithOtherOperations) {
  if (dtype() != DType::kFloat32) GTEST_SKIP() << "one dtype is enough";
  for (std::int64_t n : {std::int64_t{3}, (std::int64_t{64} << 10) / 4, std::int64_t{0}}) {
    for (int i = 0; i < 48; ++i) {
      const auto count = static_cast<std::size_t>(n != 0 ? n : i % 2 == 0 ? 3 : 1000);
      const int root = (i / 8) % size();
      if (n == 0 && rank() == size() - 1 && rank() != root) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const auto sent = static_cast<float>(i * 10 + root);
      Array x = Array::from_values<float>(std::vector<float>(count, rank() == root ? sent : -1.0f));
      comm().bcast_inplace(x, root).wait();
      EXPECT_EQ(x.to_vector<float>(), std::vector<float>(count, sent)) << "i=" << i;
      // A scatter is one-way from its root too: row p of the root's input to rank p.
      std::vector<float> rows;
      for (int p = 0; p < size(); ++p) rows.insert(rows.end(), count, sent + 0.25f * static_cast<float>(p));
      const Array all =
          Array::from_values<float>(std::span<const float>(rows), {size(), static_cast<std::int64_t>(count)});
      Array piece = Array::zeros({static_cast<std::int64_t>(count)}, DType::kFloat32);
      comm().scatter(rank() == root ? all : Array::zeros(all.shape(), DType::kFloat32), piece, root).wait();
      EXPECT_EQ(piece.to_vector<float>(), std::vector<float>(count, sent + 0.25f * static_cast<float>(rank())))
          << "i=" << i;
      if (i % 8 == 7) {
        const Array mine = Array::from_values<float>(std::vector<float>(count, static_cast<float>(rank() + i)));
        const Array y = comm().allreduce(mine, ReduceOp::kSum).value;
        const auto want = static_cast<float>(size() * (size() - 1) / 2 + size() * i);
        EXPECT_EQ(y.to_vector<float>(), std::vector<float>(count, want)) << "i=" << i;
      }
    }
  }
}

// Small bcasts go through each root's ring of flag lines, and a root waits only before writing a line again, until
// every rank has read that line's last bcast: here the last rank comes late (a sleep before its first bcast, and
// shorter ones now and then after it), and the root sends three rings' worth of distinct values, with the root
// changing every fifth bcast (a line's last use was another root's), sizes 0 to 144 bytes (up to three lines a bcast);
// every rank must read every value in order. Without that wait, or with a root that takes a reader to have read more
// than it has, the late rank reads a later bcast's value. float32, 1-4 ranks.
TEST_P(Shm, SmallBcastsRunAWholeRingAheadOfALateReader) {
  if (dtype() != DType::kFloat32) GTEST_SKIP() << "one dtype is enough";
  constexpr int kLines = detail::ShmSegment::kRingLines;
  for (int round = 0; round < 2; ++round) {
    if (rank() == size() - 1 && size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int i = 0; i < 3 * kLines; ++i) {
      const int root = round == 0 ? 0 : (i / 5) % size();
      if (rank() == size() - 1 && rank() != root && i % 7 == 3)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const auto count = static_cast<std::size_t>((5 * i) % (detail::ShmSegment::kRingBcastBytes / 4 + 1));
      const auto sent = static_cast<float>(1000 * round + 10 * i + root);
      Array x = Array::from_values<float>(std::vector<float>(count, rank() == root ? sent : -1.0f));
      comm().bcast_inplace(x, root).wait();
      EXPECT_EQ(x.to_vector<float>(), std::vector<float>(count, sent)) << "round=" << round << " i=" << i;
    }
  }
}

// A reduce up to the split size, and a gather, are one-way: the other ranks post their parts and return without
// waiting for the root, which reads them when it comes; they wait only before writing that buffer set again. Here the
// root comes late (a sleep before each run), the others send runs of distinct parts (a reduce and a gather each time),
// the root changes between runs, sizes alternate between a flag line's inline bytes and a slot (and past the split
// size, a reduce's handshake every rank waits for), and bcasts and scatters (one-way the other way) and allreduces
// come in between: the root must get every exact sum and block. Without the wait for the set's last use, the late
// root folds or copies a later operation's part (float32, 1-4 ranks).
TEST_P(Shm, ReducesAndGathersRunAheadOfALateRoot) {
  if (dtype() != DType::kFloat32) GTEST_SKIP() << "one dtype is enough";
  const std::int64_t split = static_cast<std::int64_t>(detail::kShmSplitBytes) / 4;
  const int n = size();
  for (int i = 0; i < 60; ++i) {
    const int root = (i / 10) % n;
    if (i % 10 == 0 && rank() == root && n > 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::int64_t count = i % 3 == 0 ? 5 : i % 3 == 1 ? split : split + 7;
    const Array mine = Array::from_values<float>(
        std::vector<float>(static_cast<std::size_t>(count), static_cast<float>(100 * i + rank())));
    Array out = Array::from_values<float>(std::vector<float>(static_cast<std::size_t>(count), -1.0f));
    comm().reduce(mine, out, ReduceOp::kSum, root).wait();
    if (rank() == root) {
      EXPECT_EQ(out.to_vector<float>(),
                std::vector<float>(static_cast<std::size_t>(count), static_cast<float>(100 * i * n + n * (n - 1) / 2)))
          << "i=" << i;
    }
    Array all = Array::zeros({n, count}, DType::kFloat32);
    comm().gather(mine, all, root).wait();
    if (rank() == root) {
      for (int p = 0; p < n; ++p) {
        EXPECT_EQ(all.slice(0, p, p + 1).to_vector<float>(),
                  std::vector<float>(static_cast<std::size_t>(count), static_cast<float>(100 * i + p)))
            << "i=" << i << " p=" << p;
      }
    }
    if (i % 7 == 6) {
      Array b = Array::from_values<float>(std::vector<float>(3, rank() == root ? static_cast<float>(i) : -1.0f));
      comm().bcast_inplace(b, root).wait();
      EXPECT_EQ(b.to_vector<float>(), std::vector<float>(3, static_cast<float>(i))) << "i=" << i;
      Array piece = Array::zeros({count}, DType::kFloat32);
      comm().scatter(rank() == root ? all : Array::zeros({n, count}, DType::kFloat32), piece, root).wait();
      EXPECT_EQ(piece.to_vector<float>(),
                std::vector<float>(static_cast<std::size_t>(count), static_cast<float>(100 * i + rank())))
          << "i=" << i;
    }
    if (i % 11 == 10) {
      const Array y = comm().allreduce(mine, ReduceOp::kSum).value;
      EXPECT_EQ(y.to_vector<float>(),
                std::vector<float>(static_cast<std::size_t>(count), static_cast<float>(100 * i * n + n * (n - 1) / 2)))
          << "i=" << i;
    }
  }
}

// A large bcast's root (single copy: it waits until every reader has read its buffer) may still wait while the ranks
// that did read go on: here the last rank sends the next two small bcasts, and writes the large one's set again with
// another size before rank 1, late, lets the root go. The root must not take that for a mismatch, and every value
// must arrive (float32, 3 ranks and more; at 1-2 ranks the same bcasts run, without the interleaving).
TEST_P(Shm, TwoSmallBcastsFromAnotherRootAfterALargeOne) {
  if (dtype() != DType::kFloat32) GTEST_SKIP() << "one dtype is enough";
  const auto large = static_cast<std::size_t>(2 * detail::kCmaBcastBytes / 4);
  const int other = size() - 1;
  for (int i = 0; i < 20; ++i) {
    Array big = Array::from_values<float>(std::vector<float>(large, rank() == 0 ? static_cast<float>(i) : -1.0f));
    if (rank() == 1 && size() > 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    comm().bcast_inplace(big, 0).wait();
    EXPECT_EQ(big.to_vector<float>(), std::vector<float>(large, static_cast<float>(i))) << "i=" << i;
    for (int k = 0; k < 2; ++k) {
      const auto sent = static_cast<float>(100 * i + k);
      Array small = Array::from_values<float>(std::vector<float>(3, rank() == other ? sent : -1.0f));
      comm().bcast_inplace(small, other).wait();
      EXPECT_EQ(small.to_vector<float>(), std::vector<float>(3, sent)) << "i=" << i << " k=" << k;
    }
  }
}

// A large allreduce (single copy) reads every rank's share of the inputs from that rank's input and writes its share of
// the result into every output: a rank returns only once every other rank is done with both of its buffers. Here
// every rank checks its output as soon as the call returns (without the last handshake, the others' shares may not be
// there yet), and then rank 0 overwrites its input and output, which must not reach the others' sums (the others may
// still be reading its input, in place its output). float32 at 1-4 ranks, in place and not.
TEST_P(Shm, LargeAllreduceKeepsEachBufferUntilAllAreDone) {
  if (dtype() != DType::kFloat32) GTEST_SKIP() << "one dtype is enough";
  const auto n = static_cast<std::int64_t>(2 * detail::kCmaReduceBytes / 4 + 3);
  for (int i = 0; i < 24; ++i) {
    const bool in_place = i % 2 == 1;
    Array x = Array::from_values<float>(std::vector<float>(n, static_cast<float>(rank() + i)));
    Array out = in_place ? x : Array::empty({n}, DType::kFloat32);
    comm().allreduce(x, out, ReduceOp::kSum).wait();
    const auto want = static_cast<float>(size() * (size() - 1) / 2 + size() * i);
    const auto got = out.to_vector<float>();
    EXPECT_EQ(std::count(got.begin(), got.end(), want), n) << "i=" << i << (in_place ? " in place" : "");
    if (rank() == 0) {
      std::memset(x.data(), 0xff, x.nbytes());  // NaN
      std::memset(out.data(), 0xff, out.nbytes());
    }
  }
}

TEST_P(Shm, Allgather) {
  for (std::int64_t n : shm_counts(dtype(), true)) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const Array x = input(dtype(), {n}, rank(), Pattern::kData);
    Array want = Array::empty({size(), n}, dtype());
    for (int r = 0; r < size(); ++r) want.slice(0, r, r + 1).copy_from(input(dtype(), {1, n}, r, Pattern::kData));
    auto [y, token] = comm().allgather(x);
    EXPECT_EQ(y.shape(), (Shape{size(), n}));
    EXPECT_TRUE(same(y, want));
  }
  EXPECT_EQ(comm().backend_for(OpKind::kAllgather, Device::cpu()), shm_route(OpKind::kAllgather));
}

TEST_P(Shm, ReduceScatter) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kLogicalOr}) {
    if (!reduce_op_supports(op, dtype())) continue;
    for (std::int64_t n : shm_counts(dtype(), op == ReduceOp::kSum)) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " op=" << reduce_op_name(op));
      // Block b of the input is elements [b*n, (b+1)*n) of the pattern; this rank gets its own block reduced.
      const Array x = input(dtype(), {size() * n}, rank(), pattern_for(op));
      const Array want = reference(dtype(), {n}, op, 0, size() - 1, rank() * n);
      Array y = Array::empty({n}, dtype());
      comm().reduce_scatter(x, y, op).wait();
      EXPECT_TRUE(same(y, want));
    }
  }
  EXPECT_EQ(comm().backend_for(OpKind::kReduceScatter, Device::cpu()), shm_route(OpKind::kReduceScatter));
}

// Counts for the operations that move data only: shm_counts, and past the single-copy thresholds (8 KiB: alltoall's
// block and a roomy allgather's part, a message of three ring entries; 16 KiB: bcast's and sendrecv's; a crowded
// allgather's), past a point-to-point message's inline bytes, and half a slot and more (a message around its ring many
// times).
std::vector<std::int64_t> movement_counts(DType dtype) {
  const auto item = static_cast<std::int64_t>(dtype_size(dtype));
  std::vector<std::int64_t> c = shm_counts(dtype, true);
  for (std::size_t bytes :
       {std::size_t{8} << 10, detail::ShmP2p::kInlineBytes + 1, detail::ShmP2p::kSingleCopyBytes + 1,
        detail::kCmaCrowdedGatherBytes + 1, detail::ShmSegment::kSlotBytes / 2 + 1,
        3 * detail::ShmSegment::kSlotBytes / 2 + 5})
    c.push_back(static_cast<std::int64_t>(bytes) / item + 1);
  return c;
}

TEST_P(Shm, Alltoall) {
  for (std::int64_t n : movement_counts(dtype())) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    // Row b of rank r's input goes to rank b: this rank's row p is row rank() of rank p's input.
    const Shape shape{size(), n};
    const Array x = input(dtype(), shape, rank(), Pattern::kData);
    Array want = Array::empty(shape, dtype());
    for (int p = 0; p < size(); ++p)
      want.slice(0, p, p + 1).copy_from(input(dtype(), shape, p, Pattern::kData).slice(0, rank(), rank() + 1));
    EXPECT_TRUE(same(comm().alltoall(x).value, want));
    EXPECT_TRUE(same(x, input(dtype(), shape, rank(), Pattern::kData)));  // the input is not modified
    Array buf = x.clone();
    comm().alltoall(buf, buf).wait();
    EXPECT_TRUE(same(buf, want));
  }
  EXPECT_EQ(comm().backend_for(OpKind::kAlltoall, Device::cpu()), shm_route(OpKind::kAlltoall));
}

// Gather (one-way toward the root) and scatter (one-way from it), buffer and value forms, every root of roots(): the
// root gets every block in rank order, the others' receive buffers are not touched (gather), and each rank gets its
// own block (scatter), at shm_counts (inline, slot, past two slots). Across hosts they take MPI (the hierarchical
// backend has neither): one dtype checks that route.
TEST_P(Shm, GatherAndScatter) {
  if (!world_on_one_node() && dtype() != DType::kFloat32) GTEST_SKIP() << "MPI across hosts: one dtype is enough";
  for (int root : roots()) {
    for (std::int64_t n : shm_counts(dtype(), true)) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " root=" << root);
      const Array x = input(dtype(), {n}, rank(), Pattern::kData);
      Array want = Array::empty({size(), n}, dtype());
      for (int r = 0; r < size(); ++r) want.slice(0, r, r + 1).copy_from(input(dtype(), {1, n}, r, Pattern::kData));
      Array y = Array::zeros({size(), n}, dtype());
      comm().gather(x, y, root).wait();
      EXPECT_TRUE(same(y, rank() == root ? want : Array::zeros({size(), n}, dtype())));
      const Array value = comm().gather(x, root).value;
      EXPECT_TRUE(same(value, rank() == root ? want : x));

      // Scatter from the root: rank r gets row r of the root's input.
      const Array rows = input(dtype(), {size(), n}, root, Pattern::kData);
      const Array mine = rows.slice(0, rank(), rank() + 1).contiguous().reshape({n});
      Array got = Array::zeros({n}, dtype());
      comm().scatter(rank() == root ? rows : Array::zeros({size(), n}, dtype()), got, root).wait();
      EXPECT_TRUE(same(got, mine));
      EXPECT_TRUE(same(comm().scatter(rank() == root ? rows : Array::zeros({n}, dtype()), root).value, mine));
    }
  }
  for (OpKind op : {OpKind::kGather, OpKind::kScatter})
    EXPECT_EQ(comm().backend_for(op, Device::cpu()), shm_route(op)) << op_name(op);
}

TEST_P(Shm, SendrecvOnEveryRingShift) {
  EXPECT_EQ(comm().backend_for(OpKind::kSendrecv, Device::cpu()), shm_route(OpKind::kSendrecv));
  for (int shift = 0; shift < size(); ++shift) {
    const int dest = (rank() + shift) % size(), source = (rank() + size() - shift) % size();
    for (std::int64_t n : movement_counts(dtype())) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " shift=" << shift);
      const Array x = input(dtype(), {n}, rank(), Pattern::kData);
      const Array want = input(dtype(), {n}, source, Pattern::kData);
      RecvStatus st;
      Array y = Array::empty({n}, dtype());
      comm().sendrecv_into(x, dest, y, source, /*send_tag=*/7, /*recv_tag=*/7, &st).wait();
      EXPECT_TRUE(same(y, want));
      EXPECT_EQ(st.source, source);
      EXPECT_EQ(st.tag, 7);
      EXPECT_EQ(st.count, n);
      // A receive buffer larger than the message, any tag: the message fills its start; the status says how much.
      Array z = Array::zeros({n + 3}, dtype());
      comm().sendrecv_into(x, dest, z, source, /*send_tag=*/3 + rank(), kAnyTag, &st).wait();
      EXPECT_TRUE(same(z.slice(0, 0, n), want));
      EXPECT_EQ(st.tag, 3 + source);
      EXPECT_EQ(st.count, n);
      // In place.
      Array buf = x.clone();
      comm().sendrecv_into(buf, dest, buf, source).wait();
      EXPECT_TRUE(same(buf, want));
    }
  }
}

// Collectives and sendrecvs interleaved: their channels are apart, and a sendrecv's sender returns before its message
// is taken.
TEST_P(Shm, SendrecvBesideCollectives) {
  // One dtype is enough (the messages are int32 whatever the parameter): one that every rank count runs (SetUp).
  if (dtype() != DType::kFloat32) GTEST_SKIP() << "one dtype is enough";
  auto filled = [](std::int64_t n, int v) {
    return Array::from_values<std::int32_t>(std::vector<std::int32_t>(static_cast<std::size_t>(n), v));
  };
  const int right = (rank() + 1) % size(), left = (rank() + size() - 1) % size();
  for (std::int64_t n : {std::int64_t{5}, std::int64_t{300000}}) {
    for (int i = 0; i < 20; ++i) {
      const Array x = filled(n, rank() * 100 + i);
      Array y = Array::empty({n}, DType::kInt32);
      comm().sendrecv_into(x, right, y, left, 0, 0).wait();
      EXPECT_TRUE(same(y, filled(n, left * 100 + i))) << "i=" << i;
      if (i % 3 == 0) {
        const Array s = comm().allreduce(x, ReduceOp::kSum).value;
        EXPECT_TRUE(same(s, filled(n, 100 * size() * (size() - 1) / 2 + size() * i)));
      }
      if (i % 5 == 0) comm().barrier().wait();
    }
  }
  EXPECT_EQ(comm().backend_for(OpKind::kBarrier, Device::cpu()), shm_route(OpKind::kBarrier));
}

// On shm a sendrecv pairs with the peer's sendrecv: one that sends more than the peer takes, or with another tag, is
// named on the receiving rank (and the communicator is aborted), rather than read in part.
TEST(ShmSendrecv, AMessageLargerThanTheReceiveBufferIsNamed) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  auto c =
      Communicator::world({.backend = BackendKind::kShm, .timeout = std::chrono::seconds(20), .name = "shm mismatch"});
  if (c->size() < 2 || c->backend_for(OpKind::kSendrecv, Device::cpu()) != BackendKind::kShm)
    GTEST_SKIP() << "needs 2 ranks on shm";
  const int right = (c->rank() + 1) % c->size(), left = (c->rank() + c->size() - 1) % c->size();
  const Array x = Array::zeros({c->rank() == 0 ? 9 : 4}, DType::kFloat32);  // rank 0 sends 9 to rank 1, which takes 4
  Array y = Array::empty({4}, DType::kFloat32);
  if (c->rank() == 1) {
    try {
      c->sendrecv_into(x, right, y, left, 0, 0).wait();
      ADD_FAILURE() << "no error";
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 sent 36 bytes of float32 with tag 0, rank 1 expected at most 16 "
                                           "bytes of float32"),
                std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(c->aborted());
  } else {
    c->sendrecv_into(x, right, y, left, 0, 0).wait();  // its message was posted: rank 1 has seen it
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, Shm, ::testing::ValuesIn(kAllDTypes), dtype_param_name);

}  // namespace
}  // namespace shardkit::testing
