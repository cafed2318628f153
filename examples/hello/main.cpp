// Prints one line per rank: what shardkit's Runtime sees (rank, host, device, backend, library versions).
// Run: mpirun -np 4 build/examples/hello/hello

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

int main(int argc, char** argv) {
  try {
    shardkit::Runtime rt(&argc, &argv);
    // Rank 0 prints every rank's line in rank order, so the output is not interleaved.
    std::string line = rt.describe();
    const int len = static_cast<int>(line.size());
    MPI_Comm world = shardkit::to_mpi<MPI_Comm>(rt.world());
    std::vector<int> lens(rt.size());
    MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world);
    std::vector<int> displs(rt.size(), 0);
    int total = 0;
    for (int r = 0; r < rt.size(); ++r) {
      displs[r] = total;
      total += lens[r];
    }
    std::vector<char> all(static_cast<std::size_t>(total) + 1);
    MPI_Gatherv(line.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, world);
    if (rt.rank() == 0)
      for (int r = 0; r < rt.size(); ++r) std::printf("%.*s\n", lens[r], all.data() + displs[r]);
  } catch (const shardkit::Error& e) {
    std::fprintf(stderr, "hello: %s\n", e.what());
    return 1;
  }
  return 0;
}
