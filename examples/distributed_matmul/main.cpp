// Distributed matrix multiplication: C = A @ B with shardkit's algorithms on a mesh of every rank, checked against a
// one-rank BLAS reference and timed (GFLOP/s, min and median over repeats).
//
//   mpirun -np 4 build/examples/distributed_matmul/distributed_matmul --m 2048 --n 2048 --k 2048 --algo all --check
//
// The flags are in kUsage below (--help prints them).
//
// Each algorithm gets its inputs in the layout it works on (filled locally from a formula: nothing is sent), so the
// time is that of the multiplication and its communication alone.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "array_compare.hpp"
#include "matmul_inputs.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/launch/runtime.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace {

using namespace shardkit;

struct Options {
  std::int64_t m = 1024, n = 1024, k = 1024;
  DType dtype = DType::kFloat64;
  std::string algo = "all";
  std::string mesh;
  int repeat = 3;
  bool check = true;
  std::string json;
  int threads = 0;
  bool help = false;
};

// The flags, printed by --help and after a mistake on the command line.
constexpr const char* kUsage = R"(usage: distributed_matmul [flags]
  --m M --n N --k K      the product (M x K) @ (K x N); --size S sets all three (default 1024)
  --dtype T              float64 (default), float32, float16, bfloat16, or f64, f32, f16, bf16 (the last two: fast
                         on a GPU only)
  --algo A[,A...]        auto, local, allgather, reduce_scatter, summa (a named algorithm that cannot run fails the
                         run), or all (default: every one, skipping those the sizes or the mesh do not fit)
  --mesh SPEC            e.g. 4, 2x2, x=2,y=2 (default: all ranks on one axis; SUMMA: the squarest 2-d mesh)
  --repeat R             timed runs per algorithm (default 3), after one warm-up
  --check / --no-check   compare with a one-rank BLAS product on rank 0 (default on)
  --json PATH            write the results as JSON ('-': standard output)
  --threads T            BLAS threads per rank (default: cores / ranks on this node, at least 1)
  --help                 print these flags and exit
)";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "distributed_matmul: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

// A dtype by its name or its short spelling.
DType parse_dtype(const std::string& name) {
  static const std::pair<const char*, DType> kShort[] = {
      {"f64", DType::kFloat64}, {"f32", DType::kFloat32}, {"f16", DType::kFloat16}, {"bf16", DType::kBFloat16}};
  for (const auto& [spelling, dtype] : kShort)
    if (name == spelling) return dtype;
  return dtype_from_name(name);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--m") o.m = std::stoll(value());
    else if (a == "--n") o.n = std::stoll(value());
    else if (a == "--k") o.k = std::stoll(value());
    else if (a == "--size") o.m = o.n = o.k = std::stoll(value());
    else if (a == "--dtype") o.dtype = parse_dtype(value());
    else if (a == "--algo") o.algo = value();
    else if (a == "--mesh") o.mesh = value();
    else if (a == "--repeat") o.repeat = std::max(1, std::stoi(value()));
    else if (a == "--check") o.check = true;
    else if (a == "--no-check") o.check = false;
    else if (a == "--json") o.json = value();
    else if (a == "--threads") o.threads = std::stoi(value());
    else if (a == "--help" || a == "-h") o.help = true;
    else usage("unknown flag " + a);
  }
  if (o.m <= 0 || o.n <= 0 || o.k <= 0) usage("sizes must be positive");
  return o;
}

// The squarest 2-d factorisation of p (rows >= columns).
std::pair<std::int64_t, std::int64_t> squarest(std::int64_t p) {
  std::int64_t c = static_cast<std::int64_t>(std::sqrt(static_cast<double>(p)));
  while (p % c) --c;
  return {p / c, c};
}

double elapsed_max(double seconds, MPI_Comm comm) {
  double out = 0;
  MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, comm);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double epsilon(DType d) {
  switch (d) {
    case DType::kFloat64: return 2.2e-16;
    case DType::kFloat32: return 1.2e-7;
    case DType::kFloat16: return 9.8e-4;
    default: break;
  }
  return 7.8e-3;  // bfloat16
}

