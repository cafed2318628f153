// bench_matmul: shardkit's distributed matmul algorithms against a one-rank BLAS GEMM (for parallel efficiency) and
// ScaLAPACK's p?gemm on the same process grid, measured in one run.
//
// For every size, each method gets its inputs in the layout it works on, filled locally from the same formula
// (examples/common/matmul_inputs.hpp: value by global index), so nothing but the product and its own communication
// is timed:
//   blas            rank 0 alone computes the whole product with the same BLAS (the other ranks wait, asleep);
//   local, allgather, reduce_scatter, summa
//                   shardkit::matmul on operands already in the algorithm's natural layout;
//   pdgemm          ScaLAPACK (psgemm for float32) on a 2-d block-cyclic layout, for each grid, block size and PBLAS
//                   panel width asked.
// Repeats alternate the methods (blas, local, ..., pdgemm, blas, local, ...) so that machine noise hits all alike. One
// measurement is: barrier, time the call, maximum over ranks. The table gives min and median over the repeats,
// GFLOP/s, parallel efficiency (GFLOP/s / (ranks x one-rank GFLOP/s)) and the speed relative to the best pdgemm.
//
// The shardkit rows run matmul as a user would, overlap left to its default (matmul_overlap_default: on the host, only
// where each rank has a core to spare; the table's header says what it chose). --profile adds, for each collective
// algorithm, the same algorithm with overlap forced on and forced off and its parts run alone (the local GEMMs, the
// transfers, the element-wise adds or panel copies, the page faults of its fresh buffers), and for p?gemm the time
// inside its local GEMM calls, to show where the time goes.
//
// Run:  mpirun -np 2 bench_matmul --sizes 1024,2048,4096 --json out.json [--profile]
//       mpirun -np 2 bench_matmul --nb 64,256 --grid all --pblas-kb 0,256,512   (pdgemm at its best)
//       bench_matmul -h   lists every flag.
//
// Layout (a shared harness and one file per method, as nccl-tests): ../common/ holds the harness; bench.hpp the Method
// every file makes and measure.cpp how one is measured; blas_reference.cpp, algorithms.cpp, local.cpp,
// allgather_ring.cpp, reduce_scatter_ring.cpp, summa.cpp and pdgemm.cpp the methods; report.cpp the tables and JSON.

#include <limits>
#include <memory>
#include <optional>

#include "bench.hpp"
#include "output.hpp"
#include "report.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::bench {
namespace {

// Every method of one size, in the order they alternate: the one-rank GEMM, the algorithms, p?gemm, then --profile's.
std::vector<Method> methods_of(const Bench& b, const Dims& d, InputCache& cache, const Scalapack* scalapack) {
  const Options& opt = b.opt;
  std::vector<Method> ms;
  if (opt.baseline) ms.push_back(blas_method(b, d));
  for (MatmulAlgorithm alg : opt.algorithms) ms.push_back(shardkit_method(b, d, alg, std::nullopt, cache));
#if SHARDKIT_HAVE_SCALAPACK
  if (scalapack)
    for (Method& m : scalapack->methods(b, d)) ms.push_back(std::move(m));
#else
  (void)scalapack;
#endif
  if (opt.profile)
    for (MatmulAlgorithm alg : opt.algorithms) {
      if (alg != MatmulAlgorithm::kLocal)
        for (bool overlap : {true, false}) ms.push_back(shardkit_method(b, d, alg, overlap, cache));
      for (Method& m : profile_methods(b, d, alg, cache)) ms.push_back(std::move(m));
    }
  return ms;
}

// Compares every measured result with the one-rank product; returns whether all are within the tolerance.
bool check_results(const Bench& b, SizeResult& r) {
  const Reference ref = make_reference(b, r.dims);
  bool ok = true;
  for (Method& m : r.methods) {
    if (!m.measured() || !m.local_error) continue;
    const double mine = m.local_error(ref);
    double worst = 0;
    SHARDKIT_MPI_CHECK(MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, b.control));
    m.error = worst / std::max(ref.scale, std::numeric_limits<double>::min());
    ok = ok && *m.error <= r.tolerance;
  }
  return ok;
}

