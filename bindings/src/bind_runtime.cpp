// The process-wide Runtime as Python sees it: created when shardkit is imported (adopting MPI if mpi4py or the
// application initialised it, initialising it otherwise) and torn down by an atexit hook, before MPI_Finalize.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <mpi.h>

#include <cstdio>
#include <memory>

#include "py_comm.hpp"
#include "shardkit/config.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::py {

namespace nb = nanobind;

namespace {
std::unique_ptr<Runtime> g_runtime;

Runtime& runtime() {
  if (!g_runtime) throw Error(ErrorCode::kInvalidArgument, "shardkit is shut down (or was not initialised)");
  return *g_runtime;
}
}  // namespace

void register_runtime(nb::module_& m) {
  m.def("init", [] {
    if (g_runtime) return;
    RuntimeOptions o;
    o.print_warnings = true;
    g_runtime = std::make_unique<Runtime>(o);
  }, "Creates the Runtime (done by `import shardkit`).");
  m.def("shutdown", [] {
    // Communicators first (they hold MPI and NCCL handles), then the Runtime (which finalises MPI if it owns it).
    clear_communicator_caches();
    if (g_runtime) {
      nb::gil_scoped_release release;
      g_runtime.reset();
    }
  }, "Frees shardkit's communicators and finalises MPI if shardkit initialised it (registered with atexit).");
  m.def("initialized", [] { return g_runtime != nullptr; });
  m.def("rank", [] { return runtime().rank(); });
  m.def("size", [] { return runtime().size(); });
  m.def("local_rank", [] { return runtime().local_rank(); });
  m.def("local_size", [] { return runtime().local_size(); });
  m.def("host", [] { return runtime().host(); });
  m.def("owns_mpi", [] { return runtime().owns_mpi(); });
  m.def("gpu_count", [] { return runtime().gpu_count(); });
  m.def("device", [] { return runtime().device().to_string(); });
  m.def("describe", [] { return runtime().describe(); });
  m.def("thread_level", [] { return std::string(thread_level_name(runtime().thread_level())); });
  m.def("mpi_library_version", [] { return mpi_library_version(); },
        "MPI_Get_library_version of the MPI library this extension is linked against (callable before MPI_Init).");
  m.def("mpi_vendor", [] { return mpi_vendor(); });
  m.def("mpi_initialized", [] { return mpi_initialized(); });
  m.def("mpi_finalized", [] { return mpi_finalized(); });
  m.def("cuda_built", [] { return SHARDKIT_HAVE_CUDA != 0; });
  m.def("nccl_built", [] { return SHARDKIT_HAVE_NCCL != 0; });
  m.def("abort_at_exit_reason", [] { return abort_at_exit_reason(); });
  m.def("abort", [](int code, const std::string& reason) {
    run_before_abort(reason);
    std::fprintf(stderr, "shardkit: rank %d: ending the job (MPI_Abort): %s\n", g_runtime ? g_runtime->rank() : -1,
                 reason.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }, nb::arg("code") = 1, nb::arg("reason") = "",
     "Ends the whole job now (MPI_Abort on MPI_COMM_WORLD), printing the reason.");
  m.attr("__version__") = SHARDKIT_VERSION_STRING;
}

}  // namespace shardkit::py
