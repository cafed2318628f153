// ScaLAPACK's p?gemm (psgemm for float32) on a 2-d block-cyclic layout, for each grid, block size and PBLAS panel
// width asked: BLACS grids over the benchmark's own duplicate of the world communicator, inputs filled locally from
// the same formula as every other method's.

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "bench.hpp"
#include "matmul_inputs.hpp"
#include "scalapack.hpp"

namespace shardkit::bench {

using shardkit::examples::matrix_value;

namespace {

// BLACS' handle of an MPI communicator (BLACS gives one handle per communicator, however often asked: free it once).
class BlacsSystem {
 public:
  explicit BlacsSystem(MPI_Comm comm) : handle_(Csys2blacs_handle(comm)) {}
  ~BlacsSystem() { Cfree_blacs_system_handle(handle_); }
  BlacsSystem(const BlacsSystem&) = delete;
  BlacsSystem& operator=(const BlacsSystem&) = delete;
  int handle() const { return handle_; }

 private:
  int handle_;
};

// One BLACS grid over the benchmark's own duplicate of the world communicator, ranks placed row-major ("Row") as on
// shardkit's meshes, so process (r, c) of the grid is mesh coordinate (r, c).
class BlacsGrid {
 public:
  BlacsGrid(const BlacsSystem& system, Grid g) : grid_(g), context_(system.handle()) {
    Cblacs_gridinit(&context_, "Row", g.rows, g.cols);
    int nprow = 0, npcol = 0;
    Cblacs_gridinfo(context_, &nprow, &npcol, &row_, &col_);
    SHARDKIT_CHECK(nprow == g.rows && npcol == g.cols && row_ >= 0, "BLACS grid ", g.label(), " not set up");
  }
  ~BlacsGrid() { Cblacs_gridexit(context_); }
  BlacsGrid(const BlacsGrid&) = delete;
  BlacsGrid& operator=(const BlacsGrid&) = delete;
  int context() const { return context_; }
  int row() const { return row_; }
  int col() const { return col_; }
  const Grid& grid() const { return grid_; }

