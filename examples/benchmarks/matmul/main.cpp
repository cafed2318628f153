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

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "bench_json.hpp"
#include "matmul_inputs.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/core/kernels.hpp"
#include "shardkit/launch/mpi.hpp"
#include "shardkit/launch/runtime.hpp"
#include "shardkit/sharding/sharding.hpp"

#ifndef SHARDKIT_HAVE_SCALAPACK
#define SHARDKIT_HAVE_SCALAPACK 0
#endif

#if SHARDKIT_HAVE_SCALAPACK
#include <dlfcn.h>

// Debian's libscalapack-openmpi ships no C header: the few entry points used here, declared as the library defines
// them (BLACS' C interface; PBLAS' p?gemm_ are C functions taking char* without hidden lengths; numroc_ and
// descinit_ are Fortran with default 32-bit integers).
extern "C" {
int Csys2blacs_handle(MPI_Comm comm);
void Cfree_blacs_system_handle(int handle);
void Cblacs_gridinit(int* context, const char* order, int nprow, int npcol);
void Cblacs_gridinfo(int context, int* nprow, int* npcol, int* myrow, int* mycol);
void Cblacs_gridexit(int context);
void Cblacs_exit(int keep_mpi);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* irsrc, const int* icsrc,
               const int* ictxt, const int* lld, int* info);
void pdgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
             const double* a, const int* ia, const int* ja, const int* desca, const double* b, const int* ib,
             const int* jb, const int* descb, const double* beta, double* c, const int* ic, const int* jc,
             const int* descc);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
             const float* a, const int* ia, const int* ja, const int* desca, const float* b, const int* ib,
             const int* jb, const int* descb, const float* beta, float* c, const int* ic, const int* jc,
             const int* descc);
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);
}

// Time ScaLAPACK spends in its local GEMMs, for the compute / communication split of p?gemm (--profile): the
// benchmark defines dgemm_ and sgemm_ itself. ScaLAPACK's calls resolve through the process's global symbol table,
// where the executable comes first, so they land here, are timed, and go on to the BLAS's own definition (the next
// one). shardkit's GEMMs call cblas_?gemm and do not pass through.
namespace {

struct GemmTally {
  double seconds = 0;
  std::int64_t calls = 0;
};
GemmTally g_gemm_tally;  // ScaLAPACK runs on the main thread only

template <typename Fn>
Fn next_definition(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (!p) {
    std::fprintf(stderr, "bench_matmul: no BLAS definition of %s after the benchmark's own\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

template <typename Fn, typename... Args>
void timed_gemm(Fn fn, Args... args) {
  const auto t0 = std::chrono::steady_clock::now();
  fn(args...);
  g_gemm_tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++g_gemm_tally.calls;
}

}  // namespace

// Reference BLAS signatures (C callers such as PBLAS pass no hidden string lengths; BLAS reads one character).
extern "C" void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                       const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
                       const int* ldc) {
  using Fn = void (*)(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
                      const int*, const double*, const int*, const double*, double*, const int*);
  static const Fn next = next_definition<Fn>("dgemm_");
  timed_gemm(next, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// PBLAS's logical block size: p?gemm takes its K step (the width of the panels it broadcasts and of its local GEMMs)
// from PILAENV, which reference ScaLAPACK fixes at 32 and leaves to the installer to tune. Interposed like ?gemm_, so
// that --pblas-kb can tune it per measurement (0: the library's own answer).
namespace {
int g_pilaenv_override = 0;
}

extern "C" int pilaenv_(const int* ictxt, const char* prec) {
  using Fn = int (*)(const int*, const char*);
  static const Fn next = next_definition<Fn>("pilaenv_");
  return g_pilaenv_override > 0 ? g_pilaenv_override : next(ictxt, prec);
}

extern "C" void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                       const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc) {
  using Fn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                      const int*, const float*, const int*, const float*, float*, const int*);
  static const Fn next = next_definition<Fn>("sgemm_");
  timed_gemm(next, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

namespace {

using shardkit::Array;
using shardkit::examples::json_number;
using shardkit::examples::json_string;
using shardkit::DType;
using shardkit::MatmulAlgorithm;
using shardkit::Mesh;
using shardkit::NamedSharding;
using shardkit::ShardedArray;
using shardkit::detail::concat;

constexpr MatmulAlgorithm kAllAlgorithms[] = {MatmulAlgorithm::kLocal, MatmulAlgorithm::kAllGather,
                                              MatmulAlgorithm::kReduceScatter, MatmulAlgorithm::kSumma};

// ---- options --------------------------------------------------------------------------------------------------------

struct Dims {
  std::int64_t m = 0, n = 0, k = 0;
  bool square() const { return m == n && n == k; }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::string label() const { return square() ? std::to_string(n) : concat(m, "x", n, "x", k); }
};

struct Options {
  std::vector<Dims> sizes;
  DType dtype = DType::kFloat64;
  std::vector<MatmulAlgorithm> algorithms{std::begin(kAllAlgorithms), std::end(kAllAlgorithms)};
  std::string mesh;                // "" : a line for the 1-d algorithms, the squarest 2-d mesh for SUMMA
  std::vector<std::string> grids;  // pdgemm process grids; empty: SUMMA's mesh
  std::vector<int> nbs = {64};     // pdgemm block sizes
  std::vector<int> kbs = {0};      // PBLAS panel widths (PILAENV); 0: the library's own
  int repeats = 3;
  int warmup = 1;
  int threads = 1;
  std::string json;  // "" none, "-" stdout
  bool baseline = true;
  bool pdgemm = true;
  bool check = false;
  bool profile = false;
  bool help = false;
};

constexpr const char* kUsage =
    "usage: bench_matmul [options]\n"
    "  --sizes LIST     square sizes n (A, B and C are n x n), comma-separated (default 1024,2048,4096)\n"
    "  --m M --n N --k K  one non-square case, (M x K) @ (K x N); all three needed (added to --sizes if given)\n"
    "  --dtype T        float64 (default; ScaLAPACK pdgemm) or float32 (psgemm)\n"
    "  --algos LIST     all (default), or some of local, allgather, reduce_scatter, summa\n"
    "  --mesh SPEC      mesh of every shardkit algorithm, e.g. 2, 2x1, x=2,y=1 (default: all ranks on a line for\n"
    "                   the 1-d algorithms, the squarest 2-d mesh (rows >= columns) for summa)\n"
    "  --grid LIST      pdgemm process grids, e.g. 2x1,1x2, or all (every factorisation of the rank count);\n"
    "                   default: summa's mesh. Ranks are placed row-major, as on shardkit's mesh\n"
    "  --nb LIST        pdgemm block sizes (default 64); the best one is the baseline of the ratios\n"
    "  --pblas-kb LIST  PBLAS's panel width (what its PILAENV returns: the K step of p?gemm's local GEMMs, 32 in\n"
    "                   reference ScaLAPACK, whatever --nb is); 0 (default) keeps the library's own. Each value is\n"
    "                   a pdgemm configuration of its own, to tune pdgemm as its installer could\n"
    "  --repeat N       timed runs per method, alternating the methods (default 3): min and median reported\n"
    "  --warmup W       untimed runs per method first (default 1)\n"
    "  --threads T      BLAS threads per rank, the same for every method (default 1)\n"
    "  --no-baseline    skip the one-rank BLAS run (no efficiency then)\n"
    "  --no-pdgemm      skip ScaLAPACK\n"
    "  --check          compare every result with the one-rank product (max |C - R| / max |R|); exit 1 above the\n"
    "                   tolerance (64 eps sqrt(K))\n"
    "  --profile        also time the collective algorithms with overlap forced on and off, and their local GEMMs,\n"
    "                   transfers and adds/copies alone\n"
    "  --json PATH      also write the results as JSON to PATH ('-': stdout; the table then goes to stderr)\n"
    "  -h, --help       this text\n";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::int64_t parse_int(std::string_view text, std::string_view flag, std::int64_t min) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError(concat(flag, ": '", text, "' is not an integer"));
  if (v < min || v > INT_MAX) throw UsageError(concat(flag, ": ", v, " out of range (at least ", min, ")"));
  return v;
}

std::vector<std::string_view> split_list(std::string_view list) {
  std::vector<std::string_view> out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    out.push_back(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return out;
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::vector<Dims> squares;
  bool sizes_given = false;
  std::int64_t m = 0, n = 0, k = 0;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string_view> attached;
    if (arg.starts_with("--"))
      if (const std::size_t eq = arg.find('='); eq != std::string_view::npos) {
        attached = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
    auto value = [&]() -> std::string_view {
      if (attached) return *attached;
      if (i + 1 >= argc) throw UsageError(concat(arg, " needs a value"));
      return argv[++i];
    };
    auto flag = [&] {
      if (attached) throw UsageError(concat(arg, " takes no value"));
    };
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "--sizes") {
      sizes_given = true;
      for (std::string_view s : split_list(value())) {
        const std::int64_t v = parse_int(s, arg, 1);
        squares.push_back({v, v, v});
      }
    } else if (arg == "--m") {
      m = parse_int(value(), arg, 1);
    } else if (arg == "--n") {
      n = parse_int(value(), arg, 1);
    } else if (arg == "--k") {
      k = parse_int(value(), arg, 1);
    } else if (arg == "--dtype") {
      const std::string_view d = value();
      if (d == "float64" || d == "double")
        o.dtype = DType::kFloat64;
      else if (d == "float32" || d == "float")
        o.dtype = DType::kFloat32;
      else
        throw UsageError(concat("--dtype: '", d, "' (float64 or float32)"));
    } else if (arg == "--algos" || arg == "--algo") {
      o.algorithms.clear();
      for (std::string_view a : split_list(value())) {
        if (a == "all") {
          o.algorithms.assign(std::begin(kAllAlgorithms), std::end(kAllAlgorithms));
          continue;
        }
        MatmulAlgorithm alg{};
        try {
          alg = shardkit::parse_matmul_algorithm(a);
        } catch (const shardkit::InvalidArgument& e) {
          throw UsageError(concat("--algos: ", e.what()));
        }
        if (alg == MatmulAlgorithm::kAuto) throw UsageError("--algos: name the algorithms (auto is not one)");
        if (std::find(o.algorithms.begin(), o.algorithms.end(), alg) == o.algorithms.end()) o.algorithms.push_back(alg);
      }
    } else if (arg == "--mesh") {
      o.mesh = value();
    } else if (arg == "--grid") {
      o.grids.clear();
      for (std::string_view g : split_list(value())) o.grids.emplace_back(g);
    } else if (arg == "--nb") {
      o.nbs.clear();
      for (std::string_view s : split_list(value())) o.nbs.push_back(static_cast<int>(parse_int(s, arg, 1)));
    } else if (arg == "--pblas-kb") {
      o.kbs.clear();
      for (std::string_view s : split_list(value())) o.kbs.push_back(static_cast<int>(parse_int(s, arg, 0)));
    } else if (arg == "--repeat" || arg == "--repeats") {
      o.repeats = static_cast<int>(parse_int(value(), arg, 1));
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(parse_int(value(), arg, 0));
    } else if (arg == "--threads") {
      o.threads = static_cast<int>(parse_int(value(), arg, 1));
    } else if (arg == "--json") {
      o.json = value();
      if (o.json.empty()) throw UsageError("--json needs a path ('-' for stdout)");
    } else if (arg == "--no-baseline") {
      flag();
      o.baseline = false;
    } else if (arg == "--no-pdgemm") {
      flag();
      o.pdgemm = false;
    } else if (arg == "--check") {
      flag();
      o.check = true;
    } else if (arg == "--profile") {
      flag();
      o.profile = true;
    } else {
      throw UsageError(concat("unknown argument '", argv[i], "'"));
    }
  }
  if (o.help) return o;
  const bool mnk = m || n || k;
  if (mnk && !(m && n && k)) throw UsageError("--m, --n and --k go together: give all three");
  if (!sizes_given && !mnk) squares = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}};
  o.sizes = squares;
  if (mnk) o.sizes.push_back({m, n, k});
  if (o.sizes.empty()) throw UsageError("no size to run");
  if (o.algorithms.empty()) throw UsageError("--algos: no algorithm given");
  if (o.nbs.empty()) throw UsageError("--nb: no block size given");
  if (o.kbs.empty()) throw UsageError("--pblas-kb: no value given");
  return o;
}

// ---- meshes and grids -----------------------------------------------------------------------------------------------

// The squarest 2-d factorisation of p, rows >= columns (as examples/distributed_matmul picks SUMMA's mesh).
std::pair<std::int64_t, std::int64_t> squarest(std::int64_t p) {
  std::int64_t c = static_cast<std::int64_t>(std::sqrt(static_cast<double>(p)));
  while (c > 1 && p % c) --c;
  return {p / std::max<std::int64_t>(c, 1), std::max<std::int64_t>(c, 1)};
}

std::string shape_label(const std::vector<std::int64_t>& shape) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) s += concat(i ? "x" : "", shape[i]);
  return s;
}

