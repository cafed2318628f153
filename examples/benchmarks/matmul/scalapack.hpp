#pragma once

// ScaLAPACK's side of bench_matmul, built only where the library was found (SHARDKIT_HAVE_SCALAPACK): its C entry
// points, and what the benchmark's interposed BLAS / PBLAS symbols (blas_interpose.cpp) share with the p?gemm methods
// (pdgemm.cpp).

#include <mpi.h>

#include <cstdint>

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

namespace shardkit::bench {

/// Time ScaLAPACK spent in its local ?gemm_ calls, and their count, since the last reset (main thread only).
struct GemmTally {
  double seconds = 0;
  std::int64_t calls = 0;
};
/// The tally the interposed dgemm_ / sgemm_ add to.
extern GemmTally g_gemm_tally;

/// What the interposed pilaenv_ returns while p?gemm runs (PBLAS's panel width); 0: the library's own answer.
extern int g_pilaenv_override;

}  // namespace shardkit::bench

extern "C" {
/// PBLAS's logical block size, interposed (see blas_interpose.cpp).
int pilaenv_(const int* ictxt, const char* prec);
}
