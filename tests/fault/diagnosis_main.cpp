// Jobs that go wrong in the ways that once misled `shardkit-trace analyze`, for tests/fault/test_diagnosis.py, which
// runs each under mpirun (SHARDKIT_DUMP_DIR set, a 2 s timeout) and reads its verdict. A rank that catches an error
// prints "rank <r>: <error class>: <message>", waits for the others' dumps to be asked for, and returns (the Runtime
// then ends the job); the rank at fault sleeps until the job ends it.
//   twins     two dup()s of the world with one name: the first one's barrier times out (the last rank never comes)
//             after the second, later in every rank's list, ran more collectives without fault
//   vops      scatter, gather, allgatherv and alltoallv (per-rank counts differ by design), then an allreduce the last
//             rank never enters
//   p2ponly   an allreduce, then rank 1 sends more messages than the ring keeps to rank 0, which takes them and then
//             waits for one more that never comes (SHARDKIT_TRACE_BUFFER=8: ranks 0 and 1 keep no collective)
//   dropped   an asynchronous world (SHARDKIT_TRACE_BUFFER=2): rank 0 sends 1 MiB to rank 1 and drops the token, then
//             runs two barriers; rank 1 never receives (it runs the barriers)
//   usr1      an asynchronous world: an allreduce, a send rank 1 receives (rank 0 keeps its token, never waited for),
//             a barrier, a send to rank 0 from every other rank once past it, and rank 0's SIGUSR1 while every rank
//             is idle (every rank writes its dump, from its watchdog for the others); the job goes on and ends well
//   stop      the last rank stops (SIGSTOP) while the others wait in an allreduce: it writes no dump (until the end
//             of the job continues it, if it does)
//   mesh      two meshes of the same shape over the world: an allreduce over each one's first axis; the last rank
//             skips the second mesh's

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"
#include "shardkit/sharding/mesh.hpp"

