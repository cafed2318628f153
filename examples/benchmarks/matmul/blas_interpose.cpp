// The benchmark's own definitions of dgemm_, sgemm_ and pilaenv_, in front of the libraries' (built with ScaLAPACK
// only). ScaLAPACK's calls resolve through the process's global symbol table, where the executable comes first, so
// they land here and go on to the library's own definition (the next one):
//   ?gemm_    timed, for the compute / communication split of p?gemm (--profile); shardkit's GEMMs call cblas_?gemm
//             and do not pass through;
//   pilaenv_  PBLAS's logical block size: p?gemm takes its K step (the width of the panels it broadcasts and of its
//             local GEMMs) from PILAENV, which reference ScaLAPACK fixes at 32 and leaves to the installer to tune;
//             overridden so that --pblas-kb can tune it per measurement.

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "scalapack.hpp"

namespace shardkit::bench {

GemmTally g_gemm_tally;
int g_pilaenv_override = 0;

namespace {

template <typename Fn>
Fn next_definition(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (!p) {
    std::fprintf(stderr, "bench_matmul: no BLAS definition of %s after the benchmark's own\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

// Reference BLAS ?gemm_ (C callers such as PBLAS pass no hidden string lengths; BLAS reads one character).
template <typename T>
using GemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const T*, const T*, const int*,
                        const T*, const int*, const T*, T*, const int*);

// Calls the library's ?gemm_ named `name` and adds the time to the tally.
template <typename T, typename... Args>
void timed_gemm(const char* name, Args... args) {
  static const GemmFn<T> next = next_definition<GemmFn<T>>(name);
  const auto t0 = std::chrono::steady_clock::now();
  next(args...);
  g_gemm_tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++g_gemm_tally.calls;
}

}  // namespace
}  // namespace shardkit::bench

using shardkit::bench::next_definition;
using shardkit::bench::timed_gemm;

extern "C" void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                       const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
                       const int* ldc) {
  timed_gemm<double>("dgemm_", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

extern "C" void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                       const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc) {
  timed_gemm<float>("sgemm_", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

extern "C" int pilaenv_(const int* ictxt, const char* prec) {
  using Fn = int (*)(const int*, const char*);
  static const Fn next = next_definition<Fn>("pilaenv_");
  const int override_kb = shardkit::bench::g_pilaenv_override;
  return override_kb > 0 ? override_kb : next(ictxt, prec);
}
