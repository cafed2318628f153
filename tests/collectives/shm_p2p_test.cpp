// Point-to-point operations on the shm backend (shm/shm_p2p.hpp), on the default route of a communicator made on one
// node: MPI's matching (by source and tag, the earliest first, wildcards), messages that arrive before a receive wants
// them (whole, in several ring entries, or read from the sender's buffer), more messages than a ring holds while both
// ranks send or while the receiver sits in a collective (the sender's pending sends, posted whatever the sender waits
// in), freeing a communicator with sends pending, and the errors. Across hosts point-to-point operations stay on MPI:
// the same bodies check them there. ctest runs them at 1-4 ranks, and again without single-copy reads
// (SHARDKIT_SHM_SINGLE_COPY=0: large messages then travel through the rings).

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "collective_test_util.hpp"
#include "backends/shm/shm_p2p.hpp"
#include "backends/shm/shm_segment.hpp"

namespace shardkit::testing {
namespace {

using detail::P2pGeometry;
using detail::ShmP2p;

// A message of `bytes` (whole int32 elements) from rank `from` with `tag`: its contents say both.
Array message(std::int64_t bytes, int from, int tag) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(bytes / 4));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>(from * 1000003 + tag * 7919 + i);
  return Array::from_values<std::int32_t>(v);
}

class ShmP2pTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_gpu()) GTEST_SKIP() << "host buffers only";
  }
  static Communicator& comm() {
    static std::shared_ptr<Communicator> c = Communicator::world({.name = "shm p2p"});
    return *c;
  }
  int rank() { return comm().rank(); }
  int size() { return comm().size(); }
  int right() { return (rank() + 1) % size(); }
  int left() { return (rank() + size() - 1) % size(); }
  // Bytes of a message for each way a message travels: none, inline, one entry's payload, several entries, and from
  // the single-copy threshold up (several entries too where single copy is off), past the ring's entries.
  static std::vector<std::int64_t> sizes() {
    const auto payload = static_cast<std::int64_t>(P2pGeometry::for_ranks(comm().size()).payload);
    const auto entries = static_cast<std::int64_t>(P2pGeometry::for_ranks(comm().size()).entries);
    return {0,
            8,
            static_cast<std::int64_t>(ShmP2p::kInlineBytes) + 4,
            payload,
            3 * payload - 4,
            static_cast<std::int64_t>(ShmP2p::kSingleCopyBytes) + 4,
            2 * entries * payload + 12};
  }
  static bool on_shm(OpKind op) { return comm().backend_for(op, Device::cpu()) == BackendKind::kShm; }

  // Three rings' worth of messages from each rank to its right neighbour on `c`, the i-th with tag i: every third a
  // whole entry's payload on shm; across hosts (MPI) all small, as Open MPI sends 4 KiB over TCP as a rendezvous, which
  // waits for the receive.
  class Burst {
   public:
    explicit Burst(Communicator& c)
        : c_(c),
          n_(c.size()),
          me_(c.rank()),
          payload_(static_cast<std::int64_t>(P2pGeometry::for_ranks(n_).payload)),
          count_(3 * P2pGeometry::for_ranks(n_).entries),
          shm_(c.backend_for(OpKind::kSend, Device::cpu()) == BackendKind::kShm) {}
    void send() {
      for (int i = 0; i < count_; ++i) c_.send(message(bytes(i), me_, i), (me_ + 1) % n_, i).wait();
    }
    // Even ones by their tag, odd ones by any tag (which must still take them in the order sent).
    void receive() {
      const int from = (me_ + n_ - 1) % n_;
      for (int i = 0; i < count_; ++i) {
        SCOPED_TRACE(::testing::Message() << "message " << i);
        Array y = Array::zeros({bytes(i) / 4}, DType::kInt32);
        RecvStatus st;
        c_.recv_into(y, from, i % 2 == 0 ? i : kAnyTag, &st).wait();
        EXPECT_EQ(st.tag, i);
        EXPECT_TRUE(same(y, message(bytes(i), from, i)));
      }
    }

    // Runs `step` and receive(): half the ranks go into the step while their right neighbours receive, so that only
    // what posts pending sends during the step lets those receives end. The even ranks, but for a scan the odd ones,
    // which wait there for rank 0's part.
    template <typename Step>
    void receive_around(const std::string& step, Step&& run_step) {
      if (me_ % 2 == (step == "scan" ? 1 : 0)) {
        run_step();
        receive();
      } else {
        receive();
        run_step();
      }
    }
    // An allreduce ("allreduce") or a scan ("scan") of a 1 from every rank on `on`, and its result.
    static void sum_ones(Communicator& on, const std::string& step) {
      const Array one = Array::from_values<std::int32_t>({1});
      auto [y, t] = step == "allreduce" ? on.allreduce(one, ReduceOp::kSum) : on.scan(one, ReduceOp::kSum);
      t.wait();
      EXPECT_EQ(y.to_vector<std::int32_t>()[0], step == "allreduce" ? on.size() : on.rank() + 1);
    }

   private:
    std::int64_t bytes(int i) const { return i % 3 == 0 && shm_ ? payload_ : 4 * (i % 7); }
    Communicator& c_;
    int n_, me_;
    std::int64_t payload_;
    int count_;
    bool shm_;
  };
};

