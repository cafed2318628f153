// Counts above the MPI limit (INT_MAX elements): the split and point-to-point paths, exercised with a lowered
// limit so they run on small buffers at every world size. The `large` test moves real > 2^31-element buffers.

#include "collective_test_util.hpp"
#include "backends/mpi/mpi_request.hpp"

namespace shardkit::testing {
namespace {

// A communicator whose MPI calls carry at most 1000 elements.
class Chunked : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_gpu()) GTEST_SKIP() << "the MPI limit only concerns the MPI backend";
    comm_ = Communicator::world({.name = "chunked", .max_message_elements = 1000});
  }
  Communicator& comm() { return *comm_; }
  std::shared_ptr<Communicator> comm_;
  static constexpr std::int64_t kN = 2503;  // three chunks
};

TEST_F(Chunked, ElementwiseOperations) {
  Communicator& c = comm();
  const int r = c.rank(), n = c.size();
  const DType d = DType::kInt32;
  const Array x = input(d, {kN}, r, Pattern::kArithmetic);
  EXPECT_TRUE(same(c.allreduce(x, ReduceOp::kSum).value, reference(d, {kN}, ReduceOp::kSum, 0, n - 1)));
  EXPECT_TRUE(same(c.scan(x, ReduceOp::kProd).value, reference(d, {kN}, ReduceOp::kProd, 0, r)));
  auto red = c.reduce(x, ReduceOp::kMax, n - 1).value;
  EXPECT_TRUE(same(red, r == n - 1 ? reference(d, {kN}, ReduceOp::kMax, 0, n - 1) : x));
  EXPECT_TRUE(same(c.bcast(input(d, {kN}, r, Pattern::kData), 0).value, input(d, {kN}, 0, Pattern::kData)));
  auto rs = c.reduce_scatter(input(d, {n, kN}, r, Pattern::kArithmetic), ReduceOp::kSum).value;
  EXPECT_TRUE(same(rs, reference(d, {kN}, ReduceOp::kSum, 0, n - 1, r * kN)));
}

TEST_F(Chunked, DataMovement) {
  Communicator& c = comm();
  const int r = c.rank(), n = c.size();
  const DType d = DType::kFloat64;
  Array all = Array::empty({n, kN}, d);
  for (int q = 0; q < n; ++q) all.select(0, q).copy_from(input(d, {kN}, q, Pattern::kData));
  EXPECT_TRUE(same(c.allgather(input(d, {kN}, r, Pattern::kData)).value, all));
  auto g = c.gather(input(d, {kN}, r, Pattern::kData), 0).value;
  if (r == 0) {
    EXPECT_TRUE(same(g, all));
  }
  auto s = c.scatter(r == 0 ? all : input(d, {kN}, r, Pattern::kData), 0).value;
  EXPECT_TRUE(same(s, all.select(0, r)));
  // alltoall: block q of every rank's input goes to rank q.
  Array mine = input(d, {n, kN}, r, Pattern::kData);
  auto a2a = c.alltoall(mine).value;
  for (int q = 0; q < n; ++q)
    EXPECT_TRUE(same(a2a.select(0, q), input(d, {n, kN}, q, Pattern::kData).select(0, r).contiguous()));
  // Point to point, in chunks.
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  RecvStatus st;
  auto [y, t] = c.sendrecv(input(d, {kN}, r, Pattern::kData), input(d, {kN}, r, Pattern::kData), left, right, 4, 4, &st);
  EXPECT_TRUE(same(y, input(d, {kN}, left, Pattern::kData)));
  EXPECT_EQ(st.count, kN);
}

// mpi4jax's defaults (any source, any tag) on a chunked receive: the first piece fixes the source and tag of the
// others, on a blocking communicator, one polled against a timeout, and for sendrecv (whose sends go out before the
// first piece is waited for, else two ranks exchanging would wait for each other). The status names the real sender,
// tag and the whole count. An async communicator cannot wait for the first piece: refused before anything is sent.
TEST(ChunkedWildcards, RecvAndSendrecvFromAnySourceWithAnyTag) {
  if (on_gpu()) GTEST_SKIP() << "the MPI limit only concerns the MPI backend";
  constexpr std::int64_t kN = 2503;
  const DType d = DType::kFloat32;
  for (const bool timed : {false, true}) {
    CommOptions o;
    o.name = timed ? "chunked-any-timed" : "chunked-any";
    o.max_message_elements = 1000;
    o.timeout = timed ? std::chrono::milliseconds(60000) : std::chrono::milliseconds(0);
    auto comm = Communicator::world(o);
    Communicator& c = *comm;
    const int r = c.rank(), n = c.size();
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    RecvStatus st;
    auto [y, t] = c.sendrecv(input(d, {kN}, r, Pattern::kData), input(d, {kN}, r, Pattern::kData), kAnySource, right,
                             /*send_tag=*/7 + r, /*recv_tag=*/kAnyTag, &st);
    EXPECT_TRUE(same(y, input(d, {kN}, left, Pattern::kData))) << o.name;
    EXPECT_EQ(st.source, left) << o.name;
    EXPECT_EQ(st.tag, 7 + left) << o.name;
    EXPECT_EQ(st.count, kN) << o.name;
    if (n < 2) continue;
    c.barrier();  // every sendrecv is done: the send below is the only message a wildcard receive can match
    // recv: rank 1 sends to rank 0, which receives from anyone with any tag.
    if (r == 1) c.send(input(d, {kN}, 1, Pattern::kData), 0, 3).wait();
    if (r == 0) {
      RecvStatus rs;
      auto [z, tz] = c.recv(Array::empty({kN}, d), kAnySource, kAnyTag, &rs);
      tz.wait();
      EXPECT_TRUE(same(z, input(d, {kN}, 1, Pattern::kData))) << o.name;
      EXPECT_EQ(rs.source, 1) << o.name;
      EXPECT_EQ(rs.tag, 3) << o.name;
      EXPECT_EQ(rs.count, kN) << o.name;
    }
  }
  auto async = Communicator::world({.async = true, .name = "chunked-any-async", .max_message_elements = 1000});
  Array buf = Array::empty({kN}, d);
  EXPECT_THROW(async->recv_into(buf, kAnySource, 0), InvalidArgument);
  EXPECT_THROW(async->recv_into(buf, 0, kAnyTag), InvalidArgument);
}

