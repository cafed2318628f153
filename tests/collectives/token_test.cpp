// The token rules of DESIGN.md, each with a test that fails if the rule is broken. Deterministic by construction:
// the root delays its part, so an operation that did not wait would read data that has not arrived yet.

#include <chrono>
#include <thread>

#include "collective_test_util.hpp"
#include "shardkit/core/dlpack.hpp"

#include <dlpack/dlpack.h>

namespace shardkit::testing {
namespace {

using namespace std::chrono_literals;

// A communicator whose MPI operations return pending tokens (nonblocking MPI). `check` = false leaves out checked
// mode, whose exchange of signatures before each collective waits for every rank on the host and so orders
// operations by itself.
std::shared_ptr<Communicator> make_async(const std::string& name, bool check = CommOptions::defaults().check) {
  CommOptions o;
  o.async = true;
  o.check = check;
  o.name = name;
  return Communicator::from_mpi(world()->mpi_handle(), o);
}

void delay_on_root(int root) {
  if (world()->rank() == root) std::this_thread::sleep_for(200ms);
}

TEST(TokenRule1, EveryOperationTakesAndReturnsAToken) {
  Communicator& c = *world();
  Array x = Array::from_values<std::int64_t>({c.rank() + 1});
  auto [a, t1] = c.allreduce(x, ReduceOp::kSum);
  auto [b, t2] = c.allreduce(a, ReduceOp::kSum, t1);
  Token t3 = c.barrier(t2);
  t3.wait();
  const std::int64_t n = c.size();
  EXPECT_EQ(b.to_vector<std::int64_t>()[0], n * n * (n + 1) / 2);
}

// Rule 2: an operation given a token starts after the operation that produced it, across communicators. Swept over
// sizes below and above MPI's eager limit (a rendezvous delays the read of a large send buffer by itself, which hid a
// missing wait), in place and not, contiguous and strided (a strided buffer is packed into a contiguous one, which
// must wait for the token as well), on the test buffers' device (GPU buffers, NCCL, in the GPU suite).
class TokenRule2 : public ::testing::TestWithParam<std::tuple<std::int64_t, bool, bool>> {
 protected:
  void SetUp() override { SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU(); }
};

TEST_P(TokenRule2, TwoCommunicatorsOrderedOnlyByTokens) {
  const auto [n, in_place, strided] = GetParam();
  auto a = make_async("A", false);
  auto b = make_async("B", false);
  const int r = a->rank(), size = a->size();
  const std::int64_t step = strided ? 2 : 1;
  Array host = Array::zeros({n * step}, DType::kInt64);
  if (r == 0) {
    for (std::int64_t i = 0; i < n; ++i) host.data_as<std::int64_t>()[i * step] = i + 1;
  }
  Array buf = host.to(buffer_device()).clone();
  // Another handle: it carries no ready event, so only the token can order the read (every other element if strided).
  Array alias = strided ? buf.reshape({n, 2}).select(1, 0) : buf;
  // Set both communicators up for these buffers first (NCCL's set-up is collective: at the first call it would make
  // the ranks wait for the root, which would order the operations by itself).
  for (auto* c : {a.get(), b.get()})
    c->allreduce(Array::zeros({1}, DType::kInt64, buffer_device()), ReduceOp::kSum).token.wait();
  // Allocated before the bcast is issued: making device memory may synchronise the device, which would wait for it.
  Array sum = in_place ? alias : Array::zeros({n}, DType::kInt64, buffer_device());
  delay_on_root(0);
  Token ta = a->bcast_inplace(buf, 0);  // pending on the non-roots until the root arrives
  // Must read `alias` only after the bcast completed.
  Token tb = in_place ? b->allreduce_inplace(alias, ReduceOp::kSum, ta) : b->allreduce(alias, sum, ReduceOp::kSum, ta);
  tb.wait();
  const auto got = (in_place ? alias.contiguous() : sum).to_vector<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], size * (i + 1)) << "element " << i;
}

// 8 elements go eagerly (the send buffer is read when the operation starts), 1000 (8 KB) and 65536 by rendezvous.
INSTANTIATE_TEST_SUITE_P(SizesAndInPlace, TokenRule2,
                         ::testing::Combine(::testing::Values(8, 1000, 65536), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::int64_t, bool, bool>>& p) {
                           return "n" + std::to_string(std::get<0>(p.param)) +
                                  (std::get<1>(p.param) ? "_in_place" : "") + (std::get<2>(p.param) ? "_strided" : "");
                         });

TEST(TokenRule2User, UserWorkOrderedOnATokenSeesTheResult) {
  // On the host, "user work ordered on the token" is work after token.wait(): it must see the whole result.
  auto a = make_async("user-work");
  Array x = Array::from_values<std::int32_t>({a->rank() + 1, 2 * (a->rank() + 1)});
  Array y = Array::zeros({2}, DType::kInt32);
  delay_on_root(0);
  Token t = a->allreduce(x, y, ReduceOp::kSum);
  t.wait();
  const std::int32_t s = a->size() * (a->size() + 1) / 2;
  EXPECT_EQ(static_cast<std::int32_t*>(y.data())[0], s);
  EXPECT_EQ(static_cast<std::int32_t*>(y.data())[1], 2 * s);
}

