#pragma once

// bench_matmul's pieces: the options, a Method (one thing timed: a shardkit algorithm, the one-rank GEMM, a p?gemm
// configuration or one part of an algorithm), the measurement every method shares, and the files that make methods:
// blas_reference.cpp (the one-rank GEMM and the --check reference), algorithms.cpp (shardkit::matmul per algorithm,
// and the --profile front end), local.cpp / allgather_ring.cpp / reduce_scatter_ring.cpp / summa.cpp (each
// algorithm's parts alone, --profile), pdgemm.cpp (ScaLAPACK).

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardkit/core/array.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"
#include "shardkit/sharding/sharding.hpp"
#include "timing.hpp"

#ifndef SHARDKIT_HAVE_SCALAPACK
#define SHARDKIT_HAVE_SCALAPACK 0
#endif

namespace shardkit::bench {

/// The algorithms --algos all runs, in table order.
inline constexpr MatmulAlgorithm kAllAlgorithms[] = {MatmulAlgorithm::kLocal, MatmulAlgorithm::kAllGather,
                                                     MatmulAlgorithm::kReduceScatter, MatmulAlgorithm::kSumma};

/// One problem size: C(m x n) = A(m x k) @ B(k x n).
struct Dims {
  std::int64_t m = 0, n = 0, k = 0;
  bool square() const { return m == n && n == k; }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::string label() const { return square() ? std::to_string(n) : detail::concat(m, "x", n, "x", k); }
};

/// The command line.
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

/// The usage text (-h).
extern const char* const kUsage;

/// Parses the command line (every rank alike). @throws UsageError.
Options parse_args(int argc, char** argv);

/// A p?gemm process grid.
struct Grid {
  int rows = 1, cols = 1;
  std::string label() const { return detail::concat(rows, "x", cols); }
};

/// The squarest 2-d factorisation of p, rows >= columns (as examples/distributed_matmul picks SUMMA's mesh).
std::pair<std::int64_t, std::int64_t> squarest(std::int64_t p);

/// "2x1" for shape {2, 1}.
std::string shape_label(const std::vector<std::int64_t>& shape);

/// The grids --grid asks for (default: SUMMA's mesh). @throws UsageError for a grid of another rank count.
std::vector<Grid> parse_grids(const std::vector<std::string>& texts, int p, const Mesh& summa_mesh);

/// The one-rank product, as double, broadcast to every rank for --check, with max |R|.
struct Reference {
  std::vector<double> c;  // row-major m x n
  double scale = 0;       // max |R|
  std::int64_t n = 0;
  double at(std::int64_t i, std::int64_t j) const { return c[static_cast<std::size_t>(i * n + j)]; }
};

/// Accumulates max |C - R| over one rank's entries; a NaN or infinity anywhere makes it infinite.
struct ErrorMax {
  double worst = 0;
  void add(double got, double want);
};

/// The bound of --check on max |C - R| / max |R|.
double tolerance(DType d, std::int64_t k);

/// What a method is, for the table and the JSON's "kind".
enum class Kind { kBaseline, kShardkit, kScalapack, kProfile };

/// One thing timed: a shardkit algorithm, the one-rank GEMM, a pdgemm configuration, or one part of an algorithm
/// (--profile).
struct Method {
  Kind kind = Kind::kShardkit;
  std::string name;               // "blas", "local", "allgather", ..., "pdgemm"; profile: the algorithm's name
  std::string part;               // profile only: "overlap_on", "no_overlap", "gemm", "comm", "adds", "copies", "fresh"
  std::string mesh;               // "2", "2x1" (blas: "1")
  int nb = 0;                     // pdgemm's block size
  int kb = 0;                     // pdgemm's PBLAS panel width (PILAENV)
  bool kb_tuned = false;          // kb set by --pblas-kb rather than the library's own
  std::function<void()> prepare;  // before each measurement, untimed (drops the last result)
  std::function<void()> run;      // the timed call (collective, except for the baseline)
  std::function<void(Method&)> after_timed;             // after each timed (not warm-up) measurement, untimed
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

/// What the methods are built and measured with.
struct Bench {
  const Options& opt;
  const Runtime& rt;
  MPI_Comm control;  // barriers, timings, checks: the measured communicators see no extra traffic
  std::shared_ptr<Communicator> comm;
  Mesh line_mesh;   // the 1-d algorithms
  Mesh summa_mesh;  // SUMMA
  std::vector<Grid> grids;
  int rank = 0, size = 1;
};

/// Measures `m` once (barrier, the call, the slowest rank's time; the one-rank GEMM on rank 0 alone), keeping the
/// time when `record` (not for warm-up runs). An algorithm the sizes do not fit throws InvalidArgument on every rank
/// alike: that marks it skipped. Returns whether it ran.
bool measure(const Bench& b, Method& m, bool record);

/// The 1-minute load average (Linux; -1 elsewhere): other work on the machine shows up in it, and the timings with it.
double load_average();

/// For the methods that tallied their inner GEMMs: the medians, maximum over ranks, into inner_gemm_s / inner_calls.
void summarise_inner_gemms(const Bench& b, std::vector<Method>& ms);

/// The one-rank GEMM on rank 0 (the other ranks wait, asleep).
Method blas_method(const Bench& b, const Dims& d);

/// The one-rank product on rank 0, checked against direct dot products, broadcast to every rank.
/// @throws std::runtime_error when the reference itself is wrong.
Reference make_reference(const Bench& b, const Dims& d);

/// An algorithm's operands in its natural layout, shared by its methods of one size.
struct Inputs {
  ShardedArray a, b;
};
using InputCache = std::vector<std::pair<MatmulAlgorithm, std::shared_ptr<const Inputs>>>;

/// shardkit::matmul with `alg` on operands in its natural layout. overlap unset: matmul's default (the benchmark's
/// own row); set: forced on ("overlap_on") or off ("no_overlap"), for the profile.
Method shardkit_method(const Bench& b, const Dims& d, MatmulAlgorithm alg, std::optional<bool> overlap,
                       InputCache& cache);

/// The parts of `alg` run alone (--profile): none where the algorithm does not run at these sizes.
std::vector<Method> profile_methods(const Bench& b, const Dims& d, MatmulAlgorithm alg, InputCache& cache);

/// What one algorithm's parts are made from: its mesh and this rank's blocks of A and B in its natural layout (views
/// of the shared inputs: the closures that copy them keep their storage alive).
struct PartContext {
  const Dims& d;
  const Mesh& mesh;
  Array a, bl;
  DType dt;
  Device dev;
  std::string algorithm;
  /// An empty profile method of this algorithm named `name`.
  Method part(std::string name) const;
};

/// Allocating the buffers one call allocates (each written at least once) and touching every page, as the call does:
/// large host allocations come straight from the kernel, so this is the page-fault cost the call pays every time.
Method fresh_memory_part(Method m, std::vector<Shape> shapes, DType dt, Device dev);

/// The ring the 1-d collective algorithms run on: the line mesh's communicator, this rank and its neighbours.
struct Ring {
  std::shared_ptr<Communicator> comm;
  std::int64_t p = 1;
  int i = 0, left = 0, right = 0;
};

/// Each algorithm's parts, mirroring the steps the library takes (one file each); the ring algorithms run only where
/// m and k divide by the ring's size, SUMMA only where the sizes divide by its mesh.
std::vector<Method> local_parts(const PartContext& c);
std::vector<Method> allgather_parts(const PartContext& c, const Ring& ring);
std::vector<Method> reduce_scatter_parts(const PartContext& c, const Ring& ring);
std::vector<Method> summa_parts(const PartContext& c);

/// One size's methods, measured, and the best of each kind.
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

/// ScaLAPACK's side: BLACS grids over their own duplicate of the world communicator, and the p?gemm methods on them
/// (pdgemm.cpp, built where ScaLAPACK was found: SHARDKIT_HAVE_SCALAPACK).
class Scalapack {
 public:
  /// Sets up one BLACS grid per `grids` entry over `comm`.
  Scalapack(MPI_Comm comm, const std::vector<Grid>& grids);
  ~Scalapack();
  Scalapack(const Scalapack&) = delete;
  Scalapack& operator=(const Scalapack&) = delete;

  /// The p?gemm configurations of one size: for each grid, block size (--nb) and panel width (--pblas-kb).
  std::vector<Method> methods(const Bench& b, const Dims& d) const;

  /// Releases BLACS once every Scalapack is gone (MPI stays up: the Runtime finalises it).
  static void release_blacs();
  /// Sets OpenBLAS's thread count by name (ScaLAPACK's GEMMs too).
  static void set_blas_threads(int n);
  /// OpenBLAS's thread count.
  static int blas_threads();
  /// The file of the BLAS that ScaLAPACK's dgemm_ calls.
  static std::string blas_library();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardkit::bench