// A rank sends its right neighbour one message of each size that travels eagerly (up to an entry's payload: its send
// returns once posted), tags 0, 1, ...; the neighbour takes them last tag first, so that every earlier one arrives
// before a receive wants it and waits in its queue.
TEST_F(ShmP2pTest, ReceivesTakeMessagesByTagWhateverOrderTheyCameIn) {
  EXPECT_EQ(on_shm(OpKind::kSend), world_on_one_node());
  EXPECT_EQ(on_shm(OpKind::kRecv), world_on_one_node());
  const auto payload = static_cast<std::int64_t>(P2pGeometry::for_ranks(size()).payload);
  std::vector<std::int64_t> eager;
  for (std::int64_t b : sizes())
    if (b <= payload) eager.push_back(b);
  const int n = static_cast<int>(eager.size());
  for (int t = 0; t < n; ++t) comm().send(message(eager[t], rank(), t), right(), t).wait();
  for (int t = n - 1; t >= 0; --t) {
    SCOPED_TRACE(::testing::Message() << "tag=" << t << " bytes=" << eager[t]);
    Array y = Array::zeros({eager[t] / 4 + 2}, DType::kInt32);
    RecvStatus st;
    comm().recv_into(y, left(), t, &st).wait();
    EXPECT_TRUE(same(y.slice(0, 0, eager[t] / 4), message(eager[t], left(), t)));
    EXPECT_EQ(st.source, left());
    EXPECT_EQ(st.tag, t);
    EXPECT_EQ(st.count, eager[t] / 4);
  }
}

// Every size through sendrecv (its send progresses while its receive waits), out of place and in place.
TEST_F(ShmP2pTest, EverySizeArrivesWholeThroughSendrecv) {
  for (std::int64_t b : sizes()) {
    SCOPED_TRACE(::testing::Message() << "bytes=" << b);
    Array y = Array::zeros({b / 4}, DType::kInt32);
    RecvStatus st;
    comm().sendrecv_into(message(b, rank(), 5), right(), y, left(), 5, kAnyTag, &st).wait();
    EXPECT_TRUE(same(y, message(b, left(), 5)));
    EXPECT_EQ(st.source, left());
    EXPECT_EQ(st.tag, 5);
    EXPECT_EQ(st.count, b / 4);
    Array buf = message(b, rank(), 6);
    comm().sendrecv_into(buf, right(), buf, left(), 6, 6).wait();
    EXPECT_TRUE(same(buf, message(b, left(), 6)));
  }
}