struct Grid {
  int rows = 1, cols = 1;
  std::string label() const { return concat(rows, "x", cols); }
};

std::vector<Grid> parse_grids(const std::vector<std::string>& texts, int p, const Mesh& summa_mesh) {
  std::vector<Grid> out;
  auto add = [&](Grid g) {
    if (std::none_of(out.begin(), out.end(), [&](const Grid& h) { return h.rows == g.rows && h.cols == g.cols; }))
      out.push_back(g);
  };
  if (texts.empty()) {
    if (summa_mesh.ndim() == 2) {
      add({static_cast<int>(summa_mesh.shape()[0]), static_cast<int>(summa_mesh.shape()[1])});
    } else {
      const auto [r, c] = squarest(p);
      add({static_cast<int>(r), static_cast<int>(c)});
    }
    return out;
  }
  for (const std::string& t : texts) {
    if (t == "all") {
      for (int r = 1; r <= p; ++r)
        if (p % r == 0) add({r, p / r});
      continue;
    }
    shardkit::MeshShape s;
    try {
      s = shardkit::parse_mesh_shape(t);
    } catch (const shardkit::InvalidArgument& e) {
      throw UsageError(concat("--grid: ", e.what()));
    }
    if (s.shape.size() != 2 || s.shape[0] * s.shape[1] != p)
      throw UsageError(concat("--grid ", t, ": a 2-d grid of ", p, " ranks is needed (e.g. ", p, "x1)"));
    add({static_cast<int>(s.shape[0]), static_cast<int>(s.shape[1])});
  }
  return out;
}

// ---- statistics and checks ------------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double epsilon(DType d) {
  return d == DType::kFloat32 ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
}

// The bound of --check on max |C - R| / max |R|: different summation orders of K products differ by about
// sqrt(K) eps (random-walk growth), with a wide margin (as examples/distributed_matmul checks).
double tolerance(DType d, std::int64_t k) {
  return 64.0 * epsilon(d) * std::sqrt(static_cast<double>(k));
}

// The one-rank product on rank 0, broadcast to every rank when results are checked (each rank compares its own
// block, whatever the layout), with max |R| for the relative error.
struct Reference {
  std::vector<double> c;  // row-major m x n, as double whatever the dtype
  double scale = 0;       // max |R|
  std::int64_t n = 0;
  double at(std::int64_t i, std::int64_t j) const { return c[static_cast<std::size_t>(i * n + j)]; }
};

// Accumulates max |C - R| over one rank's entries; a NaN or infinity anywhere makes it infinite.
struct ErrorMax {
  double worst = 0;
  void add(double got, double want) {
    const double d = std::abs(got - want);
    worst = std::isfinite(d) ? std::max(worst, d) : std::numeric_limits<double>::infinity();
  }
};

// ---- measurement ----------------------------------------------------------------------------------------------------

enum class Kind { kBaseline, kShardkit, kScalapack, kProfile };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBaseline:
      return "baseline";
    case Kind::kShardkit:
      return "shardkit";
    case Kind::kScalapack:
      return "scalapack";
    case Kind::kProfile:
      break;
  }
  return "profile";
}

// One thing timed: a shardkit algorithm, the one-rank GEMM, a pdgemm configuration, or one part of an algorithm
// (--profile).
struct Method {
  Kind kind = Kind::kShardkit;
  std::string name;               // "blas", "local", "allgather", ..., "pdgemm"; profile: the algorithm's name
  std::string part;  // profile only: "overlap_on", "no_overlap", "gemm", "comm", "adds", "copies", "fresh"
  std::string mesh;               // "2", "2x1" (blas: "1")
  int nb = 0;                     // pdgemm's block size
  int kb = 0;                     // pdgemm's PBLAS panel width (PILAENV)
  bool kb_tuned = false;          // kb set by --pblas-kb rather than the library's own
  std::function<void()> prepare;  // before each measurement, untimed (drops the last result)
  std::function<void()> run;      // the timed call (collective, except for the baseline)
  std::function<double(const Reference&)> local_error;  // this rank's max |C - R| of the last result
  std::vector<double> seconds;
  std::string skipped;          // why it was not measured
  std::optional<double> error;  // max |C - R| / max |R| (--check)
  // p?gemm: this rank's time in local ?gemm_ calls and their count, per timed run; then the medians, maximum over
  // ranks.
  std::vector<double> gemm_seconds, gemm_calls;
  std::optional<double> inner_gemm_s, inner_calls;

  std::string label() const { return part.empty() ? name : name + ":" + part; }
  double t_min() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double t_median() const { return median(seconds); }
  bool measured() const { return skipped.empty() && !seconds.empty(); }
};

struct Bench {
  const Options& opt;
  const shardkit::Runtime& rt;
  MPI_Comm control;  // barriers, timings, checks: the measured communicators see no extra traffic
  std::shared_ptr<shardkit::Communicator> comm;
  Mesh line_mesh;   // the 1-d algorithms
  Mesh summa_mesh;  // SUMMA
  std::vector<Grid> grids;
  int rank = 0, size = 1;
};

