// Every operation x every dtype x element counts 0, 1, 7 and 1000003, with exact expected values. The same bodies
// run on host buffers (MPI backend) and, with SHARDKIT_TEST_BUFFERS=cuda, on GPU buffers (NCCL backend).

#include <chrono>
#include <limits>
#include <thread>
#include <type_traits>

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

class Ops : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU(); }
  DType dtype() const { return GetParam(); }
  Communicator& comm() { return *world(); }
  int rank() { return comm().rank(); }
  int size() { return comm().size(); }
  std::vector<int> roots() { return size() == 1 ? std::vector<int>{0} : std::vector<int>{0, size() - 1}; }
};

// Concatenation of arrays along dimension 0 (host).
Array concat_rows(const std::vector<Array>& parts, DType dtype) {
  std::int64_t n = 0;
  for (const auto& p : parts) n += p.numel();
  Array out = Array::empty({n}, dtype);
  std::int64_t off = 0;
  for (const auto& p : parts) {
    Array dst = out.slice(0, off, off + p.numel());
    dst.copy_from(p.reshape({p.numel()}));
    off += p.numel();
  }
  return out;
}

TEST_P(Ops, Allreduce) {
  for (std::int64_t n : counts()) {
    for (ReduceOp op : kAllReduceOps) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " op=" << reduce_op_name(op));
      Array x = input(dtype(), {n}, rank(), pattern_for(op));
      if (!backend_supports(op, dtype())) {
        EXPECT_THROW(comm().allreduce(x, op), InvalidArgument);
        continue;
      }
      const Array want = reference(dtype(), {n}, op, 0, size() - 1);
      auto [y, token] = comm().allreduce(x, op);
      token.wait();
      EXPECT_TRUE(same(y, want));
      EXPECT_TRUE(same(x, input(dtype(), {n}, rank(), pattern_for(op))));  // the input is not modified
      Array buf = x.clone();
      comm().allreduce_inplace(buf, op).wait();
      EXPECT_TRUE(same(buf, want));
    }
  }
}

TEST_P(Ops, Reduce) {
  for (std::int64_t n : counts()) {
    for (int root : roots()) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kBitOr}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " root=" << root << " op=" << reduce_op_name(op));
        Array x = input(dtype(), {n}, rank(), pattern_for(op));
        if (!backend_supports(op, dtype())) {
          EXPECT_THROW(comm().reduce(x, op, root), InvalidArgument);
          continue;
        }
        auto [y, token] = comm().reduce(x, op, root);
        if (rank() == root)
          EXPECT_TRUE(same(y, reference(dtype(), {n}, op, 0, size() - 1)));
        else
          EXPECT_TRUE(same(y, x));  // mpi4jax rule: unchanged input elsewhere
        // In place on the root.
        Array buf = x.clone();
        comm().reduce(buf, buf, op, root).wait();
        EXPECT_TRUE(same(buf, rank() == root ? reference(dtype(), {n}, op, 0, size() - 1) : x));
      }
    }
  }
}

TEST_P(Ops, Bcast) {
  for (std::int64_t n : counts()) {
    for (int root : roots()) expect_bcast(comm(), dtype(), n, root);
  }
}

TEST_P(Ops, Allgather) {
  for (std::int64_t n : counts()) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const Array x = input(dtype(), {n}, rank(), Pattern::kData);
    std::vector<Array> parts;
    for (int r = 0; r < size(); ++r) parts.push_back(input(dtype(), {n}, r, Pattern::kData, Device::cpu()));
    auto [y, token] = comm().allgather(x);
    EXPECT_EQ(y.shape(), (Shape{size(), n}));
    EXPECT_TRUE(same(y, concat_rows(parts, dtype())));
  }
}

TEST_P(Ops, Gather) {
  for (std::int64_t n : counts()) {
    for (int root : roots()) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " root=" << root);
      const Array x = input(dtype(), {n}, rank(), Pattern::kData);
      auto [y, token] = comm().gather(x, root);
      if (rank() == root) {
        std::vector<Array> parts;
        for (int r = 0; r < size(); ++r) parts.push_back(input(dtype(), {n}, r, Pattern::kData, Device::cpu()));
        EXPECT_EQ(y.shape(), (Shape{size(), n}));
        EXPECT_TRUE(same(y, concat_rows(parts, dtype())));
      } else {
        EXPECT_EQ(y.shape(), x.shape());
        EXPECT_TRUE(same(y, x));
      }
    }
  }
}