// A large message sent eagerly (in several entries: below the single-copy threshold, or at any size where single copy
// is off), then a small one; the receiver takes the small one first, so the large one is queued, whole or in part (its
// rest then goes straight into the receive's buffer). Pairs of ranks; the last of an odd count sits out. Once on the
// suite's communicator and once on one made with single copy off (CommOptions::shm_single_copy, whatever the
// environment says): there a large send must not wait for its receive, or the pair deadlocks (until its timeout).
void large_message_waits_in_the_queue(Communicator& c) {
  const int rank = c.rank(), size = c.size();
  const bool eager_large = !c.options().shm_single_copy;
  const int partner = size == 1 ? 0 : (rank % 2 == 0 ? rank + 1 : rank - 1);
  const auto payload = static_cast<std::int64_t>(P2pGeometry::for_ranks(size).payload);
  const auto entries = static_cast<std::int64_t>(P2pGeometry::for_ranks(size).entries);
  for (std::int64_t b : {std::int64_t{8}, 3 * payload - 4, static_cast<std::int64_t>(ShmP2p::kSingleCopyBytes) + 4,
                         2 * entries * payload + 12}) {
    if (b >= static_cast<std::int64_t>(ShmP2p::kSingleCopyBytes) && !eager_large && size > 1) continue;
    SCOPED_TRACE(::testing::Message() << c.name() << ", bytes=" << b);
    if (partner < size) {
      if (rank % 2 == 0 || size == 1) {
        c.send(message(b, rank, 1), partner, 1).wait();
        c.send(message(8, rank, 2), partner, 2).wait();
      }
      if (rank % 2 == 1 || size == 1) {
        Array small = Array::zeros({2}, DType::kInt32), large = Array::zeros({b / 4}, DType::kInt32);
        c.recv_into(small, partner, 2).wait();
        EXPECT_TRUE(same(small, message(8, partner, 2)));
        c.recv_into(large, partner, 1).wait();
        EXPECT_TRUE(same(large, message(b, partner, 1)));
      }
    }
    c.barrier().wait();
  }
}

TEST_F(ShmP2pTest, ALargeMessageWaitsInTheQueueWhileALaterOneIsTaken) {
  if (!on_shm(OpKind::kSend))
    GTEST_SKIP() << "point-to-point on MPI (across hosts), whose large sends wait for the receive";
  large_message_waits_in_the_queue(comm());
  static std::shared_ptr<Communicator> no_single_copy = Communicator::world(
      {.timeout = std::chrono::seconds(60), .name = "shm p2p without single copy", .shm_single_copy = false});
  ASSERT_EQ(no_single_copy->backend_for(OpKind::kSend, Device::cpu()), BackendKind::kShm);
  large_message_waits_in_the_queue(*no_single_copy);
}

// Every rank but 0 sends rank 0 two messages of one tag (and rank 0 itself one); rank 0 takes them from any source with
// any tag: each rank's first before its second, every message once.
TEST_F(ShmP2pTest, AnySourceTakesEveryRanksMessagesEachInTheOrderSent) {
  if (rank() != 0) {
    comm().send(message(12, rank(), 0), 0, 3).wait();
    comm().send(message(40, rank(), 1), 0, 3).wait();
  } else {
    comm().send(message(12, 0, 0), 0, 3).wait();
    std::vector<int> seen(static_cast<std::size_t>(size()), 0);
    const int total = 2 * (size() - 1) + 1;
    for (int i = 0; i < total; ++i) {
      Array y = Array::zeros({10}, DType::kInt32);
      RecvStatus st;
      comm().recv_into(y, kAnySource, kAnyTag, &st).wait();
      ASSERT_GE(st.source, 0);
      ASSERT_LT(st.source, size());
      const int k = seen[static_cast<std::size_t>(st.source)]++;
      const std::int64_t bytes = k == 0 ? 12 : 40;
      EXPECT_EQ(st.tag, 3);
      EXPECT_EQ(st.count, bytes / 4) << "from rank " << st.source << ", its message " << k;
      EXPECT_TRUE(same(y.slice(0, 0, bytes / 4), message(bytes, st.source, k)));
    }
    for (int r = 0; r < size(); ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], r == 0 ? 1 : 2) << "rank " << r;
  }
  comm().barrier().wait();
}

