// The sanitized run's check on itself (scripts/test.sh --sanitize, ctest's sanitizer_leak_canary): a program that
// starts MPI, runs a collective and finalises (leaving the allocations MPI keeps by design, which lsan_mpi.supp
// suppresses), then leaks one allocation of its own. LeakSanitizer must report that one, at this file's line, and must
// be able to name where MPI's were made (keep_loaded.cpp): were leak detection off, or a leak of ours missed, or MPI's
// stacks "<unknown module>" again, the test fails.
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  volatile int* leaked = new int[5];  // 20 bytes, never freed
  leaked[0] = sum;
  return 0;
}
