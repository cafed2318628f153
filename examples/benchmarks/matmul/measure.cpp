// How bench_matmul measures a method, and the tolerance of its checks.

#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

#include "bench.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::bench {

namespace {

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

// One measurement: barrier, the call, the slowest rank's time. The one-rank GEMM runs on rank 0 only.
double measure_once(const Bench& b, Method& m) {
  if (m.prepare) m.prepare();
  if (m.kind != Kind::kBaseline) return time_slowest(b.control, m.run);
  SHARDKIT_MPI_CHECK(MPI_Barrier(b.control));
  double seconds = 0;
  if (b.rank == 0) {
    const double t0 = now();
    m.run();
    seconds = now() - t0;
  }
  quiet_barrier(b.control);
  SHARDKIT_MPI_CHECK(MPI_Bcast(&seconds, 1, MPI_DOUBLE, 0, b.control));
  return seconds;
}

double epsilon(DType d) {
  return d == DType::kFloat32 ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
}

}  // namespace

bool measure(const Bench& b, Method& m, bool record) {
  try {
    const double s = measure_once(b, m);
    if (record) {
      m.seconds.push_back(s);
      if (m.after_timed) m.after_timed(m);
    }
    return true;
  } catch (const InvalidArgument& e) {
    m.skipped = e.what();
    return false;
  }
}

void summarise_inner_gemms(const Bench& b, std::vector<Method>& ms) {
  for (Method& m : ms) {
    if (m.gemm_seconds.empty()) continue;
    double mine[2] = {median(m.gemm_seconds), median(m.gemm_calls)}, most[2] = {0, 0};
    SHARDKIT_MPI_CHECK(MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, b.control));
    if (most[1] > 0) {  // 0 calls: ScaLAPACK's GEMMs did not come through the benchmark's ?gemm_
      m.inner_gemm_s = most[0];
      m.inner_calls = most[1];
    }
  }
}

double load_average() {
  double v = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &v) != 1) v = -1;
    std::fclose(f);
  }
  return v;
}

void ErrorMax::add(double got, double want) {
  const double d = std::abs(got - want);
  worst = std::isfinite(d) ? std::max(worst, d) : std::numeric_limits<double>::infinity();
}

// Different summation orders of K products differ by about sqrt(K) eps (random-walk growth), with a wide margin (as
// examples/distributed_matmul checks).
double tolerance(DType d, std::int64_t k) {
  return 64.0 * epsilon(d) * std::sqrt(static_cast<double>(k));
}

}  // namespace shardkit::bench
