// The flight recorder (collectives/src/flight_recorder.hpp): every operation with what identifies it across ranks
// (sequence number, operation, dtype, count, root or peer), its backend and state, and the caller's site; a ring of
// the last SHARDKIT_TRACE_BUFFER operations per communicator; all of it written as JSON by dump_flight_records, which
// shardkit-trace reads (tests/python/test_processes.py runs the whole chain on real hangs).

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "collective_test_util.hpp"
#include "flight_recorder.hpp"
#include "shardkit/collectives/call_site.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::testing {
namespace {

// While it lives, this process's dumps go to a fresh directory of their own (Config::dump_dir: SHARDKIT_DUMP_DIR is
// read once, at start), removed with it.
class DumpDirHere {
 public:
  DumpDirHere() {
    if (!mkdtemp(dir_)) throw std::runtime_error("mkdtemp failed");
    ProcessSettings here = saved_;
    here.dump_dir = dir_;
    ProcessSettings::set(here);
  }
  ~DumpDirHere() {
    ProcessSettings::set(saved_);
    std::filesystem::remove_all(dir_);
  }
  const char* path() const { return dir_; }

 private:
  char dir_[28] = "/tmp/shardkit-flight-XXXXXX";
  ProcessSettings saved_ = ProcessSettings::current();
};

// The JSON of communicator `name` in this rank's dump.
std::string section(const std::string& dump, const std::string& name) {
  const std::size_t at = dump.find("\"name\": \"" + name + "\"");
  if (at == std::string::npos) return "";
  return dump.substr(at, dump.find("]}", at) - at);
}

// The record of operation `op` in a communicator's JSON ("" when none).
std::string record(const std::string& comm, const std::string& op) {
  std::size_t at = comm.find("\"op\": \"" + op + "\"");
  if (at == std::string::npos) return "";
  at = comm.rfind('{', at);
  return comm.substr(at, comm.find('}', at) - at);
}

TEST(FlightRecorder, RecordsEveryOperationAndKeepsTheLastN) {
  const int r = world()->rank(), n = world()->size();
  const std::shared_ptr<Communicator> comm = Communicator::world({.name = "recorded", .trace_buffer = 3});

  Array x = Array::from_values<float>({1, 2, 3, 4, 5}).to(buffer_device());
  comm->allreduce(x, ReduceOp::kSum).token.wait();
  current_call_site() = {"caller.py", 42};
  comm->bcast(x, n - 1).token.wait();
  current_call_site() = {};
  if (n > 1 && r < 2) {
    Array y = Array::from_values<std::int64_t>({7, 8}).to(buffer_device());
    if (r == 0) comm->send(y, 1, 3).wait();
    if (r == 1) comm->recv(y, 0, 3).token.wait();
  }
  comm->barrier().wait();

  const DumpDirHere dir;
  const std::string path = detail::dump_flight_records("FlightRecorder test");
  ASSERT_FALSE(path.empty());
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  const std::string dump = text.str();
  EXPECT_NE(dump.find("FlightRecorder test"), std::string::npos) << dump;  // the reason (after any earlier one)
  const std::string mine = section(dump, "recorded");
  ASSERT_FALSE(mine.empty()) << dump;
  EXPECT_NE(mine.find("\"capacity\": 3"), std::string::npos) << mine;
  // The ring keeps the last three: the first allreduce is gone wherever a fourth operation came (ranks 0 and 1).
  const bool exchanged = n > 1 && r < 2;
  EXPECT_EQ(count_of(mine, "{\"id\": "), 3) << mine;
  EXPECT_EQ(record(mine, "allreduce").empty(), exchanged) << mine;
  const std::string bcast = record(mine, "bcast");
  EXPECT_NE(bcast.find("\"dtype\": \"float32\", \"count\": 5, \"peer\": " + std::to_string(n - 1)), std::string::npos)
      << bcast;
  EXPECT_NE(bcast.find("\"site\": \"caller.py:42\""), std::string::npos) << bcast;
  // What the analyzer prints: the recorder's own description (one formatter for the watchdog's lines and the analyzer).
  EXPECT_NE(bcast.find(" (5 x float32) peer/root " + std::to_string(n - 1) + "\""), std::string::npos) << bcast;
  EXPECT_NE(bcast.find("\"what\": \"bcast #"), std::string::npos) << bcast;
  EXPECT_NE(bcast.find("\"state\": \"completed\""), std::string::npos) << bcast;
  const std::string barrier = record(mine, "barrier");
  EXPECT_NE(barrier.find("\"dtype\": null, \"count\": -1"), std::string::npos) << barrier;
  EXPECT_NE(barrier.find("\"site\": null"), std::string::npos) << barrier;
  EXPECT_NE(barrier.find("\"what\": \"barrier #"), std::string::npos) << barrier;
  if (exchanged) {
    const std::string p2p = record(mine, r == 0 ? "send" : "recv");
    EXPECT_NE(p2p.find("\"seq\": -1"), std::string::npos) << p2p;
    EXPECT_NE(p2p.find("\"dtype\": \"int64\", \"count\": 2, \"peer\": " + std::to_string(1 - r)), std::string::npos)
        << p2p;
  }
  // Sequence numbers of the collectives are the communicator's own, the same on every rank.
  EXPECT_NE(barrier.find("\"seq\": " + std::to_string(comm->sequence() - 1)), std::string::npos) << barrier;
}

// SHARDKIT_TRACE_BUFFER=0 turns the recorder off (docs/environment.md): a communicator made then keeps no ring, and a dump has no
// section for it, while one made with a ring (before and after) is there with its operations.
TEST(FlightRecorder, ABufferOfZeroRecordsNothing) {
  const std::shared_ptr<Communicator> silent = Communicator::world({.name = "unrecorded", .trace_buffer = 0});
  const std::shared_ptr<Communicator> heard = Communicator::world({.name = "recorded beside it"});
  Array x = Array::from_values<float>({1, 2}).to(buffer_device());
  silent->allreduce(x, ReduceOp::kSum).token.wait();
  heard->allreduce(x, ReduceOp::kSum).token.wait();
  const DumpDirHere dir;
  const std::string path = detail::dump_flight_records("the buffer-of-zero test", /*local=*/false);
  ASSERT_FALSE(path.empty());
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_EQ(section(text.str(), "unrecorded"), "") << text.str();
  EXPECT_NE(record(section(text.str(), "recorded beside it"), "allreduce"), "") << text.str();
}

// NCCL operations run in issue order on one stream: one whose token nobody waited for on the host (a device-side wait,
// a dropped token) is complete once a later one is seen complete, and a dump says so (in the GPU suite; host buffers
// take no NCCL).
TEST(FlightRecorder, NcclOperationsCompleteInTheOrderIssued) {
  SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU();
  if (!on_gpu()) GTEST_SKIP() << "NCCL: the GPU suite's";
  const std::shared_ptr<Communicator> comm = Communicator::world({.name = "nccl in order"});
  if (!comm->has_nccl()) GTEST_SKIP() << "NCCL was not agreed on here";
  const Array x = Array::from_values<float>({1, 2, 3}).to(buffer_device());
  Result first = comm->allreduce(x, ReduceOp::kSum);  // never waited for on the host
  comm->allreduce(x, ReduceOp::kSum).token.wait();
  const DumpDirHere dir;
  const std::string path = detail::dump_flight_records("the NCCL order test", /*local=*/false);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  const std::string mine = section(text.str(), "nccl in order");
  EXPECT_EQ(count_of(mine, "\"backend\": \"nccl\", \"state\": \"completed\""), 2) << mine;
  first.token.wait();
}

// Before the job ends, a rank waits (SHARDKIT_DUMP_WAIT_S) for every rank's dump of this job: files that an earlier
// job left in the directory, named alike, do not count (it waits them out); this job's do (it returns at once).
TEST(FlightRecorder, WaitingForDumpsTakesThisJobsOnly) {
  const DumpDirHere dir;
  const int n = world()->size();
  char ours[24];
  std::snprintf(ours, sizeof ours, "%016llx", static_cast<unsigned long long>(Runtime::instance().job_id()));
  auto write_all = [&](const std::string& job) {
    for (int k = 0; k < n; ++k)
      std::ofstream(std::string(dir.path()) + "/rank" + std::to_string(k) + ".json")
          << "{\"rank\": " << k << ", \"job\": \"" << job << "\", \"pid\": 1, \"communicators\": []}\n";
  };
  ProcessSettings c = ProcessSettings::current();
  c.dump_wait = std::chrono::milliseconds(300);
  ProcessSettings::set(c);
  write_all(std::string(ours) == "00000000000000ab" ? "00000000000000cd" : "00000000000000ab");
  auto t0 = std::chrono::steady_clock::now();
  detail::wait_for_dumps(n);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300)) << "an earlier job's dumps counted";
  c.dump_wait = std::chrono::seconds(60);
  ProcessSettings::set(c);
  write_all(ours);
  t0 = std::chrono::steady_clock::now();
  detail::wait_for_dumps(n);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << "this job's dumps did not count";
}

