// The one-rank BLAS GEMM: the baseline of parallel efficiency (timed on rank 0 alone) and the reference --check
// compares every method's result with.

#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "bench.hpp"
#include "matmul_inputs.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;
using shardkit::examples::matrix_block;
using shardkit::examples::matrix_value;

namespace {

struct BlasState {
  Array a, b, c;
};

}  // namespace

Method blas_method(const Bench& b, const Dims& d) {
  Method m{.kind = Kind::kBaseline, .name = "blas", .mesh = "1"};
  auto st = std::make_shared<BlasState>();
  if (b.rank == 0) {
    st->a = matrix_block(0, 0, d.m, 0, d.k, b.opt.dtype);
    st->b = matrix_block(1, 0, d.k, 0, d.n, b.opt.dtype);
    st->c = Array::empty({d.m, d.n}, b.opt.dtype);
  }
  m.run = [st] { gemm(st->a, st->b, st->c); };
  return m;
}

// Checked at a few entries against dot products straight from the formula, so that a wrong reference cannot pass
// wrong results.
Reference make_reference(const Bench& b, const Dims& d) {
  Reference ref;
  ref.n = d.n;
  ref.c.resize(static_cast<std::size_t>(d.m * d.n));
  int ok = 1;
  if (b.rank == 0) {
    const DType dt = b.opt.dtype;
    const Array a = matrix_block(0, 0, d.m, 0, d.k, dt);
    const Array bm = matrix_block(1, 0, d.k, 0, d.n, dt);
    Array c = Array::empty({d.m, d.n}, dt);
    gemm(a, bm, c);
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        const T* p = static_cast<const T*>(c.data());
        for (std::size_t i = 0; i < ref.c.size(); ++i) ref.c[i] = static_cast<double>(p[i]);
      }
    });
    for (double v : ref.c) ref.scale = std::max(ref.scale, std::abs(v));
    for (std::int64_t s = 0; s < 16; ++s) {
      const std::int64_t i = (s * 7919) % d.m, j = (s * 104729 + 13) % d.n;
      long double dot = 0;
      for (std::int64_t l = 0; l < d.k; ++l) {
        // The inputs rounded to the dtype, as the GEMMs see them.
        const double x = dt == DType::kFloat32 ? static_cast<float>(matrix_value(0, i, l)) : matrix_value(0, i, l);
        const double y = dt == DType::kFloat32 ? static_cast<float>(matrix_value(1, l, j)) : matrix_value(1, l, j);
        dot += static_cast<long double>(x) * y;
      }
      if (!(std::abs(static_cast<double>(dot) - ref.at(i, j)) <= tolerance(dt, d.k) * std::max(ref.scale, 1e-300)))
        ok = 0;
    }
  }
  SHARDKIT_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, b.control));
  if (!ok)
    throw std::runtime_error(concat("the one-rank reference of ", d.label(), " disagrees with direct dot products"));
  SHARDKIT_MPI_CHECK(MPI_Bcast(&ref.scale, 1, MPI_DOUBLE, 0, b.control));
  // In pieces: MPI counts are ints.
  constexpr std::size_t kChunk = std::size_t{1} << 28;
  for (std::size_t off = 0; off < ref.c.size(); off += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, ref.c.size() - off));
    SHARDKIT_MPI_CHECK(MPI_Bcast(ref.c.data() + off, count, MPI_DOUBLE, 0, b.control));
  }
  return ref;
}

}  // namespace shardkit::bench