int run(const Runtime& rt, const Options& opt) {
  const bool root = rt.rank() == 0;
  std::FILE* table = table_stream(opt.json);

  // Same BLAS threads for every method: shardkit's GEMMs, the one-rank GEMM and ScaLAPACK's (Debian's libblas.so.3
  // of OpenBLAS is an interface over the same libopenblas, whose thread count is process-wide; set it through both
  // names all the same, in case another BLAS is behind ScaLAPACK).
  set_blas_num_threads(opt.threads);
  std::string blas_library = "shardkit's CBLAS";
#if SHARDKIT_HAVE_SCALAPACK
  Scalapack::set_blas_threads(opt.threads);
  blas_library = Scalapack::blas_library();
#endif

  auto comm = Communicator::world(rt, fast_comm_options(false));
  const MpiComm control = MpiComm::dup(rt.world());
  const MpiComm blacs_comm = MpiComm::dup(rt.world());

  const int p = rt.size();
  Mesh line = opt.mesh.empty() ? Mesh::line("x", comm) : Mesh::parse(opt.mesh, comm);
  Mesh summa = line;
  if (opt.mesh.empty()) {
    const auto [r, c] = squarest(p);
    summa = Mesh({r, c}, {"x", "y"}, comm);
  }
  Bench b{opt, rt, to_mpi<MPI_Comm>(control.handle()), comm, line, summa, {}, rt.rank(), p};
  b.grids = parse_grids(opt.grids, p, summa);
  if (root) print_run_header(table, b, blas_library);

#if SHARDKIT_HAVE_SCALAPACK
  std::unique_ptr<Scalapack> scalapack;
  if (opt.pdgemm) scalapack = std::make_unique<Scalapack>(to_mpi<MPI_Comm>(blacs_comm.handle()), b.grids);
  const Scalapack* pgemm = scalapack.get();
#else
  const Scalapack* pgemm = nullptr;
#endif

  std::vector<SizeResult> results;
  bool all_ok = true;
  for (const Dims& d : opt.sizes) {
    SizeResult r;
    r.dims = d;
    r.tolerance = tolerance(opt.dtype, d.k);
    InputCache cache;
    std::vector<Method>& ms = r.methods = methods_of(b, d, cache, pgemm);

    // Warm-up (whose first call also finds what the sizes do not fit), then the timed runs, alternating methods.
    r.load_before = load_average();
    for (Method& m : ms) {
      if (!m.skipped.empty()) continue;
      for (int w = 0; w < opt.warmup && m.skipped.empty(); ++w) measure(b, m, false);
    }
    for (int rep = 0; rep < opt.repeats; ++rep)
      for (Method& m : ms)
        if (m.skipped.empty()) measure(b, m, true);
    r.load_after = load_average();
    summarise_inner_gemms(b, ms);

    if (opt.check) all_ok = check_results(b, r) && all_ok;
    summarise(r);
    if (root) {
      print_size(table, r, p);
      if (opt.profile) {
        print_profile(table, r, p, matmul_overlap_default(rt.device()));
        print_pgemm_split(table, r, p);
      }
      std::fflush(table);
    }
    // Free this size's buffers before the next: the largest sizes need the memory.
    cache.clear();
    for (Method& m : ms) {
      m.prepare = {};
      m.run = {};
      m.after_timed = {};
      m.local_error = {};
    }
    results.push_back(std::move(r));  // moving the vector of methods keeps the summary's pointers valid
  }

#if SHARDKIT_HAVE_SCALAPACK
  scalapack.reset();
  if (opt.pdgemm) Scalapack::release_blacs();
#endif

  if (root) {
    if (opt.check)
      std::fprintf(table, "# Check: %s (max |C - R| / max |R| <= 64 eps sqrt(K))\n", all_ok ? "OK" : "FAILED");
    std::fflush(table);
    if (!opt.json.empty()) write_json(opt.json, json_report(b, results, blas_library));
  }
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace shardkit::bench

int main(int argc, char** argv) {
  return shardkit::bench::bench_main(argc, argv, "bench_matmul", shardkit::bench::kUsage, shardkit::bench::parse_args,
                                     shardkit::bench::run);
}
