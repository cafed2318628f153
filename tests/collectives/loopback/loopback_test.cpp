// A transport added from outside the library (loopback/, registered here with one line) is made with the
// communicators made after it, asked by its priority, recorded under its own name, and leaves everything else as it
// was: communicators made before it, and those it refuses, run as before.

#include <string>
#include <vector>

#include "collective_test_util.hpp"
#include "loopback/loopback_transport.hpp"

namespace shardkit::testing {
namespace {

constexpr OpKind kLoopbackOps[] = {OpKind::kAllreduce, OpKind::kReduce,        OpKind::kBcast,
                                   OpKind::kAllgather, OpKind::kGather,        OpKind::kScatter,
                                   OpKind::kReduceScatter, OpKind::kAlltoall,  OpKind::kScan};

void register_loopback_once() {
  static const bool done = [] {
    detail::register_transport(loopback_transport());  // the registry line
    return true;
  }();
  (void)done;
}

TEST(LoopbackTransport, ServesTheCommunicatorsItTakesAndNothingElse) {
  if (on_gpu()) GTEST_SKIP() << "host buffers only";
  auto before = world();  // made before the registration: it has no slot for it
  register_loopback_once();
  EXPECT_STREQ(detail::transport_name(kLoopbackKind), "loopback");
  // Asked first (its priority), the fallback last; a second transport recorded as the same kind is refused.
  EXPECT_EQ(detail::transports()[detail::routing_order().front()]->kind, kLoopbackKind);
  EXPECT_EQ(detail::transports()[detail::routing_order().back()]->kind, BackendKind::kMpi);
  EXPECT_THROW(detail::register_transport(loopback_transport()), InvalidArgument);
  const int n = before->size(), r = before->rank();
  auto alone = before->split(r, 0, "loopback:" + std::to_string(r));
  ASSERT_EQ(alone->size(), 1);
  const std::int64_t ran = loopback_operations();
  for (OpKind op : kLoopbackOps) {
    SCOPED_TRACE(op_name(op));
    EXPECT_EQ(alone->backend_for(op, Device::cpu()), kLoopbackKind);
    for (std::int64_t count : {0, 1, 7}) {  // empty, one, odd
      const std::vector<double> unset(static_cast<std::size_t>(count), -1.0);
      Array x = Array::arange(count, DType::kFloat64), y = Array::from_values<double>(unset, {count});
      // A bcast's root keeps its buffer (in place); every other operation leaves its input in its output.
      Array* out = op == OpKind::kBcast ? &x : &y;
      alone->run(op, {.send = &x, .recv = out, .root = 0}).wait();
      EXPECT_EQ(out->to_vector<double>(), Array::arange(count, DType::kFloat64).to_vector<double>()) << count;
    }
  }
  alone->run(OpKind::kBarrier, {}).wait();
  EXPECT_EQ(loopback_operations() - ran, static_cast<std::int64_t>(std::size(kLoopbackOps)) * 3 + 1);
  // What it does not take goes on to the others: a sendrecv with itself, an allgatherv.
  EXPECT_NE(alone->backend_for(OpKind::kSendrecv, Device::cpu()), kLoopbackKind);
  EXPECT_NE(alone->backend_for(OpKind::kAllgatherv, Device::cpu()), kLoopbackKind);
  Array one = Array::arange(3, DType::kInt32), back = Array::zeros({3}, DType::kInt32);
  alone->run(OpKind::kSendrecv, {.send = &one, .recv = &back, .dest = 0, .source = 0}).wait();
  EXPECT_EQ(back.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 1, 2}));
  // Communicators it refuses (other names; more than one rank) and those made before it run without it.
  auto named = before->split(r, 0, "not loopback");
  EXPECT_NE(named->backend_for(OpKind::kAllreduce, Device::cpu()), kLoopbackKind);
  auto all = before->dup("loopback:all");
  EXPECT_EQ(all->backend_for(OpKind::kAllreduce, Device::cpu()) == kLoopbackKind, n == 1);
  for (Communicator* c : {before.get(), all.get()}) {
    Array x = Array::from_values<std::int64_t>({r + 1}), sum = Array::zeros({1}, DType::kInt64);
    c->run(OpKind::kAllreduce, {.send = &x, .recv = &sum}).wait();
    EXPECT_EQ(sum.to_vector<std::int64_t>()[0], std::int64_t{n} * (n + 1) / 2) << c->name();
  }
}

}  // namespace
}  // namespace shardkit::testing
