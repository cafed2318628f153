#pragma once

// Private interface between the host GEMM dispatcher and the cuBLAS implementation (cuda/gemm_cublas.cpp).

#include <cstdint>

#include "shardkit/core/cuda.hpp"
#include "shardkit/core/dtype.hpp"

namespace shardkit::detail {

/// Row-major C(m,n) = alpha * A(m,k) @ B(k,n) + beta * C with leading dimensions (row strides) lda, ldb, ldc.
struct GemmArgs {
  DType dtype;
  std::int64_t m, n, k;
  const void* a;
  std::int64_t lda;
  const void* b;
  std::int64_t ldb;
  void* c;
  std::int64_t ldc;
  double alpha, beta;
};

void cublas_gemm(const GemmArgs& args, int device, StreamHandle stream);

}  // namespace shardkit::detail