TEST_P(Ops, Scatter) {
  for (std::int64_t n : counts()) {
    for (int root : roots()) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " root=" << root);
      // On the root the input has shape (size, n); elsewhere (n) gives the shape of the result.
      const Array x = rank() == root ? input(dtype(), {size(), n}, root, Pattern::kData)
                                     : input(dtype(), {n}, rank(), Pattern::kData);
      auto [y, token] = comm().scatter(x, root);
      const Array full = input(dtype(), {size(), n}, root, Pattern::kData, Device::cpu());
      EXPECT_EQ(y.shape(), (Shape{n}));
      EXPECT_TRUE(same(y, full.select(0, rank())));
    }
  }
}

TEST_P(Ops, ReduceScatter) {
  for (std::int64_t n : counts()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kBitXor}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " op=" << reduce_op_name(op));
      const Array x = input(dtype(), {size(), n}, rank(), pattern_for(op));
      if (!backend_supports(op, dtype())) {
        EXPECT_THROW(comm().reduce_scatter(x, op), InvalidArgument);
        continue;
      }
      auto [y, token] = comm().reduce_scatter(x, op);
      EXPECT_EQ(y.shape(), (Shape{n}));
      EXPECT_TRUE(same(y, reference(dtype(), {n}, op, 0, size() - 1, rank() * n)));
    }
  }
}

TEST_P(Ops, Alltoall) {
  for (std::int64_t n : counts()) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const Array x = input(dtype(), {size(), n}, rank(), Pattern::kData);
    auto [y, token] = comm().alltoall(x);
    std::vector<Array> parts;
    for (int i = 0; i < size(); ++i)
      parts.push_back(input(dtype(), {size(), n}, i, Pattern::kData, Device::cpu()).select(0, rank()).contiguous());
    EXPECT_EQ(y.shape(), (Shape{size(), n}));
    EXPECT_TRUE(same(y, concat_rows(parts, dtype())));
  }
}

TEST_P(Ops, SendRecvInPairs) {
  if (size() == 1) GTEST_SKIP() << "pairs need two ranks (sendrecv covers one)";
  const int partner = rank() % 2 == 0 ? rank() + 1 : rank() - 1;
  if (partner >= size()) GTEST_SKIP() << "the last of an odd number of ranks has no partner";
  for (std::int64_t n : counts()) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const Array mine = input(dtype(), {n}, rank(), Pattern::kData);
    const Array theirs = input(dtype(), {n}, partner, Pattern::kData);
    RecvStatus status;
    // Even ranks send first; odd ranks receive first: no deadlock with blocking sends.
    if (rank() % 2 == 0) {
      comm().send(mine, partner, 11).wait();
      auto [y, t] = comm().recv(mine, partner, kAnyTag, &status);
      t.wait();
      EXPECT_TRUE(same(y, theirs));
      if (!on_gpu()) {
        EXPECT_EQ(status.tag, 12);  // NCCL has no tags
      }
    } else {
      const int source = on_gpu() && comm().has_nccl() ? partner : kAnySource;  // NCCL needs a named source
      auto [y, t] = comm().recv(mine, source, on_gpu() ? kAnyTag : 11, &status);
      t.wait();
      EXPECT_TRUE(same(y, theirs));
      comm().send(mine, partner, 12).wait();
      if (!on_gpu()) {
        EXPECT_EQ(status.tag, 11);
      }
    }
    EXPECT_EQ(status.source, partner);
    EXPECT_EQ(status.count, n);
  }
}

