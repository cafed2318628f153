// The cuBLAS calls shardkit makes, on the simulated GPU: a handle remembers its device and stream, and a GEMM runs
// as CBLAS on that stream's worker. A handle is not thread-safe in cuBLAS: a cublasGemmEx whose handle had its stream
// last set by another thread has lost its own cublasSetStream to a race, and is reported as such.

#include <cblas.h>
#include <cublas_v2.h>

#include <complex>
#include <thread>
#include <vector>

#include "reduce.hpp"
#include "sim_internal.hpp"

using namespace shardkit::sim;

struct cublasContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::thread::id stream_setter;
  std::mutex mu;
};

namespace {

// Loads a column-major rows x cols half/bfloat16 matrix with leading dimension ld into float.
std::vector<float> widen(const void* p, int rows, int cols, int ld, bool half) {
  std::vector<float> out(static_cast<std::size_t>(rows) * cols);
  const auto* bits = static_cast<const std::uint16_t*>(p);
  for (int j = 0; j < cols; ++j)
    for (int i = 0; i < rows; ++i) {
      const std::uint16_t v = bits[static_cast<std::size_t>(j) * ld + i];
      out[static_cast<std::size_t>(j) * rows + i] = half ? half_to_float(v) : bf16_to_float(v);
    }
  return out;
}

CBLAS_TRANSPOSE trans(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? CblasNoTrans : op == CUBLAS_OP_T ? CblasTrans : CblasConjTrans;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  auto* c = new cublasContext();
  c->device = current_device();
  *h = c;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  {
    std::lock_guard lock(h->mu);
    h->stream = s;
    h->stream_setter = std::this_thread::get_id();
  }
  // Widens the window in which another thread's cublasSetStream can slip in before this thread's GEMM.
  if (settings().delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(settings().delay_us / 4));
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE" : "CUBLAS_STATUS_NOT_SUPPORTED";
}
const char* cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : s == CUBLAS_STATUS_INVALID_VALUE ? "invalid value" : "not supported";
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t /*compute*/, cublasGemmAlgo_t /*algo*/) {
  if (Atype != Btype || Atype != Ctype || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  cudaStream_t stream;
  {
    std::lock_guard lock(h->mu);
    if (h->stream_setter != std::thread::id() && h->stream_setter != std::this_thread::get_id())
      fatal("cublasGemmEx on a handle whose stream was last set by another thread: cublasSetStream and the GEMM "
            "are not one critical section (or use one handle per thread)");
    stream = h->stream;
  }
  if (current_device() != h->device) {
    std::fprintf(stderr, "shardkit sim: cublasGemmEx with current device %d on a handle of device %d\n",
                 current_device(), h->device);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  auto st = stream_of(stream);
  if (st->device() != h->device) return CUBLAS_STATUS_INVALID_VALUE;
  // Scalars are read now (host pointer mode): the caller's variables may be gone when the worker runs.
  const auto ra = (ta == CUBLAS_OP_N) ? m : k, ca = (ta == CUBLAS_OP_N) ? k : m;
  const auto rb = (tb == CUBLAS_OP_N) ? k : n, cb = (tb == CUBLAS_OP_N) ? n : k;
  switch (Ctype) {
    case CUDA_R_32F: {
      const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
      st->enqueue([=] {
        cblas_sgemm(CblasColMajor, trans(ta), trans(tb), m, n, k, a, static_cast<const float*>(rw(A)), lda,
                    static_cast<const float*>(rw(B)), ldb, b, static_cast<float*>(rw(C)), ldc);
      });
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUDA_R_64F: {
      const double a = *static_cast<const double*>(alpha), b = *static_cast<const double*>(beta);
      st->enqueue([=] {
        cblas_dgemm(CblasColMajor, trans(ta), trans(tb), m, n, k, a, static_cast<const double*>(rw(A)), lda,
                    static_cast<const double*>(rw(B)), ldb, b, static_cast<double*>(rw(C)), ldc);
      });
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUDA_C_32F: {
      const std::complex<float> a = *static_cast<const std::complex<float>*>(alpha),
                                b = *static_cast<const std::complex<float>*>(beta);
      st->enqueue([=] {
        cblas_cgemm(CblasColMajor, trans(ta), trans(tb), m, n, k, &a, rw(A), lda, rw(B), ldb, &b, rw(C), ldc);
      });
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUDA_C_64F: {
      const std::complex<double> a = *static_cast<const std::complex<double>*>(alpha),
                                 b = *static_cast<const std::complex<double>*>(beta);
      st->enqueue([=] {
        cblas_zgemm(CblasColMajor, trans(ta), trans(tb), m, n, k, &a, rw(A), lda, rw(B), ldb, &b, rw(C), ldc);
      });
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUDA_R_16F:
    case CUDA_R_16BF: {
      // shardkit computes these in float32 (CUBLAS_COMPUTE_32F with float scalars).
      const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
      const bool is_half = Ctype == CUDA_R_16F;
      st->enqueue([=] {
        std::vector<float> fa = widen(rw(A), ra, ca, lda, is_half), fb = widen(rw(B), rb, cb, ldb, is_half),
                           fc = widen(rw(C), m, n, ldc, is_half);
        cblas_sgemm(CblasColMajor, trans(ta), trans(tb), m, n, k, a, fa.data(), ra > 0 ? ra : 1, fb.data(),
                    rb > 0 ? rb : 1, b, fc.data(), m > 0 ? m : 1);
        auto* out = static_cast<std::uint16_t*>(rw(C));
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < m; ++i) {
            const float v = fc[static_cast<std::size_t>(j) * m + i];
            out[static_cast<std::size_t>(j) * ldc + i] = is_half ? float_to_half(v) : float_to_bf16(v);
          }
      });
      return CUBLAS_STATUS_SUCCESS;
    }
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

}  // extern "C"
