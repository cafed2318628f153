// GEMM on one GPU through shardkit (shardkit::gemm on device Arrays) against cuBLAS called directly on the same
// buffers, in one run: TFLOP/s of each (medians over rounds) and their ratio (cuBLAS time / shardkit time: median and
// min over rounds), per size and dtype. The two alternate within each round, each going first in every other round
// (a GPU's clocks still rising would favour the one timed second), and each timing runs at least --min-ms.
// A last line gives the host time per call at n=64, where the GPU is quick: what limits small products.
// Used by scripts/gpu_check.sh.
//
//   build/examples/benchmarks/gemm/bench_gemm [--sizes 1024,4096,8192] [--dtypes float32,float16,bfloat16,float64]
//                                            [--iters 20] [--rounds 5] [--min-ms 2] [--json PATH]

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "shardkit/core/array.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/core/gemm.hpp"

namespace {

using namespace shardkit;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat64: return CUDA_R_64F;
    default: return CUDA_R_32F;
  }
}

// Seconds per call of f() on `stream`, timed with CUDA events after a warm-up.
template <typename F>
double time_on(cudaStream_t stream, int iters, F&& f) {
  f();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / iters;
}

// Every cuBLAS status is checked: a failing GEMM would otherwise be timed as a very fast one.
void check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "bench_gemm: %s failed: %s (%s)\n", what, cublasGetStatusName(st), cublasGetStatusString(st));
  std::exit(1);
}

// c = a @ b for square n x n operands through cuBLAS alone, with the compute type shardkit uses (float32 accumulation
// for 16-bit types); row-major as shardkit's, so the column-major product is b @ a.
void cublas_alone(cublasHandle_t handle, const Array& a, const Array& b, Array& c) {
  const DType dt = c.dtype();
  const cudaDataType_t t = cuda_type(dt);
  const cublasComputeType_t ct = dt == DType::kFloat64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  const float af = 1.f, bf = 0.f;
  const double ad = 1.0, bd = 0.0;
  const void* alpha = dt == DType::kFloat64 ? static_cast<const void*>(&ad) : &af;
  const void* beta = dt == DType::kFloat64 ? static_cast<const void*>(&bd) : &bf;
  const int n = static_cast<int>(c.dim(0));
  check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, alpha, b.data(), t, n, a.data(), t, n, beta, c.data(),
                     t, n, ct, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Host microseconds per call of f() over `calls` calls (the stream drained before and after).
template <typename F>
double host_us_per_call(cudaStream_t stream, int calls, F&& f) {
  cudaStreamSynchronize(stream);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  cudaStreamSynchronize(stream);
  return us / calls;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "1024,4096,8192", dtypes = "float32,float16,bfloat16,float64", json;
  int iters = 20, rounds = 5;
  double min_ms = 2.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--sizes") sizes = v;
    else if (a == "--dtypes") dtypes = v;
    else if (a == "--iters") iters = std::stoi(v);
    else if (a == "--rounds") rounds = std::max(1, std::stoi(v));
    else if (a == "--min-ms") min_ms = std::stod(v);
    else if (a == "--json") json = v;
  }
  if (cuda::device_count() == 0) {
    std::printf("bench_gemm: no GPU (%s): nothing to measure\n", cuda::unavailable_reason().c_str());
    return 2;
  }
  cuda::set_device(0);
  const StreamHandle stream = cuda::library_stream(0);
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetStream(handle, stream), "cublasSetStream");
  std::printf("# GEMM on %s: shardkit::gemm vs cuBLAS (cublasGemmEx) on the same buffers, %d rounds of >= %d calls "
              "and >= %.1f ms each\n",
              cuda::device_name(0).c_str(), rounds, iters, min_ms);
  std::printf("%8s %10s %14s %14s %8s %8s\n", "n", "dtype", "shardkit TF/s", "cuBLAS TF/s", "ratio", "r(min)");
  std::ostringstream js;
  js << "{\"benchmark\":\"gemm\",\"device\":\"" << cuda::device_name(0) << "\",\"results\":[";
  bool first = true;
  for (const std::string& dt_name : split(dtypes)) {
    const DType dt = dtype_from_name(dt_name);
    for (const std::string& ns : split(sizes)) {
      const std::int64_t n = std::stoll(ns);
      Array a = Array::zeros({n, n}, dt, Device::cuda(0)), b = Array::zeros({n, n}, dt, Device::cuda(0));
      Array c = Array::zeros({n, n}, dt, Device::cuda(0));
      auto run_sk = [&] { gemm(a, b, c, 1.0, 0.0, stream); };
      auto run_cb = [&] { cublas_alone(handle, a, b, c); };
      // Enough calls for min_ms per timing, from one timing of each.
      const double probe = std::max(time_on(stream, iters, run_sk), time_on(stream, iters, run_cb));
      const int calls = std::max(iters, static_cast<int>(min_ms / 1e3 / std::max(probe, 1e-9)) + 1);
      std::vector<double> sk, cb, ratio;
      for (int r = 0; r < rounds; ++r) {
        double ts, tc;
        if (r % 2 == 0) {
          ts = time_on(stream, calls, run_sk);
          tc = time_on(stream, calls, run_cb);
        } else {
          tc = time_on(stream, calls, run_cb);
          ts = time_on(stream, calls, run_sk);
        }
        sk.push_back(ts);
        cb.push_back(tc);
        ratio.push_back(tc / ts);
      }
      const double t_sk = median(sk), t_cb = median(cb);
      const double r_med = median(ratio), r_min = *std::min_element(ratio.begin(), ratio.end());
      const double flops = 2.0 * n * n * n;
      std::printf("%8lld %10s %14.2f %14.2f %8.3f %8.3f\n", static_cast<long long>(n), dt_name.c_str(),
                  flops / t_sk / 1e12, flops / t_cb / 1e12, r_med, r_min);
      js << (first ? "" : ",") << "{\"n\":" << n << ",\"dtype\":\"" << dt_name << "\",\"shardkit_tflops\":"
         << flops / t_sk / 1e12 << ",\"cublas_tflops\":" << flops / t_cb / 1e12 << ",\"ratio_median\":" << r_med
         << ",\"ratio_min\":" << r_min << "}";
      first = false;
    }
  }
  {
    // Host time per call where the GPU is quick: shardkit's own work per call (checks, events) against cuBLAS's.
    Array a = Array::zeros({64, 64}, DType::kFloat32, Device::cuda(0)), b = a.clone(), c = a.clone();
    auto run_cb = [&] { cublas_alone(handle, a, b, c); };
    auto run_sk = [&] { gemm(a, b, c, 1.0, 0.0, stream); };
    std::vector<double> sk, cb;
    for (int r = 0; r < rounds; ++r) {
      sk.push_back(host_us_per_call(stream, 2000, run_sk));
      cb.push_back(host_us_per_call(stream, 2000, run_cb));
    }
    std::printf("# host time per call at n=64 float32 (median of %d rounds of 2000): "
                "shardkit %.2f us, cuBLAS %.2f us\n",
                rounds, median(sk), median(cb));
    js << "],\"host_us_per_call_n64\":{\"shardkit\":" << median(sk) << ",\"cublas\":" << median(cb) << "}}\n";
  }
  if (!json.empty()) std::ofstream(json) << js.str();
  check(cublasDestroy(handle), "cublasDestroy");
  return 0;
}