// A rank's messages to itself are received by tag, the earliest matching send first, with the sender's tag and count
// in the status, as MPI does. NCCL sends to itself only within a group that receives it too: on a real GPU the NCCL
// backend's send to itself ended the communicator, so GPU buffers take a queued device copy (the simulated NCCL
// refuses an unpaired send to self as NCCL does). Messages stay well under 1 KiB: MPI's blocking send to itself completes
// only while the message is buffered (Open MPI's eager limit; 1632 bytes of complex128 hung with device buffers).
TEST_P(Ops, SendToItselfIsReceivedByTagInOrder) {
  for (std::int64_t n : {0, 1, 7, 30}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const Array a = input(dtype(), {n}, rank(), Pattern::kData);
    const Array b = input(dtype(), {n + 1}, rank() + 1, Pattern::kData);
    const Array c = input(dtype(), {n + 2}, rank() + 2, Pattern::kData);
    Token ta = comm().send(a, rank(), 21);
    Token tb = comm().send(b, rank(), 22);
    Token tc = comm().send(c, rank(), 21);
    RecvStatus status;
    auto [yb, t1] = comm().recv(b, rank(), 22, &status);  // past the earlier send of another tag
    t1.wait();
    EXPECT_TRUE(same(yb, b));
    EXPECT_EQ(status.source, rank());
    EXPECT_EQ(status.tag, 22);
    EXPECT_EQ(status.count, n + 1);
    // The earliest left, into a larger buffer; from any source on a communicator of one rank (NCCL takes that as this
    // rank; with more, any source could take another rank's message meant for a later test).
    const int source = size() == 1 ? kAnySource : rank();
    auto [ya, t2] = comm().recv(c, source, kAnyTag, &status);
    t2.wait();
    EXPECT_TRUE(same(ya.slice(0, 0, n), a));
    EXPECT_EQ(status.source, rank());
    EXPECT_EQ(status.tag, 21);
    EXPECT_EQ(status.count, n);
    // sendrecv with itself: its receive takes the queued send of the same tag before its own.
    const Array d = input(dtype(), {n + 2}, rank() + 3, Pattern::kData);
    auto [yc, t3] = comm().sendrecv(d, c, rank(), rank(), 21, 21, &status);
    t3.wait();
    EXPECT_TRUE(same(yc, c));
    EXPECT_EQ(status.tag, 21);
    EXPECT_EQ(status.count, n + 2);
    auto [yd, t4] = comm().recv(d, rank(), 21, &status);
    t4.wait();
    EXPECT_TRUE(same(yd, d));
    for (Token* t : {&ta, &tb, &tc}) t->wait();
  }
}

// Where MPI would wait forever (a receive from itself with no such send before it) or report a truncation that ends
// the job, the NCCL backend's queue knows at once, and says so before anything is enqueued.
TEST_P(Ops, ReceiveFromItselfWithoutSuchASendIsRefusedOnNccl) {
  if (!on_gpu() || !comm().has_nccl()) GTEST_SKIP() << "MPI waits for the send (a hang, or a timeout)";
  const Array x = input(dtype(), {5}, rank(), Pattern::kData);
  EXPECT_THROW(comm().recv(x, rank(), 31), InvalidArgument);
  Token t = comm().send(x, rank(), 32);
  EXPECT_THROW(comm().recv(x, rank(), 31), InvalidArgument);                 // another tag
  EXPECT_THROW(comm().recv(x.slice(0, 0, 4), rank(), 32), InvalidArgument);  // does not fit
  EXPECT_THROW(comm().sendrecv(x, x, rank(), (rank() + 1) % size(), 0, 31), InvalidArgument);
  auto [y, t2] = comm().recv(x, rank(), 32);  // still queued: the refusals took nothing
  t2.wait();
  EXPECT_TRUE(same(y, x));
  t.wait();
}

TEST_P(Ops, SendrecvRing) {
  for (std::int64_t n : counts()) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int right = (rank() + 1) % size(), left = (rank() + size() - 1) % size();
    const Array mine = input(dtype(), {n}, rank(), Pattern::kData);
    RecvStatus status;
    auto [y, t] = comm().sendrecv(mine, mine, left, right, 3, 3, &status);
    t.wait();
    EXPECT_TRUE(same(y, input(dtype(), {n}, left, Pattern::kData)));
    EXPECT_EQ(status.source, left);
    EXPECT_EQ(status.count, n);
  }
}

TEST_P(Ops, Scan) {
  for (std::int64_t n : counts()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kLogicalOr}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " op=" << reduce_op_name(op));
      const Array x = input(dtype(), {n}, rank(), pattern_for(op));
      if (!reduce_op_supports(op, dtype())) {
        EXPECT_THROW(comm().scan(x, op), InvalidArgument);
        continue;
      }
      auto [y, token] = comm().scan(x, op);
      EXPECT_TRUE(same(y, reference(dtype(), {n}, op, 0, rank())));
    }
  }
}

TEST_P(Ops, Allgatherv) {
  for (std::int64_t n : counts()) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    // Uneven lengths, and an empty contribution from every other rank.
    auto len = [&](int r) -> std::int64_t { return n == 0 ? 0 : (r % 2 == 1 ? 0 : n + r); };
    const Array x = input(dtype(), {len(rank())}, rank(), Pattern::kData);
    std::vector<Array> parts;
    std::vector<std::int64_t> counts;
    for (int r = 0; r < size(); ++r) {
      parts.push_back(input(dtype(), {len(r)}, r, Pattern::kData, Device::cpu()));
      counts.push_back(len(r));
    }
    const Array want = concat_rows(parts, dtype());
    auto [y, token] = comm().allgatherv(x);
    EXPECT_TRUE(same(y, want));
    Array buf = Array::empty({want.numel()}, dtype(), buffer_device());
    comm().allgatherv(x, buf, counts).wait();
    EXPECT_TRUE(same(buf, want));
  }
}

