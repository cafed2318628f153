// MPI initialisation ownership, one mode per process (MPI initialises once per process):
//   preinit           the application initialises MPI first; the Runtime adopts it and must not finalise it
//   owns              the Runtime initialises MPI and finalises it; a second Runtime afterwards is refused
//   low_thread_level  the application initialised MPI_THREAD_SINGLE; the Runtime refuses it with a clear error
// Exits 0 on success on every rank, 1 on failure (each rank prints what went wrong).

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

int combined_exit() {
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "preinit") {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    {
      shardkit::Runtime rt(&argc, &argv);
      expect(!rt.owns_mpi(), "Runtime must not claim MPI it did not initialise");
      expect(rt.size() >= 1, "size");
    }
    expect(!shardkit::mpi_finalized(), "Runtime finalised MPI it did not initialise");
    MPI_Barrier(MPI_COMM_WORLD);  // MPI is still usable
    const int code = combined_exit();
    MPI_Finalize();
    return code;
  }
  if (mode == "owns") {
    bool owned = false;
    {
      shardkit::Runtime rt(&argc, &argv);
      owned = rt.owns_mpi();
      expect(shardkit::mpi_initialized(), "Runtime did not initialise MPI");
    }
    expect(owned, "Runtime did not report owning MPI");
    expect(shardkit::mpi_finalized(), "Runtime did not finalise the MPI it initialised");
    bool refused = false;
    try {
      shardkit::Runtime again;
    } catch (const shardkit::BackendError& e) {
      refused = std::strstr(e.what(), "finalised") != nullptr;
    }
    expect(refused, "a Runtime after MPI_Finalize must be refused with a clear message");
    if (failures) std::fprintf(stderr, "owns: %d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;  // MPI is finalised: no combining, each rank reports its own exit code
  }
  if (mode == "low_thread_level") {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    if (provided >= MPI_THREAD_SERIALIZED) {
      std::printf("MPI gave thread level %d for SINGLE; nothing to check\n", provided);
    } else {
      bool refused = false;
      try {
        shardkit::Runtime rt(&argc, &argv);
      } catch (const shardkit::BackendError& e) {
        refused = std::strstr(e.what(), "MPI_THREAD_SERIALIZED") != nullptr;
        if (!refused) std::fprintf(stderr, "unexpected message: %s\n", e.what());
      }
      expect(refused, "a Runtime on MPI_THREAD_SINGLE must be refused, naming the levels");
      expect(!shardkit::mpi_finalized(), "a refused Runtime must leave the application's MPI alone");
    }
    const int code = combined_exit();
    MPI_Finalize();
    return code;
  }
  std::fprintf(stderr, "usage: runtime_ownership preinit|owns|low_thread_level\n");
  return 2;
}
