#pragma once

// Shared helpers of the collectives tests: deterministic inputs per (rank, index), exact host references, and the
// buffers' device (host for the MPI suite; the rank's GPU when SHARDKIT_TEST_BUFFERS=cuda, which routes to NCCL).

#include <array>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <cstring>
#include <string>
#include <vector>

#include <mpi.h>

#include "mpi_test.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::testing {

/// Where test buffers live.
inline Device buffer_device() {
  const char* v = std::getenv("SHARDKIT_TEST_BUFFERS");
  if (v && std::string(v) == "cuda") return runtime().device();
  return Device::cpu();
}
inline bool on_gpu() { return buffer_device().kind == DeviceKind::kCUDA; }

/// True when the suite asks for GPU buffers (SHARDKIT_TEST_BUFFERS=cuda) and this rank has no GPU.
inline bool gpu_suite_without_gpu() {
  const char* v = std::getenv("SHARDKIT_TEST_BUFFERS");
  return v && std::string(v) == "cuda" && runtime().device().kind != DeviceKind::kCUDA;
}

/// Skips when the suite asks for GPU buffers and this rank has none (fails under SHARDKIT_REQUIRE_GPU=1).
#define SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU()                                              \
  do {                                                                                        \
    if (::shardkit::testing::gpu_suite_without_gpu()) SHARDKIT_GPU_SKIP("GPU suite on a rank without a GPU"); \
  } while (0)

/// Exit code of a GPU suite run where there is no GPU (ctest's SKIP_RETURN_CODE for the gpu-labelled tests).
inline constexpr int kNoGpuExitCode = 77;

/// The GPU suite (collectives_nccl) on a machine without a GPU would otherwise run its host-buffer tests and report
/// them as passes: the binary runs nothing and exits with kNoGpuExitCode, which ctest reports as skipped (under
/// SHARDKIT_REQUIRE_GPU=1 it fails instead).
class GpuSuiteEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!gpu_suite_without_gpu()) return;
    if (gpu_required()) GTEST_FAIL() << "SHARDKIT_REQUIRE_GPU=1: GPU suite on a rank without a GPU";
    if (runtime().rank() == 0) std::printf("GPU suite (SHARDKIT_TEST_BUFFERS=cuda) without a GPU: nothing run\n");
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    std::_Exit(kNoGpuExitCode);
  }
};
inline ::testing::Environment* const kGpuSuiteEnvironment =
    ::testing::AddGlobalTestEnvironment(new GpuSuiteEnvironment);

/// One communicator over all ranks, shared by the tests of a binary.
inline std::shared_ptr<Communicator>& world() {
  static std::shared_ptr<Communicator> c = Communicator::world();
  return c;
}

/// The operation a reduction input is generated for decides its range, so every result is exact in every dtype.
enum class Pattern { kData, kArithmetic, kLogical, kBitwise };

/// Whether every rank of the world is on this rank's node: where the shared-memory backend serves the world's
/// communicators by itself (across hosts, the multihost tests, it is hierarchical: shm on each node, MPI between them).
inline bool world_on_one_node() {
  static const bool one = [] {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int node_size = 0, size = 0, mine = 0, all = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_free(&node);
    mine = node_size == size ? 1 : 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
  }();
  return one;
}

/// The backend a communicator forced to shm routes host collectives of shm's set to: shm on one node; across nodes
/// shm (hierarchical) for allreduce, reduce, bcast, barrier, allgather and reduce_scatter, MPI for the others.
inline BackendKind shm_route(OpKind op = OpKind::kAllreduce) {
  if (world_on_one_node()) return BackendKind::kShm;
  const bool hierarchical = op == OpKind::kAllreduce || op == OpKind::kReduce || op == OpKind::kBcast ||
                            op == OpKind::kBarrier || op == OpKind::kAllgather || op == OpKind::kReduceScatter;
  return hierarchical ? BackendKind::kShm : BackendKind::kMpi;
}

inline Pattern pattern_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProd:
    case ReduceOp::kMin:
    case ReduceOp::kMax: return Pattern::kArithmetic;
    case ReduceOp::kLogicalAnd:
    case ReduceOp::kLogicalOr:
    case ReduceOp::kLogicalXor: return Pattern::kLogical;
    default: break;
  }
  return Pattern::kBitwise;
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, Half>)
    return float_to_half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BFloat16>)
    return float_to_bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0.0;
  else
    return static_cast<T>(v);
}