// A barrier whose waiters sleep instead of spinning in MPI's progress loop: while rank 0 computes the one-rank
// product alone, the other ranks must leave it the cores (with --bind-to none on a small machine they share them).
void quiet_barrier(MPI_Comm comm) {
  MPI_Request req = MPI_REQUEST_NULL;
  SHARDKIT_MPI_CHECK(MPI_Ibarrier(comm, &req));
  int done = 0;
  while (true) {
    SHARDKIT_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    const timespec pause{0, 200000};  // 0.2 ms: far below any GEMM worth measuring here
    nanosleep(&pause, nullptr);
  }
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One measurement: barrier, the call, the slowest rank's time. The one-rank GEMM runs on rank 0 only.
double measure_once(const Bench& b, Method& m) {
  if (m.prepare) m.prepare();
  SHARDKIT_MPI_CHECK(MPI_Barrier(b.control));
  double seconds = 0;
  if (m.kind == Kind::kBaseline) {
    if (b.rank == 0) {
      const double t0 = now();
      m.run();
      seconds = now() - t0;
    }
    quiet_barrier(b.control);
    SHARDKIT_MPI_CHECK(MPI_Bcast(&seconds, 1, MPI_DOUBLE, 0, b.control));
    return seconds;
  }
#if SHARDKIT_HAVE_SCALAPACK
  g_gemm_tally = {};
#endif
  const double t0 = now();
  m.run();
  const double mine = now() - t0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&mine, &seconds, 1, MPI_DOUBLE, MPI_MAX, b.control));
  return seconds;
}

// Measures `m` once, keeping the time when `record` (not for warm-up runs). An algorithm the sizes do not fit throws
// InvalidArgument on every rank alike (shape checks come before any communication): that marks it skipped.
bool measure(const Bench& b, Method& m, bool record) {
  try {
    const double s = measure_once(b, m);
    if (record) m.seconds.push_back(s);
#if SHARDKIT_HAVE_SCALAPACK
    if (record && m.kind == Kind::kScalapack) {
      m.gemm_seconds.push_back(g_gemm_tally.seconds);
      m.gemm_calls.push_back(static_cast<double>(g_gemm_tally.calls));
    }
#endif
    return true;
  } catch (const shardkit::InvalidArgument& e) {
    m.skipped = e.what();
    return false;
  }
}

// ---- methods: one-rank BLAS -----------------------------------------------------------------------------------------

struct BaselineState {
  Array a, b, c;
};

Method baseline_method(const Bench& b, const Dims& d) {
  Method m;
  m.kind = Kind::kBaseline;
  m.name = "blas";
  m.mesh = "1";
  auto st = std::make_shared<BaselineState>();
  if (b.rank == 0) {
    st->a = shardkit::examples::matrix_block(0, 0, d.m, 0, d.k, b.opt.dtype);
    st->b = shardkit::examples::matrix_block(1, 0, d.k, 0, d.n, b.opt.dtype);
    st->c = Array::empty({d.m, d.n}, b.opt.dtype);
  }
  m.run = [st] { shardkit::gemm(st->a, st->b, st->c); };
  return m;
}

// ---- methods: shardkit ----------------------------------------------------------------------------------------------

// Max |C - R| over this rank's block of a sharded result.
double sharded_error(const ShardedArray& c, const Reference& ref) {
  const auto idx = c.sharding().index(c.shape(), c.mesh().rank());
  const Array local = c.local().to(shardkit::Device::cpu()).contiguous();
  ErrorMax e;
  shardkit::visit_dtype(local.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* p = static_cast<const T*>(local.data());
      const std::int64_t cols = idx[1].stop - idx[1].start;
      for (std::int64_t i = idx[0].start; i < idx[0].stop; ++i)
        for (std::int64_t j = idx[1].start; j < idx[1].stop; ++j)
          e.add(static_cast<double>(p[(i - idx[0].start) * cols + (j - idx[1].start)]), ref.at(i, j));
    }
  });
  return e.worst;
}

const Mesh& mesh_for(const Bench& b, MatmulAlgorithm alg) {
  return alg == MatmulAlgorithm::kSumma ? b.summa_mesh : b.line_mesh;
}

// An algorithm's operands in its natural layout, shared by its methods of one size (with and without overlap, and
// the profile's parts).
struct Inputs {
  ShardedArray a, b;
};
using InputCache = std::vector<std::pair<MatmulAlgorithm, std::shared_ptr<const Inputs>>>;

// @throws InvalidArgument when the sizes do not divide by the mesh.
std::shared_ptr<const Inputs> natural_inputs(const Bench& b, const Dims& d, MatmulAlgorithm alg, InputCache& cache) {
  for (const auto& [a, in] : cache)
    if (a == alg) return in;
  const Mesh& mesh = mesh_for(b, alg);
  const auto [sa, sb] = shardkit::examples::natural_layout(alg, mesh);
  const shardkit::Device dev = b.rt.device();
  auto in = std::make_shared<const Inputs>(
      Inputs{shardkit::examples::matrix_sharded(0, {d.m, d.k}, NamedSharding(mesh, sa), b.opt.dtype, dev),
             shardkit::examples::matrix_sharded(1, {d.k, d.n}, NamedSharding(mesh, sb), b.opt.dtype, dev)});
  cache.emplace_back(alg, in);
  return in;
}

// overlap unset: matmul's default (the benchmark's own row); set: forced on ("overlap_on") or off ("no_overlap"), for
// the profile.
Method shardkit_method(const Bench& b, const Dims& d, MatmulAlgorithm alg, std::optional<bool> overlap,
                       InputCache& cache) {
  Method m;
  m.kind = overlap ? Kind::kProfile : Kind::kShardkit;
  m.name = shardkit::matmul_algorithm_name(alg);
  if (overlap) m.part = *overlap ? "overlap_on" : "no_overlap";
  const Mesh& mesh = mesh_for(b, alg);
  m.mesh = shape_label(mesh.shape());
  if (alg == MatmulAlgorithm::kSumma && mesh.ndim() != 2) {
    m.skipped = concat("SUMMA needs a 2-d mesh, got ", mesh.to_string());
    return m;
  }
  std::shared_ptr<const Inputs> in;
  try {
    in = natural_inputs(b, d, alg, cache);
  } catch (const shardkit::InvalidArgument& e) {
    m.skipped = e.what();  // sizes that do not divide by the mesh
    return m;
  }
  auto c = std::make_shared<std::optional<ShardedArray>>();
  // The previous result is freed before the clock starts: only the product (with its own allocation) is timed.
  m.prepare = [c] { c->reset(); };
  m.run = [in, c, alg, overlap] { c->emplace(shardkit::matmul(in->a, in->b, shardkit::MatmulOptions{alg, overlap})); };
  m.local_error = [c](const Reference& ref) { return *c ? sharded_error(**c, ref) : 0.0; };
  return m;
}

// ---- methods: the parts of an algorithm, alone (--profile) ----------------------------------------------------------

// The steps matmul.cpp takes for each algorithm, each kind run on its own with the same shapes and communicators:
// its local GEMMs, its transfers, and its element-wise work (reduce_scatter's adds, SUMMA's panel copies). Their sum
// against the no-overlap time shows the remaining cost (allocations, thread start); the forced-overlap time against
// the no-overlap one shows how much of the transfers overlap hides (or what it costs).
// The "fresh" part: allocating the buffers one call of the algorithm allocates (its result and work buffers, each
// written at least once) and touching every page, as the call does. Large host allocations come straight from the
// kernel, so this is the page-fault cost the call pays on every invocation.
Method fresh_memory_part(Method m, std::vector<shardkit::Shape> shapes, DType dt, shardkit::Device dev) {
  m.run = [shapes = std::move(shapes), dt, dev] {
    for (const shardkit::Shape& s : shapes) Array::empty(s, dt, dev).fill_zero();
  };
  return m;
}

