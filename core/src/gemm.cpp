#include "shardkit/core/gemm.hpp"

#include <cblas.h>

#include <complex>
#include <vector>

#include "gemm_internal.hpp"
#include "shardkit/core/waitable.hpp"

// OpenBLAS's thread controls (declared here: not every cblas.h declares them).
extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace shardkit {
namespace {

// Leading dimension of a row-major operand: its row stride, which must allow a unit-stride last dimension.
std::int64_t leading_dim(const Array& x, const char* name) {
  SHARDKIT_CHECK_EQ(x.ndim(), 2, "gemm: ", name, " must be 2-D, got shape ", shape_to_string(x.shape()));
  const std::int64_t rows = x.dim(0), cols = x.dim(1);
  if (rows <= 1 && cols <= 1) return std::max<std::int64_t>(cols, 1);
  SHARDKIT_CHECK(cols <= 1 || x.strides()[1] == 1, "gemm: ", name, " must have a unit-stride last dimension, got strides (",
                 x.strides()[0], ", ", x.strides()[1], "); call contiguous() first");
  const std::int64_t ld = rows <= 1 ? std::max<std::int64_t>(cols, 1) : x.strides()[0];
  SHARDKIT_CHECK(ld >= cols, "gemm: ", name, " row stride ", ld, " is smaller than its ", cols, " columns");
  return std::max<std::int64_t>(ld, 1);
}

void host_gemm_widened(const detail::GemmArgs& g);

void host_gemm(const detail::GemmArgs& g) {
  const auto m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const auto lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb), ldc = static_cast<int>(g.ldc);
  switch (g.dtype) {
    case DType::kFloat32:
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, static_cast<float>(g.alpha),
                  static_cast<const float*>(g.a), lda, static_cast<const float*>(g.b), ldb, static_cast<float>(g.beta),
                  static_cast<float*>(g.c), ldc);
      return;
    case DType::kFloat64:
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, g.alpha, static_cast<const double*>(g.a), lda,
                  static_cast<const double*>(g.b), ldb, g.beta, static_cast<double*>(g.c), ldc);
      return;
    case DType::kComplex64: {
      const std::complex<float> alpha(static_cast<float>(g.alpha)), beta(static_cast<float>(g.beta));
      cblas_cgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, &alpha, g.a, lda, g.b, ldb, &beta, g.c, ldc);
      return;
    }
    case DType::kComplex128: {
      const std::complex<double> alpha(g.alpha), beta(g.beta);
      cblas_zgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, &alpha, g.a, lda, g.b, ldb, &beta, g.c, ldc);
      return;
    }
    case DType::kFloat16:
    case DType::kBFloat16:
      host_gemm_widened(g);
      return;
    default:
      break;
  }
  throw InvalidArgument(detail::concat("gemm: dtype ", g.dtype, " is not supported on the host"));
}

// float16 / bfloat16 on the host: widen to float32, multiply with BLAS, round back.
void host_gemm_widened(const detail::GemmArgs& g) {
  const bool half = g.dtype == DType::kFloat16;
  auto load = [&](const void* p, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    std::vector<float> out(static_cast<std::size_t>(rows * cols));
    const auto* bits = static_cast<const std::uint16_t*>(p);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        const std::uint16_t v = bits[i * ld + j];
        out[i * cols + j] = half ? half_to_float(Half{v}) : bfloat16_to_float(BFloat16{v});
      }
    return out;
  };
  std::vector<float> a = load(g.a, g.m, g.k, g.lda), b = load(g.b, g.k, g.n, g.ldb), c = load(g.c, g.m, g.n, g.ldc);
  detail::GemmArgs w{DType::kFloat32, g.m, g.n, g.k, a.data(), g.k, b.data(), g.n, c.data(), g.n, g.alpha, g.beta};
  host_gemm(w);
  auto* out = static_cast<std::uint16_t*>(g.c);
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      const float v = c[i * g.n + j];
      out[i * g.ldc + j] = half ? float_to_half(v).bits : float_to_bfloat16(v).bits;
    }
}

}  // namespace

void gemm(const Array& a, const Array& b, Array& c, double alpha, double beta, StreamHandle stream) {
  SHARDKIT_CHECK(a.dtype() == b.dtype() && a.dtype() == c.dtype(), "gemm: dtypes differ: ", a.dtype(), ", ",
                 b.dtype(), ", ", c.dtype());
  const std::int64_t lda = leading_dim(a, "a"), ldb = leading_dim(b, "b"), ldc = leading_dim(c, "c");
  const std::int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  SHARDKIT_CHECK_EQ(b.dim(0), k, "gemm: inner dimensions differ: a is ", shape_to_string(a.shape()), ", b is ",
                    shape_to_string(b.shape()));
  SHARDKIT_CHECK(c.dim(0) == m && c.dim(1) == n, "gemm: c has shape ", shape_to_string(c.shape()), ", expected (", m,
                 ", ", n, ")");
  SHARDKIT_CHECK(!c.read_only(), "gemm: c is read-only");
  SHARDKIT_CHECK(a.device() == b.device() && a.device() == c.device(), "gemm: operands on different devices: ",
                 a.device(), ", ", b.device(), ", ", c.device());
  for (std::int64_t v : {m, n, k, lda, ldb, ldc})
    SHARDKIT_CHECK_LE(v, std::int64_t{INT32_MAX}, "gemm: dimension above INT32_MAX");
  const bool on_device = c.device().kind == DeviceKind::kCUDA || c.device().kind == DeviceKind::kCUDAManaged;
  if (!on_device || m == 0 || n == 0 || k == 0) {
    a.wait_ready();
    b.wait_ready();
    c.wait_ready();
  }
  if (m == 0 || n == 0) return;
  const detail::GemmArgs args{a.dtype(), m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, alpha, beta};
  if (k == 0) {
    // BLAS would only scale C; do it uniformly (beta == 0 must clear even NaN garbage).
    if (beta == 0.0) {
      Array zero = Array::zeros(c.shape(), c.dtype(), c.device());
      c.copy_from(zero);
      return;
    }
  }
  if (on_device) {
    // C is still being written when cuBLAS returns: its ready event makes every host access (copies, DLPack,
    // printing, managed-memory reads through the library) wait for it, and lets other streams order after it.
    const int dev = c.device().index;
    const StreamHandle s = stream ? stream : cuda::library_stream(dev);
    // Pending writes to the operands are waited for on the stream, not the host: back-to-back GEMMs stay queued.
    for (const Array* x : {&a, &b, static_cast<const Array*>(&c)})
      if (x->ready_event()) x->ready_event()->enqueue_wait(s);
    detail::cublas_gemm(args, dev, s);
    c.set_ready(cuda::record_event(s, dev));
    return;
  }
  host_gemm(args);
}

int blas_num_threads() { return openblas_get_num_threads(); }
void set_blas_num_threads(int n) {
  SHARDKIT_CHECK_GE(n, 1, "set_blas_num_threads");
  openblas_set_num_threads(n);
}

}  // namespace shardkit