template <typename T>
inline constexpr bool kIsComplex = std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>;

/// Element i of rank r's input for a pattern. Values are small enough that sums and products over 4 ranks are
/// exact in every dtype (float16 and bfloat16 included).
template <typename T>
T value(Pattern p, int r, std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    if (p == Pattern::kData) return (i + r) % 2 == 0;
    return (i * 3 + r) % 4 != 0;
  } else if constexpr (kIsComplex<T>) {
    using R = typename T::value_type;
    if (p == Pattern::kData) return T(static_cast<R>((r * 131 + i) % 1000), static_cast<R>(-((r + i) % 7)));
    return T(static_cast<R>(0.5 * (1 + (i + 2 * r) % 3)), static_cast<R>((i + r) % 3 - 1));
  } else {
    const bool is_float = !std::is_integral_v<T>;
    switch (p) {
      case Pattern::kData:
        return from_double<T>(static_cast<double>((r * 131 + i) % (std::is_same_v<T, BFloat16> ? 200 : 100)));
      case Pattern::kArithmetic:
        if (is_float) return from_double<T>(0.5 * (1 + (i + 2 * r) % 3));
        if (std::is_signed_v<T>) return from_double<T>(static_cast<double>((i + 2 * r) % 5 - 2));
        return from_double<T>(static_cast<double>(1 + (i + 2 * r) % 3));
      case Pattern::kLogical:
        return from_double<T>(static_cast<double>((i + r) % 3));
      case Pattern::kBitwise:
        return from_double<T>(static_cast<double>((i * 7 + r * 13) % 100));
    }
    return T{};
  }
}

/// a (op) b, in the arithmetic of T (float16/bfloat16 computed in float and rounded, as the libraries do).
template <typename T>
T combine(ReduceOp op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case ReduceOp::kLogicalAnd:
      case ReduceOp::kBitAnd: return a && b;
      case ReduceOp::kLogicalOr:
      case ReduceOp::kBitOr: return a || b;
      default: return a != b;
    }
  } else if constexpr (kIsComplex<T>) {
    return op == ReduceOp::kSum ? a + b : a * b;
  } else if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case ReduceOp::kSum: return static_cast<T>(a + b);
      case ReduceOp::kProd: return static_cast<T>(a * b);
      case ReduceOp::kMin: return std::min(a, b);
      case ReduceOp::kMax: return std::max(a, b);
      case ReduceOp::kLogicalAnd: return static_cast<T>((a != 0) && (b != 0));
      case ReduceOp::kLogicalOr: return static_cast<T>((a != 0) || (b != 0));
      case ReduceOp::kLogicalXor: return static_cast<T>((a != 0) != (b != 0));
      case ReduceOp::kBitAnd: return static_cast<T>(a & b);
      case ReduceOp::kBitOr: return static_cast<T>(a | b);
      case ReduceOp::kBitXor: return static_cast<T>(a ^ b);
    }
    return T{};
  } else {
    const double x = to_double(a), y = to_double(b);
    switch (op) {
      case ReduceOp::kSum: return from_double<T>(x + y);
      case ReduceOp::kProd: return from_double<T>(x * y);
      case ReduceOp::kMin: return from_double<T>(std::min(x, y));
      default: return from_double<T>(std::max(x, y));
    }
  }
}

/// Rank r's input of `n` elements for `pattern`, on the test device.
inline Array input(DType dtype, Shape shape, int r, Pattern pattern, Device device = buffer_device()) {
  Array host = Array::empty(shape, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(host.data());
    for (std::int64_t i = 0; i < host.numel(); ++i) p[i] = value<T>(pattern, r, i);
  });
  return host.to(device);
}

/// op over ranks [first, last] of the inputs, element-wise, on the host.
inline Array reference(DType dtype, Shape shape, ReduceOp op, int first, int last, std::int64_t index_offset = 0) {
  Array out = Array::empty(shape, dtype);
  const Pattern pattern = pattern_for(op);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data());
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      T acc = value<T>(pattern, first, i + index_offset);
      for (int r = first + 1; r <= last; ++r) acc = combine<T>(op, acc, value<T>(pattern, r, i + index_offset));
      p[i] = acc;
    }
  });
  return out;
}

