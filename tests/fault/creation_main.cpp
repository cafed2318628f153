// A rank never arrives at the creation of a communicator; every other rank must raise TimeoutError naming the step
// (and, in checked mode, the missing rank) within the timeout plus a margin, and the job must end rather than hang.
// Run through expect_creation_timeout.cmake, which checks every rank's output.
//   creation_main <kind> <checked|unchecked>
//   kind: world (a duplicate of the job's ranks), from_mpi (a duplicate of an MPI communicator), split, dup,
//         axis (a mesh-axis communicator), control (the first collective on a communicator wrapping a caller's)

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/runtime.hpp"
#include "shardkit/sharding/mesh.hpp"

int main(int argc, char** argv) {
  using namespace shardkit;
  Runtime rt(&argc, &argv);
  const std::string kind = argc > 1 ? argv[1] : "world";
  CommOptions o;
  o.check = argc > 2 && std::strcmp(argv[2], "checked") == 0;
  o.timeout = std::chrono::milliseconds(1500);
  o.name = "creation-test";
  // Made by every rank, before the one that goes missing.
  auto base = Communicator::world(rt, o);
  const int missing = base->size() - 1;
  if (base->rank() == missing) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::printf("rank %d: never arrived\n", base->rank());
    std::fflush(stdout);
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    if (kind == "world") {
      Communicator::world(rt, o);
    } else if (kind == "from_mpi") {
      Communicator::from_mpi(rt.world(), o);
    } else if (kind == "split") {
      base->split(0, base->rank());
    } else if (kind == "dup") {
      base->dup();
    } else if (kind == "axis") {
      const Mesh mesh({1, base->size()}, {"a", "b"}, base);
      mesh.axis_comm({"a"});
    } else if (kind == "control") {
      auto wrapped = Communicator::wrap_mpi(rt.world(), o);
      wrapped->barrier();
    }
    std::printf("rank %d: ERROR: %s completed without rank %d\n", base->rank(), kind.c_str(), missing);
    return 1;
  } catch (const TimeoutError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: caught after %.1f s: TimeoutError: %s\n", base->rank(), s, e.what());
    std::fflush(stdout);
  }
  // Give the other waiting ranks time to report before this one's exit ends the job.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  return 0;  // the Runtime ends the job with MPI_Abort
}