TEST_P(Ops, Alltoallv) {
  // With `silent`, rank 0 sends nothing at all (an empty send buffer, still on the suite's device: the backend is
  // chosen by where buffers live, never by their size, so every rank must take the same backend).
  for (bool silent : {false, true})
  for (std::int64_t n : counts()) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " rank 0 silent=" << silent);
    const int p = size();
    // c(r, j): what rank r sends to rank j; uneven, some zero.
    auto c = [&](int r, int j) -> std::int64_t {
      if (silent && r == 0) return 0;
      return n == 0 || (r + j) % 3 == 2 ? 0 : n / (1 + (r + j) % 3) + (r == j);
    };
    std::vector<Array> out_parts, in_parts;
    std::vector<std::int64_t> send_counts, recv_counts;
    for (int j = 0; j < p; ++j) {
      out_parts.push_back(input(dtype(), {c(rank(), j)}, rank() * p + j, Pattern::kData, Device::cpu()));
      send_counts.push_back(c(rank(), j));
      in_parts.push_back(input(dtype(), {c(j, rank())}, j * p + rank(), Pattern::kData, Device::cpu()));
      recv_counts.push_back(c(j, rank()));
    }
    const Array send = concat_rows(out_parts, dtype()).to(buffer_device());
    Array recv = Array::empty({concat_rows(in_parts, dtype()).numel()}, dtype(), buffer_device());
    comm().alltoallv(send, send_counts, recv, recv_counts).wait();
    EXPECT_TRUE(same(recv, concat_rows(in_parts, dtype())));
  }
}

TEST_P(Ops, Barrier) {
  // Every rank passes the barrier; the token it returns is complete, and the sequence advances alike everywhere.
  const std::uint64_t before = comm().sequence();
  Token t = comm().barrier();
  EXPECT_TRUE(t.is_complete());
  EXPECT_EQ(comm().sequence(), before + 1);
}

// Rank 0 arrives late: no rank leaves the barrier before it, on blocking, timeout and async communicators.
TEST(Barrier, NoRankLeavesBeforeTheLastArrives) {
  if (world()->size() < 2) GTEST_SKIP() << "needs two ranks";
  for (int mode = 0; mode < 3; ++mode) {
    auto c = Communicator::world({.timeout = mode == 1 ? std::chrono::seconds(30) : std::chrono::milliseconds(0),
                                  .async = mode == 2,
                                  .name = "barrier"});
    c->barrier().wait();  // everyone starts together
    const auto start = std::chrono::steady_clock::now();
    if (c->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(800));
    c->barrier().wait();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (c->rank() != 0) {
      EXPECT_GE(waited, 0.4) << "mode " << mode << ": rank " << c->rank() << " left before rank 0 arrived";
    }
  }
}

// Integer sums past the dtype's range wrap around, as in C, NumPy and NCCL, over lengths past any SIMD width: Open
// MPI 4.1's op/avx saturates 8- and 16-bit sums from 16 elements on (open-mpi/ompi#8045).
TEST(IntegerSums, WrapAround) {
  SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU();
  Communicator& c = *world();
  const int r = c.rank(), n = c.size();
  for (DType dt : {DType::kInt8, DType::kUInt8, DType::kInt16, DType::kUInt16, DType::kInt32, DType::kUInt64}) {
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt));
        const T top = std::numeric_limits<T>::max();
        constexpr std::int64_t kLen = 67;
        // The sums modulo 2^bits, added in the unsigned type (signed overflow is undefined, and int32 + int32 does
        // not promote) and converted back as C++20 defines the conversion.
        using U = std::make_unsigned_t<T>;
        U total = 0, prefix = 0;
        for (int q = 0; q < n; ++q) {
          const U term = static_cast<U>(top - q);
          total = static_cast<U>(total + term);
          if (q <= r) prefix = static_cast<U>(prefix + term);
        }
        const Array x = Array::from_values<T>(std::vector<T>(kLen, static_cast<T>(top - r))).to(buffer_device());
        auto [sum, t1] = c.allreduce(x, ReduceOp::kSum);
        EXPECT_EQ(sum.to_vector<T>(), std::vector<T>(kLen, static_cast<T>(total)));
        auto [scan, t2] = c.scan(x, ReduceOp::kSum);
        EXPECT_EQ(scan.to_vector<T>(), std::vector<T>(kLen, static_cast<T>(prefix)));
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, Ops, ::testing::ValuesIn(swept_dtypes()), dtype_param_name);

}  // namespace
}  // namespace shardkit::testing
