// cuBLAS GEMM for core's gemm(): one handle per device, created on first use. Row-major C = A @ B is computed as
// the column-major product C^T = B^T @ A^T, which needs no transposes.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "../gemm_internal.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

#define SHARDKIT_CUBLAS_CHECK(expr)                                                                              \
  do {                                                                                                           \
    const cublasStatus_t shardkit_st_ = (expr);                                                                  \
    if (shardkit_st_ != CUBLAS_STATUS_SUCCESS)                                                                   \
      throw BackendError("cuBLAS", static_cast<int>(shardkit_st_),                                               \
                         concat("cuBLAS error ", cublasGetStatusName(shardkit_st_), " (",                        \
                                cublasGetStatusString(shardkit_st_), ")"),                                      \
                         source_location(#expr, __FILE__, __LINE__));                                           \
  } while (0)

// A device's handle with the lock that makes cublasSetStream and the GEMM one critical section: a cuBLAS handle is
// not thread-safe, and a stream set by another thread in between would run this GEMM on that thread's stream.
struct Handle {
  cublasHandle_t handle = nullptr;
  std::mutex mu;
};

Handle& handle_for(int device) {
  constexpr int kMax = 64;
  static std::array<Handle, kMax> handles{};
  static std::mutex mu;
  SHARDKIT_CHECK(device >= 0 && device < kMax, "device index ", device);
  std::lock_guard<std::mutex> lock(mu);
  if (!handles[device].handle) {
    cuda::DeviceGuard guard(device);
    // Kept for the life of the process: destroying handles at exit races the runtime's own teardown.
    SHARDKIT_CUBLAS_CHECK(cublasCreate(&handles[device].handle));
  }
  return handles[device];
}

struct TypeInfo {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

TypeInfo type_info(DType d) {
  switch (d) {
    case DType::kFloat32: return {CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::kFloat64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::kFloat16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::kBFloat16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::kComplex64: return {CUDA_C_32F, CUBLAS_COMPUTE_32F, CUDA_C_32F};
    case DType::kComplex128: return {CUDA_C_64F, CUBLAS_COMPUTE_64F, CUDA_C_64F};
    default: break;
  }
  throw InvalidArgument(concat("gemm: dtype ", d, " is not supported on CUDA"));
}

}  // namespace

void cublas_gemm(const GemmArgs& g, int device, StreamHandle stream) {
  const TypeInfo t = type_info(g.dtype);
  cuda::DeviceGuard guard(device);
  Handle& handle = handle_for(device);
  std::lock_guard<std::mutex> lock(handle.mu);
  cublasHandle_t h = handle.handle;
  SHARDKIT_CUBLAS_CHECK(cublasSetStream(h, stream));
  // Scalars in the compute precision.
  float af = static_cast<float>(g.alpha), bf = static_cast<float>(g.beta);
  double ad = g.alpha, bd = g.beta;
  float acf[2] = {af, 0.f}, bcf[2] = {bf, 0.f};
  double acd[2] = {ad, 0.0}, bcd[2] = {bd, 0.0};
  const void* alpha = &af;
  const void* beta = &bf;
  if (t.scale == CUDA_R_64F) {
    alpha = &ad;
    beta = &bd;
  } else if (t.scale == CUDA_C_32F) {
    alpha = acf;
    beta = bcf;
  } else if (t.scale == CUDA_C_64F) {
    alpha = acd;
    beta = bcd;
  }
  SHARDKIT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
                                     static_cast<int>(g.k), alpha, g.b, t.data, static_cast<int>(g.ldb), g.a, t.data,
                                     static_cast<int>(g.lda), beta, g.c, t.data, static_cast<int>(g.ldc), t.compute,
                                     CUBLAS_GEMM_DEFAULT));
}

}  // namespace shardkit::detail