std::vector<Method> profile_methods(const Bench& b, const Dims& d, MatmulAlgorithm alg, InputCache& cache) {
  std::vector<Method> out;
  const Mesh& mesh = mesh_for(b, alg);
  auto part = [&](std::string name) {
    Method m;
    m.kind = Kind::kProfile;
    m.name = shardkit::matmul_algorithm_name(alg);
    m.part = std::move(name);
    m.mesh = shape_label(mesh.shape());
    return m;
  };
  if (alg == MatmulAlgorithm::kSumma && mesh.ndim() != 2) return out;
  std::shared_ptr<const Inputs> in;
  try {
    in = natural_inputs(b, d, alg, cache);
  } catch (const shardkit::InvalidArgument&) {
    return out;  // the algorithm's own row says why
  }
  const DType dt = b.opt.dtype;
  const shardkit::Device dev = b.rt.device();
  // Views of the shared inputs (the closures below keep their storage alive).
  const Array a = in->a.local(), bl = in->b.local();

  if (alg == MatmulAlgorithm::kLocal) {
    // The one GEMM, into a buffer allocated once: against the algorithm's time this is the cost of the call's own
    // result allocation (fresh pages every call for large results).
    Method g = part("gemm");
    auto c = std::make_shared<Array>(Array::empty({a.dim(0), d.n}, dt, dev));
    g.run = [a, bl, c] { shardkit::gemm(a, bl, *c); };
    out.push_back(std::move(g));
    out.push_back(fresh_memory_part(part("fresh"), {{a.dim(0), d.n}}, dt, dev));
    return out;
  }

  if (alg == MatmulAlgorithm::kAllGather || alg == MatmulAlgorithm::kReduceScatter) {
    const std::int64_t p = mesh.size();
    if (d.m % p || d.k % p) return out;
    auto comm = mesh.axis_comm(shardkit::Axes(mesh.axis_names()));
    const int i = comm->rank(), left = static_cast<int>((i + p - 1) % p), right = static_cast<int>((i + 1) % p);
    if (alg == MatmulAlgorithm::kAllGather) {
      // C_i = sum_j A_i[:, K_j] @ B_j: p GEMMs on column slices of A; p - 1 transfers of a block of B.
      const std::int64_t kb = d.k / p;
      auto c = std::make_shared<Array>(Array::empty({d.m / p, d.n}, dt, dev));
      Method g = part("gemm");
      g.run = [a, bl, c, p, kb, i] {
        for (std::int64_t s = 0; s < p; ++s) {
          const std::int64_t j = (i + s) % p;
          shardkit::gemm(a.slice(1, j * kb, (j + 1) * kb), bl, *c, 1.0, s == 0 ? 0.0 : 1.0);
        }
      };
      // Copies: the received blocks must not land in the shared inputs.
      auto bufs = std::make_shared<std::pair<Array, Array>>(bl.clone(), Array::empty(bl.shape(), dt, dev));
      Method t = part("comm");
      t.run = [comm, bufs, p, left, right] {
        for (std::int64_t s = 0; s + 1 < p; ++s) {
          comm->sendrecv_into(bufs->first, left, bufs->second, right, 23, 23).wait();
          std::swap(bufs->first, bufs->second);
        }
      };
      out.push_back(std::move(g));
      out.push_back(std::move(t));
      // C and the receive buffers: two used in turn, only one with two ranks.
      std::vector<shardkit::Shape> fresh = {{d.m / p, d.n}};
      for (std::int64_t s = 0; s < std::min<std::int64_t>(p - 1, 2); ++s) fresh.push_back({kb, d.n});
      out.push_back(fresh_memory_part(part("fresh"), std::move(fresh), dt, dev));
    } else {
      // p GEMMs of a row block of A[:, K_i] by B_i; p - 1 transfers of a partial sum, each followed by an add.
      const std::int64_t mb = d.m / p;
      auto bufs = std::make_shared<std::array<Array, 3>>(std::array<Array, 3>{
          Array::empty({mb, d.n}, dt, dev), Array::empty({mb, d.n}, dt, dev), Array::empty({mb, d.n}, dt, dev)});
      Method g = part("gemm");
      g.run = [a, bl, bufs, p, mb, i] {
        for (std::int64_t s = 0; s < p; ++s) {
          const std::int64_t r = (i + s + 1) % p;
          shardkit::gemm(a.slice(0, r * mb, (r + 1) * mb), bl, (*bufs)[s == 0 ? 0 : 2]);
        }
      };
      Method t = part("comm");
      t.run = [comm, bufs, p, left, right] {
        for (std::int64_t s = 1; s < p; ++s) comm->sendrecv_into((*bufs)[0], left, (*bufs)[1], right, 29, 29).wait();
      };
      Method add = part("adds");
      add.run = [bufs, p] {
        for (std::int64_t s = 1; s < p; ++s) shardkit::add_into((*bufs)[1], (*bufs)[2]);
      };
      out.push_back(std::move(g));
      out.push_back(std::move(t));
      out.push_back(std::move(add));
      // The partial sum in hand, the incoming one and this rank's share.
      out.push_back(fresh_memory_part(part("fresh"), {{mb, d.n}, {mb, d.n}, {mb, d.n}}, dt, dev));
    }
    return out;
  }

  // SUMMA on (x, y): lcm(px, py) panels; for each, A's panel is broadcast along y from its owner column and B's along
  // x from its owner row (no broadcast along an axis of one rank), then one GEMM. Owners broadcast straight from their
  // block where the panel is contiguous there and copy it into a buffer first where not (A's panels when a block
  // holds more than one); the other ranks receive into buffers, two per operand used in turn.
  const std::string& x = mesh.axis_names()[0];
  const std::string& y = mesh.axis_names()[1];
  const std::int64_t px = mesh.shape()[0], py = mesh.shape()[1], panels = std::lcm(px, py);
  if (d.m % px || d.n % py || d.k % panels) return out;
  auto row_comm = mesh.axis_comm(y);
  auto col_comm = mesh.axis_comm(x);
  const std::int64_t my_x = mesh.axis_index(x), my_y = mesh.axis_index(y);
  const std::int64_t kp = d.k / panels, a_per = panels / py, b_per = panels / px, mloc = d.m / px, nloc = d.n / py;
  auto a_panel = [a, a_per, kp](std::int64_t s) { return a.slice(1, (s % a_per) * kp, (s % a_per + 1) * kp); };
  auto b_panel = [bl, b_per, kp](std::int64_t s) { return bl.slice(0, (s % b_per) * kp, (s % b_per + 1) * kp); };
  auto pan = std::make_shared<std::array<Array, 3>>(std::array<Array, 3>{
      Array::empty({mloc, kp}, dt, dev), Array::empty({kp, nloc}, dt, dev), Array::empty({mloc, nloc}, dt, dev)});
  Method g = part("gemm");
  g.run = [pan, panels] {
    for (std::int64_t t = 0; t < panels; ++t) shardkit::gemm((*pan)[0], (*pan)[1], (*pan)[2], 1.0, t == 0 ? 0.0 : 1.0);
  };
  Method t = part("comm");
  t.run = [pan, panels, a_per, b_per, px, py, row_comm, col_comm] {
    for (std::int64_t s = 0; s < panels; ++s) {
      shardkit::Token ta, tb;
      if (py > 1) ta = row_comm->bcast_inplace((*pan)[0], static_cast<int>(s / a_per));
      if (px > 1) tb = col_comm->bcast_inplace((*pan)[1], static_cast<int>(s / b_per));
      shardkit::Token::join(ta, tb).wait();
    }
  };
  // Which panels this rank copies (owner of a strided panel on an axis of more than one rank) and which need a
  // buffer (those, and every panel received).
  auto a_copies = [=](std::int64_t s) { return py > 1 && my_y == s / a_per && !a_panel(s).is_contiguous(); };
  auto b_copies = [=](std::int64_t s) { return px > 1 && my_x == s / b_per && !b_panel(s).is_contiguous(); };
  Method cp = part("copies");
  cp.run = [pan, panels, a_copies, b_copies, a_panel, b_panel] {
    for (std::int64_t s = 0; s < panels; ++s) {
      if (a_copies(s)) (*pan)[0].copy_from(a_panel(s));
      if (b_copies(s)) (*pan)[1].copy_from(b_panel(s));
    }
  };
  out.push_back(std::move(g));
  out.push_back(std::move(t));
  out.push_back(std::move(cp));
  // C and the panel buffers the call allocates: one per operand and slot (panels alternate slots) that some panel
  // of that slot needs.
  std::vector<shardkit::Shape> fresh = {{mloc, nloc}};
  for (int slot = 0; slot < 2; ++slot) {
    bool a_buf = false, b_buf = false;
    for (std::int64_t s = slot; s < panels; s += 2) {
      a_buf = a_buf || (py > 1 && (my_y != s / a_per || a_copies(s)));
      b_buf = b_buf || (px > 1 && (my_x != s / b_per || b_copies(s)));
    }
    if (a_buf) fresh.push_back({mloc, kp});
    if (b_buf) fresh.push_back({kp, nloc});
  }
  out.push_back(fresh_memory_part(part("fresh"), std::move(fresh), dt, dev));
  return out;
}

// ---- methods: ScaLAPACK ---------------------------------------------------------------------------------------------

#if SHARDKIT_HAVE_SCALAPACK

// BLACS' handle of an MPI communicator (BLACS gives one handle per communicator, however often asked: free it once).
class BlacsSystem {
 public:
  explicit BlacsSystem(MPI_Comm comm) : handle_(Csys2blacs_handle(comm)) {}
  ~BlacsSystem() { Cfree_blacs_system_handle(handle_); }
  BlacsSystem(const BlacsSystem&) = delete;
  BlacsSystem& operator=(const BlacsSystem&) = delete;
  int handle() const { return handle_; }

 private:
  int handle_;
};

// One BLACS grid over the benchmark's own duplicate of the world communicator, ranks placed row-major ("Row") as on
// shardkit's meshes, so process (r, c) of the grid is mesh coordinate (r, c).
class BlacsGrid {
 public:
  BlacsGrid(const BlacsSystem& system, Grid g) : grid_(g), context_(system.handle()) {
    Cblacs_gridinit(&context_, "Row", g.rows, g.cols);
    int nprow = 0, npcol = 0;
    Cblacs_gridinfo(context_, &nprow, &npcol, &row_, &col_);
    SHARDKIT_CHECK(nprow == g.rows && npcol == g.cols && row_ >= 0, "BLACS grid ", g.label(), " not set up");
  }
  ~BlacsGrid() { Cblacs_gridexit(context_); }
  BlacsGrid(const BlacsGrid&) = delete;
  BlacsGrid& operator=(const BlacsGrid&) = delete;
  int context() const { return context_; }
  int row() const { return row_; }
  int col() const { return col_; }
  const Grid& grid() const { return grid_; }

