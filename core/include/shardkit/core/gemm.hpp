#pragma once

#include "shardkit/core/array.hpp"
#include "shardkit/core/cuda.hpp"

namespace shardkit {

/// Local matrix multiply-accumulate: `c = alpha * a @ b + beta * c` for 2-D row-major arrays of one dtype, all on
/// the host (CBLAS) or all on one GPU (cuBLAS). Each operand may be a view whose rows are strided (a slice along
/// dimension 1 of a larger matrix), as long as its last dimension is unit-stride.
///
/// Host: float32, float64, complex64, complex128 through CBLAS; float16 and bfloat16 are widened to float32 (correct
/// but not fast). CUDA: float32, float64, float16 and bfloat16 (float32 accumulation), complex64, complex128.
/// CUDA work is ordered on `stream` (nullptr: the library stream of the device) and not waited for.
/// @throws InvalidArgument on shape, dtype or device mismatch, a read-only `c`, or an unsupported layout.
void gemm(const Array& a, const Array& b, Array& c, double alpha = 1.0, double beta = 0.0,
          StreamHandle stream = nullptr);

/// Number of threads the host BLAS uses (OpenBLAS), and a way to set it (ranks sharing a machine should split the
/// cores between them).
int blas_num_threads();
void set_blas_num_threads(int n);

}  // namespace shardkit