namespace {

using namespace shardkit;
using std::chrono::milliseconds;

Array ones(std::int64_t n) {
  return Array::zeros({n}, DType::kFloat32);
}  // what is sent does not matter

void sleep_ms(int ms) {
  std::this_thread::sleep_for(milliseconds(ms));
}

// The rank at fault: sleeps in its own code until the job ends it.
[[noreturn]] void stay_away() {
  std::printf("rank at fault: staying away\n");
  std::fflush(stdout);
  sleep_ms(60000);
  std::_Exit(9);
}

int run(const std::string& scenario, Runtime& rt) {
  CommOptions o;
  o.timeout = milliseconds(2000);
  o.name = "world";
  o.async = scenario == "dropped" || scenario == "usr1";
  auto world = Communicator::world(rt, o);
  const int r = world->rank(), n = world->size(), last = n - 1;
  if (scenario == "twins") {
    auto first = world->dup("twin");
    auto second = world->dup("twin");
    first->allreduce(ones(4), ReduceOp::kSum).token.wait();
    for (int i = 0; i < 3; ++i) second->allreduce(ones(4), ReduceOp::kSum).token.wait();
    second->barrier().wait();
    if (r == last) stay_away();
    first->barrier().wait();
  } else if (scenario == "vops") {
    const std::int64_t m = 3;
    Array got = Array::empty({m}, DType::kFloat32);
    world->scatter(ones(m * n), got, 0).wait();  // read on the root only
    Array all = Array::empty({m * n}, DType::kFloat32);
    world->gather(ones(m), all, last).wait();  // `all` is written on the root only
    std::vector<std::int64_t> counts(n), sends(n), recvs(n);
    for (int k = 0; k < n; ++k) counts[k] = k + 1;
    std::int64_t total = 0;
    for (auto c : counts) total += c;
    Array v = Array::empty({total}, DType::kFloat32);
    world->allgatherv(ones(r + 1), v, counts).wait();
    for (int k = 0; k < n; ++k) {
      sends[k] = (r + k) % 3;  // rank r sends (r + k) % 3 to rank k, which expects (k + r) % 3 from it
      recvs[k] = (k + r) % 3;
    }
    std::int64_t out = 0, in = 0;
    for (int k = 0; k < n; ++k) out += sends[k], in += recvs[k];
    Array x = Array::empty({in}, DType::kFloat32);
    world->alltoallv(ones(out), sends, x, recvs).wait();
    if (r == last) stay_away();
    world->allreduce(ones(8), ReduceOp::kSum).token.wait();
  } else if (scenario == "p2ponly") {
    world->allreduce(ones(4), ReduceOp::kSum).token.wait();
    if (r == 1) {
      for (int i = 0; i < 20; ++i) world->send(ones(2), 0, 5).wait();
      stay_away();
    } else if (r == 0) {
      Array y = Array::empty({2}, DType::kFloat32);
      for (int i = 0; i < 21; ++i) world->recv(y, 1, 5).token.wait();  // the 21st never comes
    } else {
      stay_away();  // in its own code too: only rank 0's receive is left waiting
    }
  } else if (scenario == "dropped") {
    if (r == 0) {
      Array big = ones(1 << 18);     // 1 MiB
      (void)world->send(big, 1, 7);  // the token, and then the buffer, dropped
    }
    world->barrier().wait();
    world->barrier().wait();
  } else if (scenario == "usr1") {
    world->allreduce(ones(4), ReduceOp::kSum).token.wait();
    Token kept;  // a send's token that nobody waits for: pending, its receiver has it
    if (r == 0 && n > 1) kept = world->send(ones(3), 1, 1);
    if (r == 1) world->recv(Array::empty({3}, DType::kFloat32), 0, 1).token.wait();
    world->barrier().wait();
    // Rank 0 asks for the dumps once every rank has seen the barrier complete: a barrier can complete on rank 0
    // while another rank has yet to see its own request complete, and that rank's dump then says (truly) pending.
    if (r == 0) {
      for (int k = 1; k < n; ++k) world->recv(Array::empty({1}, DType::kFloat32), k, 2).token.wait();
      ::kill(::getpid(), SIGUSR1);
    } else {
      world->send(ones(1), 0, 2).wait();
    }
    // Every rank idle in its own code until every dump is written (renamed into place: whole), however late the
    // watchdogs are on a loaded machine (a fixed 4 s was not enough at 4 ranks beside a CI build), at most 60 s.
    const char* dir = std::getenv("SHARDKIT_DUMP_DIR");
    for (int waited = 0; dir != nullptr && waited < 60000; waited += 50) {
      bool all = true;
      for (int k = 0; k < n && all; ++k)
        all = ::access((std::string(dir) + "/rank" + std::to_string(k) + ".json").c_str(), F_OK) == 0;
      if (all) break;
      sleep_ms(50);
    }
    if (dir == nullptr) sleep_ms(4000);
    world->barrier().wait();
    std::printf("rank %d: finished\n", r);
    return 0;
  } else if (scenario == "stop") {
    world->allreduce(ones(4), ReduceOp::kSum).token.wait();
    if (r == last) ::raise(SIGSTOP);  // writes no dump while the others wait for it
    world->allreduce(ones(8), ReduceOp::kSum).token.wait();
  } else if (scenario == "mesh") {
    // (n, 1) but at 4 ranks (2, 2): axis x is never the whole mesh (whose communicator is the mesh's own)
    const std::vector<std::int64_t> shape = n == 4 ? std::vector<std::int64_t>{2, 2} : std::vector<std::int64_t>{n, 1};
    Mesh a(shape, {"x", "y"}, world), b(shape, {"x", "y"}, world);
    auto ax = a.axis_comm({"x"});
    auto bx = b.axis_comm({"x"});
    ax->allreduce(ones(4), ReduceOp::kSum).token.wait();
    ax->allreduce(ones(4), ReduceOp::kSum).token.wait();
    if (r == last) stay_away();
    bx->allreduce(ones(4), ReduceOp::kSum).token.wait();
    // The ranks of the other group (at 4 ranks) complete theirs, and wait in their own code for the job to end (ranks
    // that finish while another ends the job with MPI_Abort left Open MPI's mpirun waiting for good).
    std::printf("rank %d: its group completed\n", r);
    std::fflush(stdout);
    sleep_ms(60000);
    return 0;
  } else {
    std::printf("unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  std::printf("rank %d: ERROR: completed\n", r);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(&argc, &argv);
  const std::string scenario = argc > 1 ? argv[1] : "";
  try {
    return run(scenario, rt);
  } catch (const shardkit::Error& e) {
    const char* kind = dynamic_cast<const TimeoutError*>(&e)    ? "TimeoutError"
                       : dynamic_cast<const MismatchError*>(&e) ? "MismatchError"
                       : dynamic_cast<const BackendError*>(&e)  ? "BackendError"
                                                                : "Error";
    std::printf("rank %d: %s: %s\n", rt.rank(), kind, e.what());
    std::fflush(stdout);
    sleep_ms(1500);  // the other waiting ranks time out and write their dumps before this exit ends the job
    return 3;
  }
}
