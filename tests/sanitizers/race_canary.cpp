// The ThreadSanitizer run's check on itself (scripts/test.sh --tsan): two threads write one plain int without a
// lock, and the run must report it (a build or an environment in which ThreadSanitizer saw nothing would otherwise
// pass every threaded suite). MPI is initialised first, as in every test, so that the suppressions for Open MPI
// (tsan_mpi.supp) are loaded and shown not to hide a race of ours.
#include <mpi.h>

#include <thread>

namespace {
int g_counter = 0;  // deliberately unsynchronised
void bump() {
  for (int i = 0; i < 1000; ++i) g_counter = g_counter + 1;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::thread a(bump), b(bump);
  a.join();
  b.join();
  MPI_Finalize();
  return g_counter > 0 ? 0 : 1;
}