struct Row {
  std::string algo, mesh;
  double t_min = 0, t_median = 0, gflops_best = 0, gflops_median = 0, rel_error = -1;
  bool ok = true;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    Runtime rt(&argc, &argv);
    const Options o = parse(argc, argv);
    const bool root = rt.rank() == 0;
    if (o.help) {
      if (root) std::fputs(kUsage, stdout);
      return 0;
    }
    const int p = rt.size();
    const int threads = o.threads > 0 ? o.threads
                                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                                        std::max(1, rt.local_size()));
    set_blas_num_threads(threads);
    auto world = Communicator::world(rt);
    MPI_Comm mpi = to_mpi<MPI_Comm>(world->mpi_handle());

    // Algorithms to run, each with the mesh it runs on.
    std::vector<MatmulAlgorithm> algos;
    const bool every = o.algo == "all";
    if (every) {
      algos = {MatmulAlgorithm::kLocal, MatmulAlgorithm::kAllGather, MatmulAlgorithm::kReduceScatter,
               MatmulAlgorithm::kSumma};
    } else {
      std::stringstream ss(o.algo);
      for (std::string item; std::getline(ss, item, ',');) algos.push_back(parse_matmul_algorithm(item));
    }
    auto mesh_for = [&](MatmulAlgorithm alg) {
      if (!o.mesh.empty()) return Mesh::parse(o.mesh, world);
      if (alg == MatmulAlgorithm::kSumma) {
        const auto [r, c] = squarest(p);
        return Mesh({r, c}, {"x", "y"}, world);
      }
      return Mesh::line("x", world);
    };

    const Shape a_shape{o.m, o.k}, b_shape{o.k, o.n};
    const double flops = 2.0 * static_cast<double>(o.m) * static_cast<double>(o.n) * static_cast<double>(o.k);
    if (root)
      std::printf("distributed_matmul: C(%lld x %lld) = A(%lld x %lld) @ B(%lld x %lld), %s, %d rank(s), device %s, "
                  "%d BLAS thread(s) per rank, %d repeat(s)\n",
                  static_cast<long long>(o.m), static_cast<long long>(o.n), static_cast<long long>(o.m),
                  static_cast<long long>(o.k), static_cast<long long>(o.k), static_cast<long long>(o.n),
                  std::string(dtype_name(o.dtype)).c_str(), p, rt.device().to_string().c_str(), threads, o.repeat);

    // The one-rank reference, on rank 0 (host BLAS).
    Array reference;
    if (o.check && root) {
      const Array a = examples::matrix_block(0, 0, o.m, 0, o.k, o.dtype);
      const Array b = examples::matrix_block(1, 0, o.k, 0, o.n, o.dtype);
      reference = Array::empty({o.m, o.n}, o.dtype);
      gemm(a, b, reference);
    }

    std::vector<Row> rows;
    bool all_ok = true;
    int skipped = 0;
    for (MatmulAlgorithm alg : algos) {
      Row row;
      row.algo = matmul_algorithm_name(alg);
      try {
        const Mesh mesh = mesh_for(alg);
        row.mesh = mesh.to_string();
        const auto [sa, sb] = examples::natural_layout(alg == MatmulAlgorithm::kAuto ? MatmulAlgorithm::kLocal : alg,
                                                       mesh);
        const bool uneven = alg == MatmulAlgorithm::kLocal || alg == MatmulAlgorithm::kAuto;
        const ShardedArray a = examples::matrix_sharded(0, a_shape, NamedSharding(mesh, sa, uneven), o.dtype,
                                                        rt.device());
        const ShardedArray b = examples::matrix_sharded(1, b_shape, NamedSharding(mesh, sb), o.dtype, rt.device());
        std::vector<double> times;
        ShardedArray c = matmul(a, b, MatmulOptions{alg});  // warm-up (and the result checked below)
        for (int r = 0; r < o.repeat; ++r) {
          world->barrier();
          const auto t0 = std::chrono::steady_clock::now();
          c = matmul(a, b, MatmulOptions{alg});
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          times.push_back(elapsed_max(s, mpi));
        }
        row.t_min = *std::min_element(times.begin(), times.end());
        row.t_median = median(times);
        row.gflops_best = flops / row.t_min / 1e9;
        row.gflops_median = flops / row.t_median / 1e9;
        if (o.check) {
          const Array got = gather(c, 0);
          if (root) {
            row.rel_error = max_relative_error(got, reference);
            const double bound = 64.0 * epsilon(o.dtype) * std::sqrt(static_cast<double>(o.k));
            row.ok = row.rel_error <= bound;
          }
          int ok = row.ok ? 1 : 0;
          MPI_Bcast(&ok, 1, MPI_INT, 0, mpi);
          row.ok = ok != 0;
        }
      } catch (const InvalidArgument& e) {
        // An algorithm the sizes or the mesh do not fit: with --algo all, say why and go on with the others; one
        // named on the command line was asked to run, so it failing to is a failure.
        if (root) std::printf("  %-15s %s: %s\n", row.algo.c_str(), every ? "skipped" : "FAILED, not run", e.what());
        if (every) {
          ++skipped;
        } else {
          all_ok = false;
        }
        continue;
      }
      all_ok = all_ok && row.ok;
      if (root) {
        char check[64] = "";
        if (o.check) std::snprintf(check, sizeof check, "  max rel error %.2e %s", row.rel_error, row.ok ? "ok" : "TOO LARGE");
        std::printf("  %-15s %-18s time %9.2f ms (median %9.2f)  %8.2f GFLOP/s (median %8.2f)%s\n", row.algo.c_str(),
                    row.mesh.c_str(), 1e3 * row.t_min, 1e3 * row.t_median, row.gflops_best, row.gflops_median, check);
      }
      rows.push_back(row);
    }

    if (root && !rows.empty()) {
      const auto best = std::max_element(rows.begin(), rows.end(),
                                         [](const Row& x, const Row& y) { return x.gflops_median < y.gflops_median; });
      std::printf("summary: best %s at %.2f GFLOP/s (median of %d) on %d rank(s), %d skipped; results %s\n",
                  best->algo.c_str(), best->gflops_median, o.repeat, p, skipped,
                  !all_ok ? "FAILED" : !o.check ? "not checked" : "match the one-rank BLAS reference");
    }
    if (root && !o.json.empty()) {
      std::ostringstream js;
      js << "{\"example\":\"distributed_matmul\",\"ranks\":" << p << ",\"m\":" << o.m << ",\"n\":" << o.n
         << ",\"k\":" << o.k << ",\"dtype\":\"" << dtype_name(o.dtype) << "\",\"device\":\""
         << rt.device().to_string() << "\",\"results\":[";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        js << (i ? "," : "") << "{\"algo\":\"" << r.algo << "\",\"mesh\":\"" << r.mesh << "\",\"time_s_min\":"
           << r.t_min << ",\"time_s_median\":" << r.t_median << ",\"gflops_best\":" << r.gflops_best
           << ",\"gflops_median\":" << r.gflops_median << ",\"max_rel_error\":" << r.rel_error
           << ",\"ok\":" << (r.ok ? "true" : "false") << "}";
      }
      js << "]}\n";
      if (o.json == "-") {
        std::fputs(js.str().c_str(), stdout);
      } else {
        std::ofstream(o.json) << js.str();
      }
    }
    return all_ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "distributed_matmul: %s\n", e.what());
    return 1;
  }
}