// Pairs of ranks send each other three rings' worth of messages before either receives. The small ones return at once
// (posted, or pending once the ring is full); on shm every eighth is larger (several entries), which waits until what
// was sent before it is posted and its own entries are: each rank waits while the other does too, and moves what
// arrived into its queue meanwhile (without that, both would wait for good).
TEST_F(ShmP2pTest, BothRanksSendMoreThanTheRingHoldsBeforeReceiving) {
  const int partner = size() == 1 ? 0 : (rank() % 2 == 0 ? rank() + 1 : rank() - 1);
  if (partner >= size()) {
    comm().barrier().wait();
    return;
  }
  const int count = 3 * P2pGeometry::for_ranks(size()).entries;
  // On shm messages 7, 15, ... take three entries each (below the single-copy threshold: no reads of the sender's
  // buffer). On MPI (across hosts) all are small: Open MPI sends 12 KiB as a rendezvous, which waits for the receive.
  const bool shm = on_shm(OpKind::kSend);
  auto bytes_of_message = [shm](int i) -> std::int64_t { return i % 8 == 7 && shm ? 12 << 10 : 4 * (i % 5 + 1); };
  static_assert((12 << 10) < ShmP2p::kSingleCopyBytes);
  for (int i = 0; i < count; ++i) comm().send(message(bytes_of_message(i), rank(), i), partner, i).wait();
  for (int i = 0; i < count; ++i) {
    SCOPED_TRACE(::testing::Message() << "message " << i);
    Array y = Array::zeros({bytes_of_message(i) / 4}, DType::kInt32);
    RecvStatus st;
    comm().recv_into(y, partner, kAnyTag, &st).wait();
    EXPECT_EQ(st.tag, i);
    EXPECT_TRUE(same(y, message(bytes_of_message(i), partner, i)));
  }
  comm().barrier().wait();
}

// Each rank sends its right neighbour three rings' worth of small messages and goes into a collective step before its
// neighbour takes any: the sends return at once (the ring full, the rest wait in the sender's pending queue, as MPI's
// eager sends return), and they are posted as the receiver frees room while the sender waits in the step. Half the
// ranks are in the step while their right neighbours receive: an allreduce (on shm; the even ranks wait in it), a scan
// (which shm does not serve: MPI; the odd ranks, which wait for rank 0's part) and a dup (MPI's split, after an
// agreement). Once with a timeout and checked mode as the environment says (polled MPI calls; checked mode's exchange
// waits first), once with neither (one blocking MPI call).
TEST_F(ShmP2pTest, EagerSendsReturnAndArePostedWhileTheSenderIsInACollective) {
  for (const bool timed : {true, false}) {
    SCOPED_TRACE(timed ? "with a timeout" : "without a timeout, unchecked");
    CommOptions o;
    o.name = "shm p2p pending";
    o.timeout = std::chrono::seconds(timed ? 20 : 0);
    if (!timed) o.check = false;
    auto c = Communicator::world(o);
    Burst burst(*c);
    for (const std::string step : {"allreduce", "scan", "dup"}) {
      SCOPED_TRACE(step);
      burst.send();
      c->barrier().wait();
      burst.receive_around(step, [&] {
        if (step == "dup")
          EXPECT_EQ(c->dup()->size(), c->size());
        else
          Burst::sum_ones(*c, step);
      });
    }
    EXPECT_EQ(c->backend_for(OpKind::kScan, Device::cpu()), BackendKind::kMpi);
  }
}