 private:
  Grid grid_;
  int context_ = -1, row_ = -1, col_ = -1;
};

// A and B of one grid and block size, shared by the configurations that differ only in PBLAS's panel width.
template <typename T>
struct PgemmInputs {
  std::vector<T> a, b;
  int desc_a[9] = {}, desc_b[9] = {};
  int m = 0, n = 0, k = 0, nb = 0;
};

template <typename T>
struct PgemmState {
  std::shared_ptr<const PgemmInputs<T>> in;
  std::vector<T> c;
  int desc_c[9] = {};
  int kb = 0;  // PILAENV for this configuration (0: the library's own)
};

// This rank's block-cyclic piece (column-major, leading dimension `lld`) of global matrix `which` (rows x cols).
template <typename T>
std::vector<T> block_cyclic(int which, int rows, int cols, int nb, const BlacsGrid& g, int* lld_out) {
  const int zero = 0;
  const int nprow = g.grid().rows, npcol = g.grid().cols, myrow = g.row(), mycol = g.col();
  const int lrows = numroc_(&rows, &nb, &myrow, &zero, &nprow);
  const int lcols = numroc_(&cols, &nb, &mycol, &zero, &npcol);
  const int lld = std::max(1, lrows);
  std::vector<T> out(static_cast<std::size_t>(lld) * static_cast<std::size_t>(std::max(1, lcols)));
  for (int lj = 0; lj < lcols; ++lj) {
    const std::int64_t gj = (static_cast<std::int64_t>(lj / nb) * npcol + mycol) * nb + lj % nb;
    for (int li = 0; li < lrows; ++li) {
      const std::int64_t gi = (static_cast<std::int64_t>(li / nb) * nprow + myrow) * nb + li % nb;
      out[static_cast<std::size_t>(lj) * lld + li] = static_cast<T>(shardkit::examples::matrix_value(which, gi, gj));
    }
  }
  *lld_out = lld;
  return out;
}

template <typename T>
std::shared_ptr<const PgemmInputs<T>> pgemm_inputs(const Dims& d, const BlacsGrid& g, int nb) {
  auto in = std::make_shared<PgemmInputs<T>>();
  in->m = static_cast<int>(d.m);
  in->n = static_cast<int>(d.n);
  in->k = static_cast<int>(d.k);
  in->nb = nb;
  const int zero = 0, ctx = g.context();
  int lld = 0, info = 0;
  in->a = block_cyclic<T>(0, in->m, in->k, nb, g, &lld);
  descinit_(in->desc_a, &in->m, &in->k, &nb, &nb, &zero, &zero, &ctx, &lld, &info);
  SHARDKIT_CHECK_EQ(info, 0, "descinit of A");
  in->b = block_cyclic<T>(1, in->k, in->n, nb, g, &lld);
  descinit_(in->desc_b, &in->k, &in->n, &nb, &nb, &zero, &zero, &ctx, &lld, &info);
  SHARDKIT_CHECK_EQ(info, 0, "descinit of B");
  return in;
}

template <typename T>
Method pgemm_method_typed(const std::shared_ptr<const PgemmInputs<T>>& in, const BlacsGrid& g, int kb) {
  Method m;
  m.kind = Kind::kScalapack;
  m.name = std::is_same_v<T, double> ? "pdgemm" : "psgemm";
  m.mesh = g.grid().label();
  m.nb = in->nb;
  {
    // The panel width this configuration runs with, as p?gemm will ask for it.
    const int ctx = g.context();
    const char prec = std::is_same_v<T, double> ? 'D' : 'S';
    g_pilaenv_override = kb;
    m.kb = pilaenv_(&ctx, &prec);
    g_pilaenv_override = 0;
    m.kb_tuned = kb > 0;
  }
  auto st = std::make_shared<PgemmState<T>>();
  st->in = in;
  st->kb = kb;
  const int zero = 0, ctx = g.context(), nb = in->nb;
  int info = 0;
  const int nprow = g.grid().rows, npcol = g.grid().cols, myrow = g.row(), mycol = g.col();
  const int crows = numroc_(&in->m, &nb, &myrow, &zero, &nprow);
  const int ccols = numroc_(&in->n, &nb, &mycol, &zero, &npcol);
  const int clld = std::max(1, crows);
  st->c.assign(static_cast<std::size_t>(clld) * static_cast<std::size_t>(std::max(1, ccols)), T{});
  descinit_(st->desc_c, &in->m, &in->n, &nb, &nb, &zero, &zero, &ctx, &clld, &info);
  SHARDKIT_CHECK_EQ(info, 0, "descinit of C");
  m.run = [st] {
    const PgemmInputs<T>& x = *st->in;
    const int one = 1;
    const T alpha = 1, beta = 0;
    g_pilaenv_override = st->kb;
    if constexpr (std::is_same_v<T, double>)
      pdgemm_("N", "N", &x.m, &x.n, &x.k, &alpha, x.a.data(), &one, &one, x.desc_a, x.b.data(), &one, &one, x.desc_b,
              &beta, st->c.data(), &one, &one, st->desc_c);
    else
      psgemm_("N", "N", &x.m, &x.n, &x.k, &alpha, x.a.data(), &one, &one, x.desc_a, x.b.data(), &one, &one, x.desc_b,
              &beta, st->c.data(), &one, &one, st->desc_c);
    g_pilaenv_override = 0;
  };
  m.local_error = [st, nb, nprow, npcol, myrow, mycol, crows, ccols, clld](const Reference& ref) {
    ErrorMax e;
    for (int lj = 0; lj < ccols; ++lj) {
      const std::int64_t gj = (static_cast<std::int64_t>(lj / nb) * npcol + mycol) * nb + lj % nb;
      for (int li = 0; li < crows; ++li) {
        const std::int64_t gi = (static_cast<std::int64_t>(li / nb) * nprow + myrow) * nb + li % nb;
        e.add(static_cast<double>(st->c[static_cast<std::size_t>(lj) * clld + li]), ref.at(gi, gj));
      }
    }
    return e.worst;
  };
  return m;
}

// The p?gemm configurations of one grid and block size: one per PBLAS panel width.
template <typename T>
std::vector<Method> pgemm_methods_typed(const Bench& b, const Dims& d, const BlacsGrid& g, int nb) {
  std::vector<Method> out;
  if (d.m > INT_MAX || d.n > INT_MAX || d.k > INT_MAX) {
    Method m;
    m.kind = Kind::kScalapack;
    m.name = std::is_same_v<T, double> ? "pdgemm" : "psgemm";
    m.mesh = g.grid().label();
    m.nb = nb;
    m.skipped = "ScaLAPACK takes int sizes";
    out.push_back(std::move(m));
    return out;
  }
  const auto in = pgemm_inputs<T>(d, g, nb);
  for (int kb : b.opt.kbs) out.push_back(pgemm_method_typed<T>(in, g, kb));
  return out;
}

std::vector<Method> pgemm_methods(const Bench& b, const Dims& d, const BlacsGrid& g, int nb) {
  return b.opt.dtype == DType::kFloat32 ? pgemm_methods_typed<float>(b, d, g, nb)
                                        : pgemm_methods_typed<double>(b, d, g, nb);
}

// The file name of the library that defines a symbol after the benchmark (what its ?gemm_ wrappers call).
std::string library_of(const char* symbol) {
  void* p = dlsym(RTLD_NEXT, symbol);
  Dl_info info{};
  if (!p || !dladdr(p, &info) || !info.dli_fname) return "?";
  return info.dli_fname;
}

#endif  // SHARDKIT_HAVE_SCALAPACK

// ---- reference and check --------------------------------------------------------------------------------------------

// The one-rank product, checked at a few entries against dot products straight from the formula (so that a wrong
// reference cannot pass wrong results), then broadcast to every rank. Throws when the reference itself is wrong.
Reference make_reference(const Bench& b, const Dims& d) {
  Reference ref;
  ref.n = d.n;
  ref.c.resize(static_cast<std::size_t>(d.m * d.n));
  int ok = 1;
  if (b.rank == 0) {
    const DType dt = b.opt.dtype;
    const Array a = shardkit::examples::matrix_block(0, 0, d.m, 0, d.k, dt);
    const Array bm = shardkit::examples::matrix_block(1, 0, d.k, 0, d.n, dt);
    Array c = Array::empty({d.m, d.n}, dt);
    shardkit::gemm(a, bm, c);
    shardkit::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        const T* p = static_cast<const T*>(c.data());
        for (std::size_t i = 0; i < ref.c.size(); ++i) ref.c[i] = static_cast<double>(p[i]);
      }
    });
    for (double v : ref.c) ref.scale = std::max(ref.scale, std::abs(v));
    for (std::int64_t s = 0; s < 16; ++s) {
      const std::int64_t i = (s * 7919) % d.m, j = (s * 104729 + 13) % d.n;
      long double dot = 0;
      for (std::int64_t l = 0; l < d.k; ++l) {
        // The inputs rounded to the dtype, as the GEMMs see them.
        const double x = dt == DType::kFloat32 ? static_cast<float>(shardkit::examples::matrix_value(0, i, l))
                                               : shardkit::examples::matrix_value(0, i, l);
        const double y = dt == DType::kFloat32 ? static_cast<float>(shardkit::examples::matrix_value(1, l, j))
                                               : shardkit::examples::matrix_value(1, l, j);
        dot += static_cast<long double>(x) * y;
      }
      if (!(std::abs(static_cast<double>(dot) - ref.at(i, j)) <= tolerance(dt, d.k) * std::max(ref.scale, 1e-300)))
        ok = 0;
    }
  }
  SHARDKIT_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, b.control));
  if (!ok)
    throw std::runtime_error(concat("the one-rank reference of ", d.label(), " disagrees with direct dot products"));
  SHARDKIT_MPI_CHECK(MPI_Bcast(&ref.scale, 1, MPI_DOUBLE, 0, b.control));
  // In pieces: MPI counts are ints.
  constexpr std::size_t kChunk = std::size_t{1} << 28;
  for (std::size_t off = 0; off < ref.c.size(); off += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, ref.c.size() - off));
    SHARDKIT_MPI_CHECK(MPI_Bcast(ref.c.data() + off, count, MPI_DOUBLE, 0, b.control));
  }
  return ref;
}