// Rule 3: operations on one communicator run in call order, with or without tokens.
TEST(TokenRule3, CallOrderWithoutTokens) {
  auto a = make_async("order");
  const int r = a->rank(), n = a->size();
  std::vector<Result> results;
  for (int k = 0; k < 6; ++k) {
    if (k % 2 == 0)
      results.push_back(a->allreduce(Array::from_values<std::int64_t>({(k + 1) * (r + 1)}), ReduceOp::kSum));
    else
      results.push_back(a->bcast(Array::from_values<std::int64_t>({100 * k + r}), k % n));
  }
  for (int k = 0; k < 6; ++k) {
    const std::int64_t got = results[k].value.to_vector<std::int64_t>()[0];
    if (k % 2 == 0)
      EXPECT_EQ(got, static_cast<std::int64_t>(k + 1) * n * (n + 1) / 2) << k;
    else
      EXPECT_EQ(got, 100 * k + k % n) << k;
  }
  if (n < 2) return;
  // Messages between two ranks with one tag arrive in the order they were sent.
  if (r == 0) {
    for (int k = 0; k < 5; ++k) a->send(Array::from_values<std::int32_t>({k}), 1, 9);
  } else if (r == 1) {
    for (int k = 0; k < 5; ++k) EXPECT_EQ(a->recv(Array::zeros({1}, DType::kInt32), 0, 9).value.to_vector<std::int32_t>()[0], k);
  }
  a->barrier().wait();
}

// Rule 4: a result is safe to read from the host through the library without an explicit wait.
TEST(TokenRule4, HostReadsWaitForTheToken) {
  auto a = make_async("host-read");
  const int n = a->size();
  const std::int64_t want = static_cast<std::int64_t>(n) * (n + 1) / 2;
  for (int how = 0; how < 3; ++how) {
    delay_on_root(0);
    Array x = Array::from_values<std::int64_t>({a->rank() + 1});
    auto [y, t] = a->allreduce(x, ReduceOp::kSum);
    if (how == 0) {
      EXPECT_EQ(y.to_vector<std::int64_t>()[0], want);  // copy to host
    } else if (how == 1) {
      EXPECT_EQ(y.to_string(), "[" + std::to_string(want) + "]");  // printing
    } else {
      DLManagedTensorVersioned* d = to_dlpack_versioned(y);  // DLPack export
      EXPECT_EQ(static_cast<std::int64_t*>(d->dl_tensor.data)[0], want);
      d->deleter(d);
    }
  }
}

// Rule 5: MPI operations complete before returning by default; asynchronous ones complete by the wait.
TEST(TokenRule5, MpiTokensCompleteOnReturnOrByTheWait) {
  Communicator& c = *world();
  Token t = c.allreduce(Array::from_values<float>({1.0f}), ReduceOp::kSum).token;
  EXPECT_TRUE(t.is_complete());
  EXPECT_EQ(t.waitable(), nullptr);

  auto a = make_async("async");
  if (a->size() > 1) {
    delay_on_root(0);
    Array y = Array::zeros({1}, DType::kFloat32);
    Token pending = a->allreduce(Array::from_values<float>({1.0f}), y, ReduceOp::kSum);
    if (a->rank() != 0) {
      EXPECT_FALSE(pending.is_complete());  // the root has not arrived yet
    }
    pending.wait();
    EXPECT_TRUE(pending.is_complete());
    EXPECT_EQ(static_cast<float*>(y.data())[0], static_cast<float>(a->size()));
  }
}

TEST(TokenRule5, NcclTokensAreCudaEvents) {
  SHARDKIT_SKIP_WITHOUT_GPU();
  Communicator& c = *world();
  if (!c.has_nccl()) GTEST_SKIP() << "no NCCL communicator";
  Array x = Array::arange(1 << 20, DType::kFloat32, runtime().device());
  auto [y, t] = c.allreduce(x, ReduceOp::kSum);
  ASSERT_NE(t.waitable(), nullptr);  // stream-ordered, not complete on return
  cuda::Stream s = cuda::Stream::create(runtime().device().index);
  t.order_stream(s.handle());  // a device-side wait
  s.synchronize();
  EXPECT_TRUE(t.is_complete());
  EXPECT_FLOAT_EQ(y.to_vector<float>()[7], 7.0f * c.size());
}

// Rule 6: join waits for both; a default token is complete.
TEST(TokenRule6, JoinWaitsForBoth) {
  EXPECT_TRUE(Token().is_complete());
  EXPECT_NO_THROW(Token().wait());
  auto a = make_async("join-a");
  auto b = make_async("join-b");
  delay_on_root(0);
  Array ya = Array::zeros({1}, DType::kInt32), yb = Array::zeros({1}, DType::kInt32);
  Array xa = Array::from_values<std::int32_t>({1}), xb = Array::from_values<std::int32_t>({2});
  Token ta = a->allreduce(xa, ya, ReduceOp::kSum);
  Token tb = b->allreduce(xb, yb, ReduceOp::kSum);
  Token both = Token::join(ta, tb);
  both.wait();
  EXPECT_TRUE(ta.is_complete());
  EXPECT_TRUE(tb.is_complete());
  EXPECT_EQ(static_cast<std::int32_t*>(ya.data())[0], a->size());
  EXPECT_EQ(static_cast<std::int32_t*>(yb.data())[0], 2 * a->size());
  EXPECT_EQ(Token::join(Token(), ta).waitable(), ta.waitable());
}

}  // namespace
}  // namespace shardkit::testing