// The same sends, but the sender then waits outside the communicator while its neighbour receives: in an operation on
// another communicator (an allreduce on shm, a scan on MPI: one blocking MPI_Scan, as neither has a timeout) or in
// MPI itself (the application's own MPI_Ibarrier, polled without calling shardkit). Nothing of the sender's own then
// posts its pending sends, as Open MPI's progress engine would post its eager sends: the process's poster thread does
// (shm_poster.hpp). Without it the receivers wait for good (their 20 s timeout, or the barrier's deadline, ends it).
TEST_F(ShmP2pTest, PendingSendsArePostedWhileTheSenderWaitsElsewhere) {
  CommOptions o;
  o.name = "shm p2p elsewhere";
  o.timeout = std::chrono::seconds(20);
  auto c = Communicator::world(o);
  CommOptions untimed;
  untimed.name = "shm p2p other";
  untimed.check = false;
  auto other = Communicator::world(untimed);
  Burst burst(*c);
  for (const std::string step : {"allreduce", "scan", "mpi"}) {
    SCOPED_TRACE(step);
    burst.send();
    comm().barrier().wait();
    burst.receive_around(step, [&] {
      if (step != "mpi") return Burst::sum_ones(*other, step);
      MPI_Request r = MPI_REQUEST_NULL;
      ASSERT_EQ(MPI_Ibarrier(MPI_COMM_WORLD, &r), MPI_SUCCESS);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < deadline) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      ASSERT_TRUE(done) << "the other ranks never came to the barrier";
    });
  }
  EXPECT_EQ(other->backend_for(OpKind::kScan, Device::cpu()), BackendKind::kMpi);
}

// A communicator freed with sends still pending posts them first, as its receiver takes them. Sends to a receiver that
// has freed its end are dropped instead of waiting for room that never comes: the small ones with a warning when the
// sender frees its own, a larger one (which would wait) with InvalidArgument at once.
TEST_F(ShmP2pTest, FreeingACommunicatorPostsItsPendingSendsOrSaysWhyNot) {
  if (size() < 2 || !on_shm(OpKind::kSend)) GTEST_SKIP() << "needs two ranks on shm";
  const auto ring = P2pGeometry::for_ranks(size());
  const int count = 3 * ring.entries;
  for (const bool receiver_first : {false, true}) {
    SCOPED_TRACE(receiver_first ? "the receiver frees its end first" : "the receiver takes them");
    CommOptions o;
    o.name = "shm p2p free";
    o.timeout = std::chrono::seconds(20);
    auto c = Communicator::world(o);
    if (receiver_first && rank() == 1) c.reset();
    comm().barrier().wait();
    if (rank() == 0) {
      for (int i = 0; i < count; ++i) c->send(message(8, 0, i), 1, i).wait();
      if (receiver_first) {
        const auto larger = static_cast<std::int64_t>((ring.entries + 1) * ring.payload);
        try {
          c->send(message(larger, 0, 0), 1, 0).wait();
          ADD_FAILURE() << "no error";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("rank 1 has freed the communicator"), std::string::npos) << e.what();
        }
      }
      ::testing::internal::CaptureStderr();
      c.reset();  // waits until rank 1 has taken them, or drops them
      const std::string err = ::testing::internal::GetCapturedStderr();
      if (receiver_first) {
        const std::string want = detail::concat(
            "rank 0: ", count, " message(s) sent to rank 1 were never received: it had freed the communicator");
        EXPECT_NE(err.find(want), std::string::npos) << err;
      } else {
        EXPECT_EQ(err.find("never received"), std::string::npos) << err;
      }
    } else if (rank() == 1 && c) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 frees its end meanwhile
      for (int i = 0; i < count; ++i) {
        Array y = Array::zeros({2}, DType::kInt32);
        c->recv_into(y, 0, i).wait();
        EXPECT_TRUE(same(y, message(8, 0, i))) << "message " << i;
      }
    }
    c.reset();
    comm().barrier().wait();
  }
}

// A receive from itself that nothing sent before would wait forever: refused at once, nothing taken; a message larger
// than the receive buffer, or of another dtype, is named on the receiving rank and aborts the communicator there.
// This process's resident memory now, in KiB (VmRSS).
long resident_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