// ---- output ---------------------------------------------------------------------------------------------------------

// The 1-minute load average (Linux; -1 elsewhere): other work on the machine shows up in it, and the timings with it.
double load_average() {
  double v = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &v) != 1) v = -1;
    std::fclose(f);
  }
  return v;
}

struct SizeResult {
  Dims dims;
  double load_before = -1, load_after = -1;  // load_average() around the measurements
  std::vector<Method> methods;
  const Method* blas = nullptr;
  const Method* best_shardkit = nullptr;
  const Method* best_collective = nullptr;   // best of the algorithms that communicate
  const Method* best_pgemm = nullptr;        // over every grid, block size and panel width
  const Method* best_pgemm_stock = nullptr;  // with the library's own panel width
  double tolerance = 0;
};

const Method* fastest(const std::vector<Method>& ms, const std::function<bool(const Method&)>& keep) {
  const Method* best = nullptr;
  for (const Method& m : ms)
    if (m.measured() && keep(m) && (!best || m.t_median() < best->t_median())) best = &m;
  return best;
}

void summarise(SizeResult& r) {
  r.blas = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kBaseline; });
  r.best_shardkit = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kShardkit; });
  r.best_collective =
      fastest(r.methods, [](const Method& m) { return m.kind == Kind::kShardkit && m.name != "local"; });
  r.best_pgemm = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kScalapack; });
  r.best_pgemm_stock = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kScalapack && !m.kb_tuned; });
}

// GFLOP/s at a time; efficiency = GFLOP/s / (ranks x one-rank GFLOP/s) = t1 / (ranks t).
double gflops(const Dims& d, double t) {
  return d.flops() / t / 1e9;
}

std::optional<double> efficiency(const SizeResult& r, const Method& m, bool use_min, int ranks) {
  if (!r.blas || m.kind == Kind::kBaseline) return std::nullopt;
  const double t1 = use_min ? r.blas->t_min() : r.blas->t_median();
  const double t = use_min ? m.t_min() : m.t_median();
  return t1 / (ranks * t);
}

// Speed relative to the best pdgemm (by medians): > 1 is faster.
std::optional<double> vs_pgemm(const SizeResult& r, const Method& m) {
  if (!r.best_pgemm || m.kind == Kind::kBaseline || m.kind == Kind::kProfile) return std::nullopt;
  return r.best_pgemm->t_median() / m.t_median();
}

std::string fmt(std::optional<double> v, const char* f = "%.3f") {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, f, *v);
  return buf;
}

void print_size(std::FILE* f, const SizeResult& r, int ranks) {
  const Dims& d = r.dims;
  std::fprintf(f, "#\n# C(%lld x %lld) = A(%lld x %lld) @ B(%lld x %lld): %.3g GFLOP; load average %.2f -> %.2f\n",
               static_cast<long long>(d.m), static_cast<long long>(d.n), static_cast<long long>(d.m),
               static_cast<long long>(d.k), static_cast<long long>(d.k), static_cast<long long>(d.n), d.flops() / 1e9,
               r.load_before, r.load_after);
  std::fprintf(f,
               "# %-10s %-15s %-5s %4s %4s %10s %10s %9s %9s %7s %7s %8s %10s\n"
               "# %-10s %-15s %-5s %4s %4s %10s %10s %9s %9s %7s %7s %8s %10s\n",
               "size", "method", "mesh", "nb", "kb", "min", "median", "GFLOP/s", "GFLOP/s", "eff", "eff", "x best",
               "max rel", "", "", "", "", "", "(ms)", "(ms)", "(min)", "(median)", "(med)", "(min)", "pdgemm", "error");
  for (const Method& m : r.methods) {
    if (m.kind == Kind::kProfile) continue;
    if (!m.measured()) {
      std::fprintf(f, "  %-10s %-15s %-5s %4s %4s skipped: %s\n", d.label().c_str(), m.label().c_str(), m.mesh.c_str(),
                   m.nb ? std::to_string(m.nb).c_str() : "-", "-", m.skipped.c_str());
      continue;
    }
    std::string err = "-";
    if (m.error) err = fmt(m.error, "%.2e") + (*m.error <= r.tolerance ? "" : " BAD");
    // A tuned panel width is marked with '*'.
    const std::string kb = m.kb ? std::to_string(m.kb) + (m.kb_tuned ? "*" : "") : "-";
    std::fprintf(f, "  %-10s %-15s %-5s %4s %4s %10.2f %10.2f %9.2f %9.2f %7s %7s %8s %10s\n", d.label().c_str(),
                 m.label().c_str(), m.mesh.c_str(), m.nb ? std::to_string(m.nb).c_str() : "-", kb.c_str(),
                 1e3 * m.t_min(), 1e3 * m.t_median(), gflops(d, m.t_min()), gflops(d, m.t_median()),
                 fmt(efficiency(r, m, false, ranks)).c_str(), fmt(efficiency(r, m, true, ranks)).c_str(),
                 fmt(vs_pgemm(r, m)).c_str(), err.c_str());
  }
  // Summary line: the goal's two ratios.
  std::string s = concat("# ", d.label(), ":");
  if (r.blas) s += concat(" one-rank BLAS ", fmt(gflops(d, r.blas->t_median()), "%.2f"), " GFLOP/s;");
  if (r.best_shardkit) {
    s += concat(" best shardkit ", r.best_shardkit->name, " ", fmt(gflops(d, r.best_shardkit->t_median()), "%.2f"),
                " GFLOP/s");
    if (auto e = efficiency(r, *r.best_shardkit, false, ranks)) s += concat(", efficiency ", fmt(e));
    if (auto v = vs_pgemm(r, *r.best_shardkit)) s += concat(", ", fmt(v), "x pdgemm");
    s += ";";
  }
  if (r.best_collective && r.best_collective != r.best_shardkit) {
    s += concat(" best communicating ", r.best_collective->name, " ",
                fmt(gflops(d, r.best_collective->t_median()), "%.2f"), " GFLOP/s");
    if (auto e = efficiency(r, *r.best_collective, false, ranks)) s += concat(", efficiency ", fmt(e));
    if (auto v = vs_pgemm(r, *r.best_collective)) s += concat(", ", fmt(v), "x pdgemm");
    s += ";";
  }
  auto pgemm = [&](const char* what, const Method& m) {
    s += concat(" ", what, " ", m.name, " grid ", m.mesh, " nb ", m.nb, " kb ", m.kb, " ",
                fmt(gflops(d, m.t_median()), "%.2f"), " GFLOP/s");
    if (auto e = efficiency(r, m, false, ranks)) s += concat(", efficiency ", fmt(e));
  };
  if (r.best_pgemm) pgemm("best", *r.best_pgemm);
  if (r.best_pgemm_stock && r.best_pgemm_stock != r.best_pgemm) {
    s += ";";
    pgemm("best with the library's panel width:", *r.best_pgemm_stock);
    if (r.best_shardkit)
      s += concat(" (best shardkit ", fmt(r.best_pgemm_stock->t_median() / r.best_shardkit->t_median()), "x that)");
  }
  std::fprintf(f, "%s (medians)\n", s.c_str());
}

const Method* find(const SizeResult& r, const std::string& name, const std::string& part) {
  for (const Method& m : r.methods)
    if (m.name == name && m.part == part && m.measured() && (m.kind == Kind::kShardkit) == part.empty()) return &m;
  return nullptr;
}