TEST_F(Chunked, VariableCounts) {
  Communicator& c = comm();
  const int r = c.rank(), n = c.size();
  const DType d = DType::kInt16;
  std::vector<std::int64_t> counts;
  std::int64_t total = 0;
  for (int q = 0; q < n; ++q) {
    counts.push_back(1500 + 700 * q);  // above the lowered limit: point-to-point pieces
    total += counts.back();
  }
  Array got = Array::empty({total}, d);
  c.allgatherv(input(d, {counts[r]}, r, Pattern::kData), got, counts).wait();
  std::int64_t off = 0;
  for (int q = 0; q < n; ++q) {
    EXPECT_TRUE(same(got.slice(0, off, off + counts[q]).contiguous(), input(d, {counts[q]}, q, Pattern::kData)));
    off += counts[q];
  }
  // alltoallv with every block above the limit.
  std::vector<std::int64_t> sc(n, 1200), rc(n, 1200);
  Array send = input(d, {1200 * n}, r, Pattern::kData);
  Array recv = Array::empty({1200 * n}, d);
  c.alltoallv(send, sc, recv, rc).wait();
  for (int q = 0; q < n; ++q)
    EXPECT_TRUE(same(recv.slice(0, q * 1200, (q + 1) * 1200).contiguous(),
                     input(d, {1200 * n}, q, Pattern::kData).slice(0, r * 1200, (r + 1) * 1200).contiguous()));
}

// Explicit send displacements may overlap: every rank sends the same elements to everyone (one copy in its buffer),
// in one call and split into pieces.
TEST_F(Chunked, AlltoallvSendsOverlappingRegions) {
  for (Communicator* c : {world().get(), &comm()}) {
    const int r = c->rank(), n = c->size();
    const DType d = DType::kInt32;
    const std::int64_t k = 1500;  // above the lowered limit on comm()
    Array send = input(d, {k}, r, Pattern::kData);
    std::vector<std::int64_t> counts(n, k), displs(n, 0);
    Array recv = Array::empty({k * n}, d);
    c->run(OpKind::kAlltoallv, {.send = &send, .recv = &recv, .send_counts = counts, .recv_counts = counts,
                                .send_displs = displs})
        .wait();
    for (int q = 0; q < n; ++q)
      EXPECT_TRUE(same(recv.slice(0, q * k, (q + 1) * k).contiguous(), input(d, {k}, q, Pattern::kData)));
  }
}

TEST_F(Chunked, StridedBuffersAreMadeContiguous) {
  // A column of a matrix as the send buffer, a strided view as the receive buffer.
  Communicator& c = comm();
  Array m = Array::arange(3 * 4, DType::kFloat32).reshape({3, 4});
  Array col = m.select(1, 2);  // elements 2, 6, 10 with stride 4
  Array out = Array::zeros({3, 2}, DType::kFloat32);
  Array out_col = out.select(1, 1);
  c.allreduce(col, out_col, ReduceOp::kSum).wait();
  const auto v = out.to_vector<float>();
  const float n = static_cast<float>(c.size());
  EXPECT_EQ(v, (std::vector<float>{0, 2 * n, 0, 6 * n, 0, 10 * n}));
  Array inplace = m.permute({1, 0});  // strided in-place allreduce
  c.allreduce_inplace(inplace, ReduceOp::kMax).wait();
  EXPECT_EQ(m.to_vector<float>()[5], 5.0f);
}

// A pending operation dropped with requests still posted (an error between issuing and completing them) must not free
// the memory MPI may still write: it keeps its arrays (staged copies and their destinations too) for good. One that
// completed lets them go.
TEST(PendingOperation, DroppedWithRequestsPostedKeepsItsArrays) {
  Array in = Array::zeros({4}, DType::kFloat32), staged = Array::zeros({4}, DType::kFloat32);
  Array dst = Array::zeros({4}, DType::kFloat32);
  const std::weak_ptr<void> w_in = in.storage(), w_staged = staged.storage(), w_dst = dst.storage();
  {
    detail::PendingOp p;
    p.keep_alive.push_back(in);
    p.copy_back.emplace_back(staged, dst);
    p.requests.push_back(MPI_REQUEST_NULL);  // stands for a request still posted
    in = staged = dst = Array();             // the callers let go of their handles
  }
  EXPECT_FALSE(w_in.expired());
  EXPECT_FALSE(w_staged.expired());
  EXPECT_FALSE(w_dst.expired());

  Array done = Array::zeros({4}, DType::kFloat32);
  const std::weak_ptr<void> w_done = done.storage();
  {
    detail::PendingOp p;
    p.keep_alive.push_back(done);
    p.requests.push_back(MPI_REQUEST_NULL);
    done = Array();
    p.finish({});  // completed: nothing is posted any more
  }
  EXPECT_TRUE(w_done.expired());
}

}  // namespace
}  // namespace shardkit::testing