/// Element-wise exact comparison (bytes), reporting the first difference.
inline ::testing::AssertionResult same(const Array& got_any, const Array& want_any) {
  const Array got = got_any.to(Device::cpu()), want = want_any.to(Device::cpu());
  if (got.dtype() != want.dtype()) return ::testing::AssertionFailure() << "dtype " << got.dtype() << " vs " << want.dtype();
  if (got.numel() != want.numel())
    return ::testing::AssertionFailure() << "size " << got.numel() << " vs " << want.numel();
  const std::size_t es = got.itemsize();
  const auto* a = static_cast<const unsigned char*>(got.data());
  const auto* b = static_cast<const unsigned char*>(want.data());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(a + i * es, b + i * es, es) != 0) {
      const Array g = got.reshape({got.numel()}), w = want.reshape({want.numel()});
      return ::testing::AssertionFailure() << "first difference at element " << i << " of " << got.numel()
                                           << ": got " << g.slice(0, i, i + 1).to_string() << ", want "
                                           << w.slice(0, i, i + 1).to_string();
    }
  }
  return ::testing::AssertionSuccess();
}

/// Checks a bcast of `n` elements from `root` on `c`, value form and in place, against the root's input.
inline void expect_bcast(Communicator& c, DType dtype, std::int64_t n, int root) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " root=" << root);
  const Array x = input(dtype, {n}, c.rank(), Pattern::kData);
  const Array want = input(dtype, {n}, root, Pattern::kData);
  EXPECT_TRUE(same(c.bcast(x, root).value, want));
  Array buf = x.clone();
  c.bcast_inplace(buf, root).wait();
  EXPECT_TRUE(same(buf, want));
}

/// Whether the backend the test buffers route to can run `op` on `dtype` (NCCL supports a subset).
inline bool backend_supports(ReduceOp op, DType dtype) {
  // Whatever the buffers' device: a reduction NCCL lacks (int16, complex max, xor, ...) is routed to MPI.
  return reduce_op_supports(op, dtype);
}

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum,        ReduceOp::kProd,      ReduceOp::kMin,
                                             ReduceOp::kMax,        ReduceOp::kLogicalAnd, ReduceOp::kLogicalOr,
                                             ReduceOp::kLogicalXor, ReduceOp::kBitAnd,    ReduceOp::kBitOr,
                                             ReduceOp::kBitXor};

/// Element counts every operation is tested with.
/// (0, 1, odd, large). SHARDKIT_TEST_LARGE_COUNT replaces the large one: the simulated GPU's NCCL reduces on one host
/// core per rank, where a million elements per dtype and operation would take minutes.
inline std::span<const std::int64_t> counts() {
  static const std::array<std::int64_t, 4> c = {0, 1, 7, [] {
                                                  const char* v = std::getenv("SHARDKIT_TEST_LARGE_COUNT");
                                                  return v && *v ? std::atoll(v) : std::int64_t{1000003};
                                                }()};
  return c;
}

/// The dtypes the operation suite sweeps (AllDTypes/Ops.*). Every one at 2 ranks, the smallest exchange; at 1 (no
/// peer: nothing is combined) and at 3 and more (where the rank count and not the dtype is what is new) one of each
/// kind and width: bool, int8, bfloat16, float32, uint64 and complex128 (elements of 1, 2, 4, 8 and 16 bytes; logical,
/// signed, unsigned, floating and complex): the rule and the six of the Python suites (tests/python/conftest.py
/// WIDE_SWEEP, test_jax_ops.py). The job's size comes from the launcher's environment, since the suites are
/// instantiated before MPI_Init.
/// SHARDKIT_TEST_WIDE_SWEEP=1 sweeps every dtype at any rank count, =0 the six at any (every rank must see the same
/// value: the multihost tests forward it).
inline std::vector<DType> swept_dtypes() {
  const char* wide = std::getenv("SHARDKIT_TEST_WIDE_SWEEP");
  int world = 1;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(name); v && *v) {
      world = std::atoi(v);
      break;
    }
  }
  const bool all = wide && *wide ? std::string(wide) != "0" : world == 2;
  if (all) return {kAllDTypes.begin(), kAllDTypes.end()};
  return {DType::kBool, DType::kInt8, DType::kBFloat16, DType::kFloat32, DType::kUInt64, DType::kComplex128};
}

/// A dtype-parametrised test's name: the dtype's.
inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_name(info.param));
}

/// How many times `what` occurs in `s` (the tests that read the JSON shardkit writes).
inline int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace shardkit::testing