// Per algorithm: matmul as called (overlap by default), with overlap forced on and off, and the parts alone (medians).
void print_profile(std::FILE* f, const SizeResult& r, int ranks, bool overlap_default) {
  const Dims& d = r.dims;
  bool header = false;
  for (MatmulAlgorithm alg : kAllAlgorithms) {
    const std::string name = shardkit::matmul_algorithm_name(alg);
    const Method* as_called = find(r, name, "");
    const Method* gemm = find(r, name, "gemm");
    if (!as_called || !gemm) continue;
    if (!header) {
      std::fprintf(f,
                   "# profile %s (medians, ms): default = matmul as called (overlap %s by default here); overlap / "
                   "no-overlap = forced on / off (off: each transfer completed before its GEMM); gemm/comm/elementwise "
                   "= those steps alone (warm buffers); fresh = allocating and first touching the call's own buffers "
                   "(page faults); rest = no-overlap (local: default) - parts; hidden = (no-overlap - overlap) / comm "
                   "(negative: overlap costs); gemm eff = one-rank time / (ranks x gemm)\n",
                   d.label().c_str(), overlap_default ? "on" : "off");
      std::fprintf(f, "# %-10s %-15s %9s %9s %11s %9s %9s %12s %9s %9s %8s %9s\n", "size", "algorithm", "default",
                   "overlap", "no-overlap", "gemm", "comm", "elementwise", "fresh", "rest", "hidden", "gemm eff");
      header = true;
    }
    const Method* on = find(r, name, "overlap_on");
    const Method* off = find(r, name, "no_overlap");
    const Method* comm = find(r, name, "comm");
    const Method* elem = find(r, name, "adds");
    if (!elem) elem = find(r, name, "copies");
    const Method* fresh = find(r, name, "fresh");
    auto ms = [](const Method* m) -> std::optional<double> {
      return m ? std::optional<double>(1e3 * m->t_median()) : std::nullopt;
    };
    std::optional<double> rest, hidden, geff;
    double parts = gemm->t_median();
    for (const Method* x : {comm, elem, fresh})
      if (x) parts += x->t_median();
    rest = 1e3 * ((off ? off : as_called)->t_median() - parts);
    if (on && off && comm && comm->t_median() > 0) hidden = (off->t_median() - on->t_median()) / comm->t_median();
    if (r.blas) geff = r.blas->t_median() / (ranks * gemm->t_median());
    std::fprintf(f, "  %-10s %-15s %9s %9s %11s %9s %9s %12s %9s %9s %8s %9s\n", d.label().c_str(), name.c_str(),
                 fmt(ms(as_called), "%.2f").c_str(), fmt(ms(on), "%.2f").c_str(), fmt(ms(off), "%.2f").c_str(),
                 fmt(ms(gemm), "%.2f").c_str(), fmt(ms(comm), "%.2f").c_str(), fmt(ms(elem), "%.2f").c_str(),
                 fmt(ms(fresh), "%.2f").c_str(), fmt(rest, "%.2f").c_str(), fmt(hidden, "%.2f").c_str(),
                 fmt(geff).c_str());
  }
}

// p?gemm's split: its time inside the local ?gemm_ calls (slowest rank) and the rest (broadcasts, waiting for the
// other ranks, packing). Local GFLOP/s = this rank's share of the flops / its time in ?gemm_.
void print_pgemm_split(std::FILE* f, const SizeResult& r, int ranks) {
  bool header = false;
  for (const Method& m : r.methods) {
    if (m.kind != Kind::kScalapack || !m.measured() || !m.inner_gemm_s) continue;
    if (!header) {
      std::fprintf(f,
                   "# %s split %s (medians, ms): in ?gemm_ = ScaLAPACK's local GEMM calls (slowest rank); rest = "
                   "total - that (communication, waiting, packing)\n",
                   m.name.c_str(), r.dims.label().c_str());
      std::fprintf(f, "# %-10s %-15s %-5s %4s %4s %9s %9s %9s %8s %14s\n", "size", "method", "grid", "nb", "kb",
                   "total", "in gemm", "rest", "calls", "local GFLOP/s");
      header = true;
    }
    const double total = m.t_median(), in_gemm = *m.inner_gemm_s;
    std::fprintf(f, "  %-10s %-15s %-5s %4d %4d %9.2f %9.2f %9.2f %8.0f %14.2f\n", r.dims.label().c_str(),
                 m.name.c_str(), m.mesh.c_str(), m.nb, m.kb, 1e3 * total, 1e3 * in_gemm, 1e3 * (total - in_gemm),
                 *m.inner_calls, r.dims.flops() / ranks / in_gemm / 1e9);
  }
}

std::string json_method(const SizeResult& r, const Method& m, int ranks) {
  const Dims& d = r.dims;
  std::string j =
      concat("{\"m\":", d.m, ",\"n\":", d.n, ",\"k\":", d.k, ",\"kind\":", json_string(kind_name(m.kind)),
             ",\"method\":", json_string(m.name), ",\"part\":", json_string(m.part), ",\"mesh\":", json_string(m.mesh),
             ",\"nb\":", m.nb, ",\"kb\":", m.kb, ",\"kb_tuned\":", m.kb_tuned ? "true" : "false");
  if (!m.measured()) return j + concat(",\"skipped\":", json_string(m.skipped), "}");
  j += ",\"seconds\":[";
  for (std::size_t i = 0; i < m.seconds.size(); ++i) j += concat(i ? "," : "", json_number(m.seconds[i]));
  j += concat("],\"ms_min\":", json_number(1e3 * m.t_min()), ",\"ms_median\":", json_number(1e3 * m.t_median()));
  if (m.kind != Kind::kProfile || m.part == "no_overlap" || m.part == "overlap_on")
    j += concat(",\"gflops_min\":", json_number(gflops(d, m.t_min())),
                ",\"gflops_median\":", json_number(gflops(d, m.t_median())),
                ",\"efficiency_median\":", json_number(efficiency(r, m, false, ranks)),
                ",\"efficiency_min\":", json_number(efficiency(r, m, true, ranks)),
                ",\"vs_best_pgemm_median\":", json_number(vs_pgemm(r, m)));
  if (m.inner_gemm_s)
    j += concat(",\"gemm_ms_median\":", json_number(1e3 * *m.inner_gemm_s),
                ",\"gemm_calls\":", json_number(m.inner_calls));
  if (m.error)
    j += concat(",\"max_rel_error\":", json_number(m.error), ",\"ok\":", *m.error <= r.tolerance ? "true" : "false");
  return j + "}";
}

std::string json_best(const SizeResult& r, const Method* m, int ranks) {
  if (!m) return "null";
  return concat("{\"method\":", json_string(m->name), ",\"mesh\":", json_string(m->mesh), ",\"nb\":", m->nb,
                ",\"kb\":", m->kb, ",\"gflops_median\":", json_number(gflops(r.dims, m->t_median())),
                ",\"efficiency_median\":", json_number(efficiency(r, *m, false, ranks)),
                ",\"vs_best_pgemm_median\":", json_number(vs_pgemm(r, *m)), "}");
}