 private:
  Grid grid_;
  int context_ = -1, row_ = -1, col_ = -1;
};

// A and B of one grid and block size, shared by the configurations that differ only in PBLAS's panel width.
template <typename T>
struct PgemmInputs {
  std::vector<T> a, b;
  int desc_a[9] = {}, desc_b[9] = {};
  int m = 0, n = 0, k = 0, nb = 0;
};

template <typename T>
struct PgemmState {
  std::shared_ptr<const PgemmInputs<T>> in;
  std::vector<T> c;
  int desc_c[9] = {};
  int kb = 0;  // PILAENV for this configuration (0: the library's own)
};

// This rank's block-cyclic piece (column-major, leading dimension `lld`) of global matrix `which` (rows x cols).
template <typename T>
std::vector<T> block_cyclic(int which, int rows, int cols, int nb, const BlacsGrid& g, int* lld_out) {
  const int zero = 0;
  const int nprow = g.grid().rows, npcol = g.grid().cols, myrow = g.row(), mycol = g.col();
  const int lrows = numroc_(&rows, &nb, &myrow, &zero, &nprow);
  const int lcols = numroc_(&cols, &nb, &mycol, &zero, &npcol);
  const int lld = std::max(1, lrows);
  std::vector<T> out(static_cast<std::size_t>(lld) * static_cast<std::size_t>(std::max(1, lcols)));
  for (int lj = 0; lj < lcols; ++lj) {
    const std::int64_t gj = (static_cast<std::int64_t>(lj / nb) * npcol + mycol) * nb + lj % nb;
    for (int li = 0; li < lrows; ++li) {
      const std::int64_t gi = (static_cast<std::int64_t>(li / nb) * nprow + myrow) * nb + li % nb;
      out[static_cast<std::size_t>(lj) * lld + li] = static_cast<T>(matrix_value(which, gi, gj));
    }
  }
  *lld_out = lld;
  return out;
}

template <typename T>
std::shared_ptr<const PgemmInputs<T>> pgemm_inputs(const Dims& d, const BlacsGrid& g, int nb) {
  auto in = std::make_shared<PgemmInputs<T>>();
  in->m = static_cast<int>(d.m);
  in->n = static_cast<int>(d.n);
  in->k = static_cast<int>(d.k);
  in->nb = nb;
  const int zero = 0, ctx = g.context();
  int lld = 0, info = 0;
  in->a = block_cyclic<T>(0, in->m, in->k, nb, g, &lld);
  descinit_(in->desc_a, &in->m, &in->k, &nb, &nb, &zero, &zero, &ctx, &lld, &info);
  SHARDKIT_CHECK_EQ(info, 0, "descinit of A");
  in->b = block_cyclic<T>(1, in->k, in->n, nb, g, &lld);
  descinit_(in->desc_b, &in->k, &in->n, &nb, &nb, &zero, &zero, &ctx, &lld, &info);
  SHARDKIT_CHECK_EQ(info, 0, "descinit of B");
  return in;
}

template <typename T>
Method pgemm_method_typed(const std::shared_ptr<const PgemmInputs<T>>& in, const BlacsGrid& g, int kb) {
  Method m;
  m.kind = Kind::kScalapack;
  m.name = std::is_same_v<T, double> ? "pdgemm" : "psgemm";
  m.mesh = g.grid().label();
  m.nb = in->nb;
  {
    // The panel width this configuration runs with, as p?gemm will ask for it.
    const int ctx = g.context();
    const char prec = std::is_same_v<T, double> ? 'D' : 'S';
    g_pilaenv_override = kb;
    m.kb = pilaenv_(&ctx, &prec);
    g_pilaenv_override = 0;
    m.kb_tuned = kb > 0;
  }
  auto st = std::make_shared<PgemmState<T>>();
  st->in = in;
  st->kb = kb;
  const int zero = 0, ctx = g.context(), nb = in->nb;
  int info = 0;
  const int nprow = g.grid().rows, npcol = g.grid().cols, myrow = g.row(), mycol = g.col();
  const int crows = numroc_(&in->m, &nb, &myrow, &zero, &nprow);
  const int ccols = numroc_(&in->n, &nb, &mycol, &zero, &npcol);
  const int clld = std::max(1, crows);
  st->c.assign(static_cast<std::size_t>(clld) * static_cast<std::size_t>(std::max(1, ccols)), T{});
  descinit_(st->desc_c, &in->m, &in->n, &nb, &nb, &zero, &zero, &ctx, &clld, &info);
  SHARDKIT_CHECK_EQ(info, 0, "descinit of C");
  // The tally of its local GEMMs, reset before each measurement and kept after each timed one.
  m.prepare = [] { g_gemm_tally = {}; };
  m.after_timed = [](Method& self) {
    self.gemm_seconds.push_back(g_gemm_tally.seconds);
    self.gemm_calls.push_back(static_cast<double>(g_gemm_tally.calls));
  };
  m.run = [st] {
    const PgemmInputs<T>& x = *st->in;
    const int one = 1;
    const T alpha = 1, beta = 0;
    g_pilaenv_override = st->kb;
    if constexpr (std::is_same_v<T, double>)
      pdgemm_("N", "N", &x.m, &x.n, &x.k, &alpha, x.a.data(), &one, &one, x.desc_a, x.b.data(), &one, &one, x.desc_b,
              &beta, st->c.data(), &one, &one, st->desc_c);
    else
      psgemm_("N", "N", &x.m, &x.n, &x.k, &alpha, x.a.data(), &one, &one, x.desc_a, x.b.data(), &one, &one, x.desc_b,
              &beta, st->c.data(), &one, &one, st->desc_c);
    g_pilaenv_override = 0;
  };
  m.local_error = [st, nb, nprow, npcol, myrow, mycol, crows, ccols, clld](const Reference& ref) {
    ErrorMax e;
    for (int lj = 0; lj < ccols; ++lj) {
      const std::int64_t gj = (static_cast<std::int64_t>(lj / nb) * npcol + mycol) * nb + lj % nb;
      for (int li = 0; li < crows; ++li) {
        const std::int64_t gi = (static_cast<std::int64_t>(li / nb) * nprow + myrow) * nb + li % nb;
        e.add(static_cast<double>(st->c[static_cast<std::size_t>(lj) * clld + li]), ref.at(gi, gj));
      }
    }
    return e.worst;
  };
  return m;
}

// The p?gemm configurations of one grid and block size: one per PBLAS panel width.
template <typename T>
std::vector<Method> pgemm_methods_typed(const Bench& b, const Dims& d, const BlacsGrid& g, int nb) {
  std::vector<Method> out;
  if (d.m > INT_MAX || d.n > INT_MAX || d.k > INT_MAX) {
    Method m;
    m.kind = Kind::kScalapack;
    m.name = std::is_same_v<T, double> ? "pdgemm" : "psgemm";
    m.mesh = g.grid().label();
    m.nb = nb;
    m.skipped = "ScaLAPACK takes int sizes";
    out.push_back(std::move(m));
    return out;
  }
  const auto in = pgemm_inputs<T>(d, g, nb);
  for (int kb : b.opt.kbs) out.push_back(pgemm_method_typed<T>(in, g, kb));
  return out;
}

}  // namespace

struct Scalapack::Impl {
  BlacsSystem system;
  std::vector<std::unique_ptr<BlacsGrid>> grids;
  explicit Impl(MPI_Comm comm) : system(comm) {}
};

Scalapack::Scalapack(MPI_Comm comm, const std::vector<Grid>& grids) : impl_(std::make_unique<Impl>(comm)) {
  for (const Grid& g : grids) impl_->grids.push_back(std::make_unique<BlacsGrid>(impl_->system, g));
}

Scalapack::~Scalapack() {
  // Every grid before the system handle.
  impl_->grids.clear();
}

std::vector<Method> Scalapack::methods(const Bench& b, const Dims& d) const {
  std::vector<Method> out;
  for (const auto& g : impl_->grids)
    for (int nb : b.opt.nbs)
      for (Method& m : b.opt.dtype == DType::kFloat32 ? pgemm_methods_typed<float>(b, d, *g, nb)
                                                      : pgemm_methods_typed<double>(b, d, *g, nb))
        out.push_back(std::move(m));
  return out;
}

void Scalapack::release_blacs() {
  Cblacs_exit(1);  // 1: MPI stays up, the Runtime finalises it
}

void Scalapack::set_blas_threads(int n) {
  openblas_set_num_threads(n);
}

int Scalapack::blas_threads() {
  return openblas_get_num_threads();
}

// The file name of the library that defines dgemm_ after the benchmark (what its dgemm_ wrapper calls).
std::string Scalapack::blas_library() {
  void* p = dlsym(RTLD_NEXT, "dgemm_");
  Dl_info info{};
  if (!p || !dladdr(p, &info) || !info.dli_fname) return "?";
  return info.dli_fname;
}

}  // namespace shardkit::bench