// A producer of one entry's payload (4 KiB) after another to a receiver busy in its own code: its eager sends return,
// held back while the ring is full, up to SHARDKIT_SHM_PENDING_BYTES (1 MiB here); past it each send waits for the
// receiver to take messages, as MPI's rendezvous sends do. So 100,000 sends (400 MiB), which the receiver takes only
// once it is done elsewhere, leave the producer's memory flat (before the bound, every one waited as a copy), and
// every message arrives, in order. Pairs of ranks; at 1 rank, and for the last of an odd count, nothing (a rank's
// sends to itself are held for it: no wait could end before its own receive).
TEST_F(ShmP2pTest, AProducerPastTheBoundWaitsForItsReceiverAndItsMemoryStaysFlat) {
  if (!on_shm(OpKind::kSend)) GTEST_SKIP() << "point-to-point on MPI (across hosts)";
  auto c = Communicator::world({.name = "shm p2p bounded", .shm_pending_bytes = std::size_t{1} << 20});
  const int me = c->rank(), partner = me % 2 == 0 ? me + 1 : me - 1;
  const auto payload = static_cast<std::int64_t>(P2pGeometry::for_ranks(c->size()).payload) / 4;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Under the sanitizers: fewer, and no memory check (AddressSanitizer keeps freed memory in quarantine, 256 MiB).
  constexpr int kCount = 20000;
  constexpr bool kMeasure = false;
#else
  constexpr int kCount = 100000;
  constexpr bool kMeasure = true;
#endif
  if (partner >= c->size()) return;
  Array x = Array::zeros({payload}, DType::kInt32);
  if (me % 2 == 0) {
    const long before = resident_kib();
    long most = before;
    for (int i = 0; i < kCount; ++i) {
      static_cast<std::int32_t*>(x.data())[0] = i;
      c->send(x, partner, 4).wait();
      if (i % 1000 == 0) most = std::max(most, resident_kib());
    }
    most = std::max(most, resident_kib());
    if (kMeasure) {
      EXPECT_LT(most - before, 16 * 1024) << "resident memory grew from " << before << " KiB to " << most << " KiB";
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // busy elsewhere: the producer meets its bound
    int wrong = 0;
    for (int i = 0; i < kCount; ++i) {
      c->recv_into(x, partner, 4).wait();
      wrong += static_cast<const std::int32_t*>(x.data())[0] != i;
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST_F(ShmP2pTest, ImpossibleAndMismatchedReceivesAreNamed) {
  if (!on_shm(OpKind::kRecv)) GTEST_SKIP() << "point-to-point on MPI (across hosts)";
  Array y = Array::zeros({4}, DType::kInt32);
  EXPECT_THROW(comm().recv_into(y, rank(), 9), InvalidArgument);
  comm().send(message(16, rank(), 9), rank(), 8).wait();
  EXPECT_THROW(comm().recv_into(y, rank(), 9), InvalidArgument);  // another tag
  comm().recv_into(y, rank(), 8).wait();
  EXPECT_TRUE(same(y, message(16, rank(), 9)));
  if (size() < 2) return;
  for (const bool larger : {true, false}) {
    auto c = Communicator::world({.name = larger ? "shm p2p larger" : "shm p2p dtype"});
    if (c->rank() == 0) {
      c->send(larger ? message(36, 0, 0) : Array::zeros({4}, DType::kFloat32), 1, 0).wait();
    } else if (c->rank() == 1) {
      Array z = Array::zeros({4}, DType::kInt32);
      try {
        c->recv_into(z, 0, 0).wait();
        ADD_FAILURE() << "no error";
      } catch (const MismatchError& e) {
        const std::string want = larger
                                     ? "rank 0 sent 36 bytes of int32 with tag 0, rank 1 expected at most 16 bytes of "
                                       "int32 with tag 0"
                                     : "rank 0 sent 16 bytes of float32 with tag 0, rank 1 expected at most 16 "
                                       "bytes of int32";
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      }
      EXPECT_TRUE(c->aborted());
    }
  }
}

}  // namespace
}  // namespace shardkit::testing