void write_json(const Bench& b, const std::vector<SizeResult>& results, const std::string& blas_library) {
  const Options& o = b.opt;
  std::string grids, nbs, kbs;
  for (const Grid& g : b.grids) grids += concat(grids.empty() ? "" : ",", json_string(g.label()));
  for (int nb : o.nbs) nbs += concat(nbs.empty() ? "" : ",", nb);
  for (int kb : o.kbs) kbs += concat(kbs.empty() ? "" : ",", kb);
  std::string j = concat(
      "{\"benchmark\":\"matmul\",\"ranks\":", b.size, ",\"dtype\":", json_string(shardkit::dtype_name(o.dtype)),
      ",\"host\":", json_string(b.rt.host()), ",\"mpi\":", json_string(shardkit::mpi_library_version()),
      ",\"threads\":", o.threads, ",\"repeats\":", o.repeats, ",\"warmup\":", o.warmup,
      ",\"scalapack\":", SHARDKIT_HAVE_SCALAPACK ? "true" : "false", ",\"blas_library\":", json_string(blas_library),
      ",\"line_mesh\":", json_string(shape_label(b.line_mesh.shape())),
      ",\"summa_mesh\":", json_string(shape_label(b.summa_mesh.shape())), ",\"grids\":[", grids, "],\"nb\":[", nbs,
      "],\"pblas_kb\":[", kbs, "],\"check\":", o.check ? "true" : "false",
      ",\"profile\":", o.profile ? "true" : "false",
      ",\"overlap_default\":", shardkit::matmul_overlap_default(b.rt.device()) ? "true" : "false");
  j += ",\"summary\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const SizeResult& r = results[i];
    j += concat(i ? "," : "", "\n  {\"m\":", r.dims.m, ",\"n\":", r.dims.n, ",\"k\":", r.dims.k,
                ",\"load_before\":", json_number(r.load_before), ",\"load_after\":", json_number(r.load_after),
                ",\"blas_gflops_median\":",
                json_number(r.blas ? std::optional(gflops(r.dims, r.blas->t_median())) : std::nullopt),
                ",\"best_shardkit\":", json_best(r, r.best_shardkit, b.size),
                ",\"best_communicating\":", json_best(r, r.best_collective, b.size),
                ",\"best_pgemm\":", json_best(r, r.best_pgemm, b.size),
                ",\"best_pgemm_stock_kb\":", json_best(r, r.best_pgemm_stock, b.size), "}");
  }
  j += "\n],\"results\":[";
  bool first = true;
  for (const SizeResult& r : results)
    for (const Method& m : r.methods) {
      j += concat(first ? "" : ",", "\n  ", json_method(r, m, b.size));
      first = false;
    }
  j += "\n]}\n";
  if (o.json == "-") {
    std::fputs(j.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  std::FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) throw std::runtime_error(concat("cannot write ", o.json, ": ", std::strerror(errno)));
  const bool ok = std::fputs(j.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(concat("cannot write ", o.json));
}

// ---- main -----------------------------------------------------------------------------------------------------------

int run(const shardkit::Runtime& rt, const Options& opt) {
  const bool root = rt.rank() == 0;
  std::FILE* table = opt.json == "-" ? stderr : stdout;

  // Same BLAS threads for every method: shardkit's GEMMs, the one-rank GEMM and ScaLAPACK's (Debian's libblas.so.3
  // of OpenBLAS is an interface over the same libopenblas, whose thread count is process-wide; set it through both
  // names all the same, in case another BLAS is behind ScaLAPACK).
  shardkit::set_blas_num_threads(opt.threads);
  std::string blas_library = "shardkit's CBLAS";
#if SHARDKIT_HAVE_SCALAPACK
  openblas_set_num_threads(opt.threads);
  blas_library = library_of("dgemm_");
#endif

  // The fast path, set explicitly: SHARDKIT_CHECK / SHARDKIT_TIMEOUT_S in the environment (ctest sets both) would add
  // a signature exchange or polling to every transfer and skew the comparison.
  shardkit::CommOptions copts;
  copts.backend = shardkit::BackendKind::kMpi;
  copts.check = false;
  copts.timeout = std::chrono::milliseconds(0);
  copts.async = false;
  copts.name = "bench";
  auto comm = shardkit::Communicator::world(rt, copts);
  const shardkit::MpiComm control = shardkit::MpiComm::dup(rt.world());
  const shardkit::MpiComm blacs_comm = shardkit::MpiComm::dup(rt.world());

  const int p = rt.size();
  Mesh line = opt.mesh.empty() ? Mesh::line("x", comm) : Mesh::parse(opt.mesh, comm);
  Mesh summa = line;
  if (opt.mesh.empty()) {
    const auto [r, c] = squarest(p);
    summa = Mesh({r, c}, {"x", "y"}, comm);
  }
  Bench b{opt, rt, shardkit::to_mpi<MPI_Comm>(control.handle()), comm, line, summa, {}, rt.rank(), p};
  b.grids = parse_grids(opt.grids, p, summa);

  if (root) {
    std::fprintf(table, "# bench_matmul: shardkit matmul vs one-rank BLAS and ScaLAPACK p?gemm, %s\n",
                 std::string(shardkit::dtype_name(opt.dtype)).c_str());
    std::fprintf(table, "# %d ranks, rank 0 on %s, device %s; %s\n", p, rt.host().c_str(),
                 rt.device().to_string().c_str(), shardkit::mpi_library_version().c_str());
    std::fprintf(table, "# BLAS threads per rank: %d (shardkit reports %d", opt.threads, shardkit::blas_num_threads());
#if SHARDKIT_HAVE_SCALAPACK
    std::fprintf(table, ", OpenBLAS %d); ScaLAPACK's dgemm_ from %s\n", openblas_get_num_threads(),
                 blas_library.c_str());
#else
    std::fprintf(table, "); ScaLAPACK not found at build time: no pdgemm (apt install libscalapack-openmpi-dev)\n");
#endif
    std::string grids;
    for (const Grid& g : b.grids) grids += (grids.empty() ? "" : ",") + g.label();
    std::string nbs, kbs;
    for (int nb : opt.nbs) nbs += concat(nbs.empty() ? "" : ",", nb);
    for (int kb : opt.kbs) kbs += concat(kbs.empty() ? "" : ",", kb ? std::to_string(kb) : "library's");
    const std::string pgemm =
        SHARDKIT_HAVE_SCALAPACK && opt.pdgemm
            ? concat("pdgemm grids ", grids, ", nb ", nbs, ", PBLAS panel width kb ", kbs, " ('*': tuned)")
            : std::string("no pdgemm");
    std::fprintf(table, "# meshes: %s for local/allgather/reduce_scatter, %s for summa; %s\n",
                 shape_label(line.shape()).c_str(), shape_label(summa.shape()).c_str(), pgemm.c_str());
    std::fprintf(table,
                 "# %d warm-up and %d timed runs per method, alternating; time = slowest rank after a barrier; "
                 "eff = GFLOP/s / (%d x one-rank GFLOP/s); x best pdgemm = its median time / this one%s\n",
                 opt.warmup, opt.repeats, p, opt.check ? "; results checked" : "");
    std::fprintf(table, "# matmul overlaps transfers with GEMMs by default here: %s (%d cores on this host, %d ranks on "
                 "this host, %d BLAS threads each)\n", shardkit::matmul_overlap_default(rt.device()) ? "yes" : "no",
                 static_cast<int>(std::thread::hardware_concurrency()), rt.local_size(),
                 shardkit::blas_num_threads());
    std::fflush(table);
  }

#if SHARDKIT_HAVE_SCALAPACK
  std::optional<BlacsSystem> blacs_system;
  std::vector<std::unique_ptr<BlacsGrid>> blacs;
  if (opt.pdgemm) {
    blacs_system.emplace(shardkit::to_mpi<MPI_Comm>(blacs_comm.handle()));
    for (const Grid& g : b.grids) blacs.push_back(std::make_unique<BlacsGrid>(*blacs_system, g));
  }
#endif

  std::vector<SizeResult> results;
  bool all_ok = true;
  for (const Dims& d : opt.sizes) {
    SizeResult r;
    r.dims = d;
    r.tolerance = tolerance(opt.dtype, d.k);
    std::vector<Method>& ms = r.methods;
    InputCache cache;
    if (opt.baseline) ms.push_back(baseline_method(b, d));
    for (MatmulAlgorithm alg : opt.algorithms) ms.push_back(shardkit_method(b, d, alg, std::nullopt, cache));
#if SHARDKIT_HAVE_SCALAPACK
    for (const auto& g : blacs)
      for (int nb : opt.nbs)
        for (Method& m : pgemm_methods(b, d, *g, nb)) ms.push_back(std::move(m));
#endif
    if (opt.profile)
      for (MatmulAlgorithm alg : opt.algorithms) {
        if (alg != MatmulAlgorithm::kLocal)
          for (bool overlap : {true, false}) ms.push_back(shardkit_method(b, d, alg, overlap, cache));
        for (Method& m : profile_methods(b, d, alg, cache)) ms.push_back(std::move(m));
      }

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
    for (Method& m : ms) {
      if (m.gemm_seconds.empty()) continue;
      double mine[2] = {median(m.gemm_seconds), median(m.gemm_calls)}, most[2] = {0, 0};
      SHARDKIT_MPI_CHECK(MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, b.control));
      if (most[1] > 0) {  // 0 calls: ScaLAPACK's GEMMs did not come through the benchmark's ?gemm_
        m.inner_gemm_s = most[0];
        m.inner_calls = most[1];
      }
    }

    if (opt.check) {
      const Reference ref = make_reference(b, d);
      for (Method& m : ms) {
        if (!m.measured() || !m.local_error) continue;
        const double mine = m.local_error(ref);
        double worst = 0;
        SHARDKIT_MPI_CHECK(MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, b.control));
        m.error = worst / std::max(ref.scale, std::numeric_limits<double>::min());
        all_ok = all_ok && *m.error <= r.tolerance;
      }
    }
    summarise(r);
    if (root) {
      print_size(table, r, p);
      if (opt.profile) {
        print_profile(table, r, p, shardkit::matmul_overlap_default(rt.device()));
        print_pgemm_split(table, r, p);
      }
      std::fflush(table);
    }
    // Free this size's buffers before the next: the largest sizes need the memory.
    cache.clear();
    for (Method& m : ms) {
      m.prepare = {};
      m.run = {};
      m.local_error = {};
    }
    results.push_back(std::move(r));  // moving the vector of methods keeps the summary's pointers valid
  }

#if SHARDKIT_HAVE_SCALAPACK
  blacs.clear();
  blacs_system.reset();
  if (opt.pdgemm) Cblacs_exit(1);  // 1: MPI stays up, the Runtime finalises it
#endif

  if (root) {
    if (opt.check)
      std::fprintf(table, "# Check: %s (max |C - R| / max |R| <= 64 eps sqrt(K))\n", all_ok ? "OK" : "FAILED");
    std::fflush(table);
    if (!opt.json.empty()) write_json(b, results, blas_library);
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    shardkit::Runtime rt(&argc, &argv);
    const bool root = rt.rank() == 0;
    Options opt;
    try {
      opt = parse_args(argc, argv);
    } catch (const UsageError& e) {
      // Every rank parses the same arguments and stops here alike.
      if (root) std::fprintf(stderr, "bench_matmul: %s\n%s", e.what(), kUsage);
      return 2;
    }
    if (opt.help) {
      if (root) std::fputs(kUsage, stdout);
      return 0;
    }
    try {
      return run(rt, opt);
    } catch (const UsageError& e) {
      if (root) std::fprintf(stderr, "bench_matmul: %s\n%s", e.what(), kUsage);
      return 2;
    } catch (const std::exception& e) {
      // The other ranks may be inside a collective: end the job rather than hang in MPI_Finalize.
      std::fprintf(stderr, "bench_matmul: rank %d: %s\n", rt.rank(), e.what());
      shardkit::request_abort_at_exit(e.what());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_matmul: %s\n", e.what());
    return 1;
  }
}