// A dump another rank asks for (the watchdog's answer, unless_recent) writes nothing when this rank has just written
// its own, and decides so under the dumps' lock: decided before it, a request that came while this rank wrote its own
// overwrote it, with its pending tokens unasked (seen as a flaky RecordsEveryOperationAndKeepsTheLastN under the
// simulated GPU's delays). A dump of this rank's own still writes.
TEST(FlightRecorder, AnotherRanksRequestRightAfterOwnDumpKeepsIt) {
  const DumpDirHere dir;
  // Not local: nothing asks the other ranks, whose requests would come here.
  const std::string own = detail::dump_flight_records("own dump of the recent-dump test", /*local=*/false);
  const std::string asked =
      detail::dump_flight_records("asked by rank 9: the recent-dump test", /*local=*/false, /*unless_recent=*/true);
  const std::string again = detail::dump_flight_records("own second dump of the recent-dump test", /*local=*/false);
  EXPECT_EQ(own.rfind(dir.path(), 0), 0u) << own;
  EXPECT_EQ(asked, "");
  EXPECT_EQ(again, own);  // the same file, written again
  std::stringstream text;
  text << std::ifstream(own).rdbuf();
  EXPECT_EQ(text.str().find("asked by rank 9"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("own second dump of the recent-dump test"), std::string::npos) << text.str();
}

// A compiled program carries each operation's site as an id, which its handler turns back into the site on every call
// (call_site_of): the same site at every call, none for an id not given out, and an id given out later is found then.
TEST(FlightRecorder, CallSiteIdsStandForTheirSites) {
  static const char* const kFile = "call_site_ids.py";  // interned, as the bindings' files are
  EXPECT_EQ(call_site_id({}), 0);
  EXPECT_EQ(call_site_of(0).file, nullptr);
  EXPECT_EQ(call_site_of(-1).file, nullptr);
  const std::int64_t first = call_site_id({kFile, 1});
  EXPECT_EQ(call_site_id({kFile, 1}), first);
  EXPECT_EQ(call_site_of(first + 1).file, nullptr);  // not given out yet
  const std::int64_t next = call_site_id({kFile, 2});
  ASSERT_EQ(next, first + 1);
  EXPECT_EQ(call_site_of(next).line, 2);  // the miss above is not remembered
  // More sites than a thread remembers, asked in turn twice: each id keeps its site.
  std::vector<std::int64_t> ids;
  for (int line = 10; line < 50; ++line) ids.push_back(call_site_id({kFile, line}));
  for (int round = 0; round < 2; ++round)
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const CallSite site = call_site_of(ids[k]);
      EXPECT_EQ(site.file, kFile);
      EXPECT_EQ(site.line, 10 + static_cast<int>(k));
    }
  EXPECT_EQ(call_site_of(first).line, 1);
}

}  // namespace
}  // namespace shardkit::testing
