// A rank lost in the middle of a collective. Every rank loops over allreduces on a checked communicator with a
// timeout; at iteration 20 the last rank
//   kill  dies (SIGKILL): the launcher notices the death and ends the job, naming the rank;
//   hang  stops making progress (stuck in its own work, alive, so the launcher sees nothing wrong): the others raise
//         TimeoutError naming it, and their exit ends the job (MPI_Abort) instead of hanging.
// expect_fault.cmake runs it under mpirun and checks how, and how fast, the job ended.

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <thread>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/runtime.hpp"

int main(int argc, char** argv) {
  using namespace shardkit;
  const char* mode = argc > 1 ? argv[1] : "kill";
  Runtime rt(&argc, &argv);
  CommOptions o;
  o.check = true;
  o.timeout = std::chrono::milliseconds(3000);
  o.name = "fault-test";
  auto comm = Communicator::world(rt, o);
  const int victim = comm->size() - 1;
  Array x = Array::zeros({1 << 18}, DType::kFloat32);
  for (int i = 0; i < 1000; ++i) {
    if (i == 20 && comm->rank() == victim) {
      std::printf("rank %d: %s now, in the middle of the collectives\n", victim, mode);
      std::fflush(stdout);
      if (std::strcmp(mode, "hang") == 0) std::this_thread::sleep_for(std::chrono::hours(1));
      std::raise(SIGKILL);
    }
    try {
      comm->allreduce_inplace(x, ReduceOp::kSum);
    } catch (const TimeoutError& e) {
      std::printf("rank %d: TimeoutError: %s\n", comm->rank(), e.what());
      std::fflush(stdout);
      // Each waiting rank's own timer must fire, and the test checks every one of them. The first rank to return
      // ends the whole job, so without a grace period a rank descheduled on an oversubscribed machine could be
      // killed before its timer fires (the test would then see fewer reports, not a library fault).
      std::this_thread::sleep_for(std::chrono::milliseconds(2000));
      return 3;  // the Runtime's destructor ends the job (MPI_Abort)
    }
  }
  std::printf("rank %d: ERROR: finished without rank %d\n", comm->rank(), victim);
  return 1;
}
