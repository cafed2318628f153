// Distributed matrix multiply: the local (row-sharded x replicated) product, collective matmul in its all-gather and
// reduce-scatter flavours, and SUMMA on a 2-d mesh. Local products go through core's gemm (CBLAS on the host, cuBLAS
// on a GPU).
//
// Overlap: each step's transfer runs while the GEMM of the data already in hand computes. On the host the transfer
// runs on a helper thread doing the blocking MPI call (the MPI library then progresses it while the GEMM runs; a
// nonblocking call would only progress inside later MPI calls). On a GPU, NCCL's stream runs it. By default the host
// overlaps only when a core is free for the transfers (matmul_overlap_default): measured on 2 ranks of a 2-core machine
// (bench_matmul --profile, n=4096), forced overlap cost up to 23% on reduce_scatter and was within noise elsewhere.

#include "shardkit/sharding/matmul.hpp"

#include <sched.h>

#include <algorithm>
#include <future>
#include <numeric>
#include <optional>
#include <thread>

#include "shardkit/core/error.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/core/kernels.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit {

const char* matmul_algorithm_name(MatmulAlgorithm a) noexcept {
  switch (a) {
    case MatmulAlgorithm::kAuto: return "auto";
    case MatmulAlgorithm::kLocal: return "local";
    case MatmulAlgorithm::kAllGather: return "allgather";
    case MatmulAlgorithm::kReduceScatter: return "reduce_scatter";
    case MatmulAlgorithm::kSumma: break;
  }
  return "summa";
}

MatmulAlgorithm parse_matmul_algorithm(std::string_view name) {
  if (name == "auto") return MatmulAlgorithm::kAuto;
  if (name == "local" || name == "rows") return MatmulAlgorithm::kLocal;
  if (name == "allgather" || name == "ag" || name == "all_gather") return MatmulAlgorithm::kAllGather;
  if (name == "reduce_scatter" || name == "rs" || name == "reducescatter") return MatmulAlgorithm::kReduceScatter;
  if (name == "summa") return MatmulAlgorithm::kSumma;
  throw InvalidArgument(detail::concat("unknown matmul algorithm '", name,
                                       "' (auto, local, allgather, reduce_scatter, summa)"));
}

bool host_overlap_pays(int cores, int ranks_sharing, int blas_threads) noexcept {
  return cores >= static_cast<long>(std::max(ranks_sharing, 1)) * (std::max(blas_threads, 1) + 1);
}

bool matmul_overlap_default(Device device) {
  if (device.kind == DeviceKind::kCUDA) return true;
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int mine = machine;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) mine = std::max(1, CPU_COUNT(&set));
  const Runtime* rt = Runtime::current();
  const int sharing = mine < machine ? 1 : (rt ? rt->local_size() : 1);
  return host_overlap_pays(mine, sharing, blas_num_threads());
}

namespace {

// ---- overlapped steps ---------------------------------------------------------------------------------------------------

// A transfer started now and finished by wait(): on a helper thread for host buffers (see the file comment),
// directly (stream-ordered) for GPU buffers, or at once when overlap is off.
class Transfer {
 public:
  template <typename F>
  Transfer(F&& f, bool device, bool overlap) {
    if (device || !overlap) {
      token_ = f();
      if (!overlap) token_.wait();
    } else {
      future_ = std::async(std::launch::async, std::forward<F>(f));
    }
  }
  void wait() {
    if (future_.valid()) token_ = future_.get();  // rethrows the transfer's error
    token_.wait();
  }

 private:
  std::future<Token> future_;
  Token token_;
};

bool on_gpu(const Array& a) { return a.device().kind == DeviceKind::kCUDA; }

// GPU GEMMs run on the library stream; host code that reuses their buffers waits for them.
void settle(const Array& a) {
  if (on_gpu(a)) cuda::synchronize(cuda::library_stream(a.device().index));
}

Axes all_axes(const Mesh& mesh) { return Axes(mesh.axis_names()); }

bool divides(std::int64_t n, std::int64_t by) { return by > 0 && n % by == 0; }

void require(bool ok, MatmulAlgorithm alg, const std::string& why) {
  if (!ok)
    throw InvalidArgument(detail::concat("matmul (", matmul_algorithm_name(alg), "): ", why,
                                         " (use algorithm local, which takes uneven rows)"));
}

// The single tuple of axes a spec cuts dimension d by (empty: not cut).
const Axes& axes_of(const ShardedArray& x, int d) { return x.spec().axes(static_cast<std::size_t>(d)); }

ShardedArray to_layout(const ShardedArray& x, const PartitionSpec& spec, bool uneven = false) {
  NamedSharding want(x.mesh(), spec, uneven);
  if (x.sharding() == want) return x;
  return reshard(x, want);
}

// ---- algorithms ---------------------------------------------------------------------------------------------------------

// A P(rows, None) x B P() -> C P(rows, None); or A P() x B P(None, cols) -> C P(None, cols).
ShardedArray local_product(const ShardedArray& a, const ShardedArray& b) {
  const Mesh& mesh = a.mesh();
  const std::int64_t n = b.shape()[1];
  if (axes_of(a, 0).empty() && axes_of(a, 1).empty() && !axes_of(b, 1).empty()) {
    Array c = Array::empty({a.shape()[0], b.local().dim(1)}, a.dtype(), a.device());
    gemm(a.local(), b.local(), c);
    settle(c);
    return ShardedArray({a.shape()[0], n}, NamedSharding(mesh, P(kNone, axes_of(b, 1)), b.sharding().uneven()), c);
  }
  Array c = Array::empty({a.local().dim(0), n}, a.dtype(), a.device());
  gemm(a.local(), b.local(), c);
  settle(c);
  return ShardedArray({a.shape()[0], n}, NamedSharding(mesh, P(axes_of(a, 0), kNone), a.sharding().uneven()), c);
}

// Collective matmul, all-gather flavour: C_i = sum_j A_i[:, K_j] @ B_j, B's blocks going round a ring.
ShardedArray allgather_product(const ShardedArray& a, const ShardedArray& b, const Axes& rows, bool overlap) {
  const Mesh& mesh = a.mesh();
  const std::int64_t k = mesh.axis_size(rows), m = a.shape()[0], kk = a.shape()[1], n = b.shape()[1];
  require(divides(m, k) && divides(kk, k), MatmulAlgorithm::kAllGather,
          detail::concat("M=", m, " and K=", kk, " must divide by the ", k, " ranks of axes ", rows.to_string()));
  const ShardedArray al = to_layout(a, P(rows, kNone)), bl = to_layout(b, P(rows, kNone));
  auto comm = mesh.axis_comm(rows);
  const int i = comm->rank(), left = (i + k - 1) % k, right = (i + 1) % k;
  const std::int64_t kb = kk / k;
  const bool device = on_gpu(al.local());
  Array c = Array::empty({m / k, n}, a.dtype(), a.device());
  // The block in hand starts as this rank's own (read, never written: it belongs to the caller); blocks from the
  // ring land in two buffers of ours, used in turn.
  const Array own = bl.local().contiguous();
  Array buf[2] = {Array::empty(own.shape(), own.dtype(), own.device()),
                  Array::empty(own.shape(), own.dtype(), own.device())};
  const Array* cur = &own;
  for (int s = 0; s < k; ++s) {
    const std::int64_t j = (i + s) % k;  // the block of B in hand
    Array* next = &buf[s % 2];
    std::optional<Transfer> t;
    if (s + 1 < k) {
      // Pass the block on to the left while the right neighbour's arrives; the GEMM below runs meanwhile.
      const Token after = device ? Token::from_stream(cuda::library_stream(own.device().index), own.device().index)
                                 : Token();
      t.emplace([&, cur, next, after] { return comm->sendrecv_into(*cur, left, *next, right, 23, 23, nullptr, after); },
                device, overlap);
    }
    gemm(al.local().slice(1, j * kb, (j + 1) * kb), *cur, c, 1.0, s == 0 ? 0.0 : 1.0);
    if (t) {
      settle(c);
      t->wait();
      cur = next;
    }
  }
  settle(c);
  return ShardedArray({m, n}, NamedSharding(mesh, P(rows, kNone)), c);
}

// Collective matmul, reduce-scatter flavour: rank j holds A[:, K_j] and B_j; the partial sums of each row block of C
// travel a ring, each rank adding its part, and end at the rank that owns the block.
ShardedArray reduce_scatter_product(const ShardedArray& a, const ShardedArray& b, const Axes& rows, bool overlap) {
  const Mesh& mesh = a.mesh();
  const std::int64_t k = mesh.axis_size(rows), m = a.shape()[0], kk = a.shape()[1], n = b.shape()[1];
  require(divides(m, k) && divides(kk, k), MatmulAlgorithm::kReduceScatter,
          detail::concat("M=", m, " and K=", kk, " must divide by the ", k, " ranks of axes ", rows.to_string()));
  const ShardedArray al = to_layout(a, P(kNone, rows)), bl = to_layout(b, P(rows, kNone));
  auto comm = mesh.axis_comm(rows);
  const int i = comm->rank(), left = (i + k - 1) % k, right = (i + 1) % k;
  const std::int64_t mb = m / k;
  const bool device = on_gpu(al.local());
  auto rows_of = [&](std::int64_t r) { return al.local().slice(0, r * mb, (r + 1) * mb); };
  // acc: the partial sum this rank holds; incoming: the one arriving from the right; partial: this rank's share.
  Array acc = Array::empty({mb, n}, a.dtype(), a.device());
  Array incoming = Array::empty({mb, n}, a.dtype(), a.device());
  Array partial = Array::empty({mb, n}, a.dtype(), a.device());
  gemm(rows_of((i + 1) % k), bl.local(), acc);  // step 0: the block that travels furthest
  for (int s = 1; s < k; ++s) {
    settle(acc);
    Transfer t([&] { return comm->sendrecv_into(acc, left, incoming, right, 29, 29); }, device, overlap);
    gemm(rows_of((i + s + 1) % k), bl.local(), partial);  // overlapped with the transfer
    t.wait();
    settle(partial);
    add_into(incoming, partial);
    std::swap(acc, incoming);
  }
  settle(acc);
  return ShardedArray({m, n}, NamedSharding(mesh, P(rows, kNone)), acc);
}

// SUMMA on a 2-d mesh (x, y): C[x][y] = sum over panels t of A[x][panel t] @ B[panel t][y]; panel t of A is broadcast
// along y from its owner column, of B along x from its owner row.
ShardedArray summa_product(const ShardedArray& a, const ShardedArray& b, bool overlap) {
  const Mesh& mesh = a.mesh();
  require(mesh.ndim() == 2, MatmulAlgorithm::kSumma,
          "SUMMA needs a 2-d mesh, got " + mesh.to_string());
  const std::string& x = mesh.axis_names()[0];
  const std::string& y = mesh.axis_names()[1];
  const std::int64_t px = mesh.shape()[0], py = mesh.shape()[1];
  const std::int64_t m = a.shape()[0], kk = a.shape()[1], n = b.shape()[1];
  const std::int64_t panels = std::lcm(px, py);
  require(divides(m, px) && divides(n, py) && divides(kk, panels), MatmulAlgorithm::kSumma,
          detail::concat("M=", m, " must divide by ", px, ", N=", n, " by ", py, " and K=", kk, " by lcm(", px, ", ",
                         py, ")=", panels));
  const ShardedArray al = to_layout(a, P(x, y)), bl = to_layout(b, P(x, y));
  auto row_comm = mesh.axis_comm(y);  // ranks of my mesh row (same x), indexed by y
  auto col_comm = mesh.axis_comm(x);  // ranks of my mesh column (same y), indexed by x
  const std::int64_t my_x = mesh.axis_index(x), my_y = mesh.axis_index(y);
  const std::int64_t kp = kk / panels, a_per = panels / py, b_per = panels / px;
  const bool device = on_gpu(al.local());
  const std::int64_t mloc = m / px, nloc = n / py;
  Array c = Array::empty({mloc, nloc}, a.dtype(), a.device());
  // Panel t of A is columns of its owner's block, panel t of B rows of its owner's. The GEMM reads a panel in place
  // where this rank holds it (its owner, or every rank when the axis it travels along has one rank: no broadcast);
  // other ranks receive it into one of two buffers per operand (one read by the GEMM, the other being filled),
  // allocated only when needed. The owner broadcasts straight from its block when the panel is contiguous there.
  Array apan[2], bpan[2];  // receive (or staging) buffers
  Array ause[2], buse[2];  // what the GEMM of the panel in a slot reads
  auto share = [&](const Array& mine, bool owner, int root, const Shape& shape, Array& buffer, Array& use,
                   Communicator& comm, std::int64_t ranks) -> Token {
    if (ranks == 1) {
      use = mine;
      return {};
    }
    if (owner && mine.is_contiguous()) {
      use = mine;  // a broadcast only reads its root's buffer (which may be read-only)
      return comm.bcast_inplace(use, root);
    }
    if (buffer.shape() != shape) buffer = Array::empty(shape, a.dtype(), a.device());
    if (owner) buffer.copy_from(mine);
    use = owner ? mine : buffer;
    return comm.bcast_inplace(buffer, root);
  };
  auto fetch = [&](std::int64_t t, int slot) {
    const std::int64_t a_owner = t / a_per, b_owner = t / b_per;
    const bool a_own = my_y == a_owner, b_own = my_x == b_owner;
    const Array a_mine = a_own ? al.local().slice(1, (t % a_per) * kp, (t % a_per + 1) * kp) : Array();
    const Array b_mine = b_own ? bl.local().slice(0, (t % b_per) * kp, (t % b_per + 1) * kp) : Array();
    Token ta = share(a_mine, a_own, static_cast<int>(a_owner), {mloc, kp}, apan[slot], ause[slot], *row_comm, py);
    Token tb = share(b_mine, b_own, static_cast<int>(b_owner), {kp, nloc}, bpan[slot], buse[slot], *col_comm, px);
    return Token::join(ta, tb);
  };
  Transfer first([&] { return fetch(0, 0); }, device, false);
  first.wait();
  for (std::int64_t t = 0; t < panels; ++t) {
    const int cur = static_cast<int>(t % 2);
    std::optional<Transfer> pre;
    if (t + 1 < panels) pre.emplace([&, t] { return fetch(t + 1, 1 - cur); }, device, overlap);
    gemm(ause[cur], buse[cur], c, 1.0, t == 0 ? 0.0 : 1.0);
    if (pre) {
      settle(c);
      pre->wait();
    }
  }
  settle(c);
  return ShardedArray({m, n}, NamedSharding(mesh, P(x, y)), c);
}

}  // namespace

MatmulAlgorithm choose_matmul_algorithm(const ShardedArray& a, const ShardedArray& b) {
  // By the specs (not by the mesh's sizes): the choice reads the same on a mesh of one rank.
  const Axes &a0 = axes_of(a, 0), &a1 = axes_of(a, 1), &b0 = axes_of(b, 0), &b1 = axes_of(b, 1);
  const bool a_rep = a0.empty() && a1.empty(), b_rep = b0.empty() && b1.empty();
  if (!a0.empty() && a1.empty() && b_rep) return MatmulAlgorithm::kLocal;
  if (a_rep && b0.empty() && !b1.empty()) return MatmulAlgorithm::kLocal;
  if (!a0.empty() && a1.empty() && a0 == b0 && b1.empty()) return MatmulAlgorithm::kAllGather;
  if (a0.empty() && !a1.empty() && a1 == b0 && b1.empty()) return MatmulAlgorithm::kReduceScatter;
  if (a.mesh().ndim() == 2 && a0.size() == 1 && a1.size() == 1 && a0 == b0 && a1 == b1 &&
      a0[0] == a.mesh().axis_names()[0] && a1[0] == a.mesh().axis_names()[1])
    return MatmulAlgorithm::kSumma;
  return MatmulAlgorithm::kLocal;
}

ShardedArray matmul(const ShardedArray& a, const ShardedArray& b, MatmulOptions options) {
  SHARDKIT_CHECK(a.ndim() == 2 && b.ndim() == 2, "matmul takes 2-d operands, got shapes ",
                 shape_to_string(a.shape()), " and ", shape_to_string(b.shape()));
  SHARDKIT_CHECK_EQ(a.shape()[1], b.shape()[0], "matmul: inner dimensions differ: ", shape_to_string(a.shape()),
                    " @ ", shape_to_string(b.shape()));
  SHARDKIT_CHECK(a.mesh() == b.mesh(), "matmul: operands on different meshes: ", a.mesh().to_string(), ", ",
                 b.mesh().to_string());
  SHARDKIT_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ: ", a.dtype(), " and ", b.dtype());
  SHARDKIT_CHECK(a.device() == b.device(), "matmul: operands on different devices: ", a.device(), ", ", b.device());
  const MatmulAlgorithm alg =
      options.algorithm == MatmulAlgorithm::kAuto ? choose_matmul_algorithm(a, b) : options.algorithm;
  const bool overlap = alg == MatmulAlgorithm::kLocal || options.overlap.has_value()
                           ? options.overlap.value_or(false)
                           : matmul_overlap_default(a.device());
  const Mesh& mesh = a.mesh();
  switch (alg) {
    case MatmulAlgorithm::kLocal: {
      // Keep a layout the local product takes as it is; otherwise rows over every axis (uneven if need be) and B
      // replicated.
      const Axes &a0 = axes_of(a, 0), &a1 = axes_of(a, 1), &b0 = axes_of(b, 0), &b1 = axes_of(b, 1);
      const bool rows_ok = !a0.empty() && a1.empty() && b0.empty() && b1.empty();
      const bool cols_ok = a0.empty() && a1.empty() && b0.empty() && !b1.empty();
      if (rows_ok || cols_ok) return local_product(a, b);
      const Axes all = all_axes(mesh);
      const bool uneven = !divides(a.shape()[0], mesh.size());
      return local_product(to_layout(a, P(all, kNone), uneven), to_layout(b, P()));
    }
    case MatmulAlgorithm::kAllGather:
    case MatmulAlgorithm::kReduceScatter: {
      // The axes rows are cut by: the operands' own when they agree, else every mesh axis.
      Axes rows = alg == MatmulAlgorithm::kAllGather ? axes_of(a, 0) : axes_of(a, 1);
      if (rows.empty()) rows = all_axes(mesh);
      for (const auto& e : {a, b})
        require(!e.sharding().uneven() || e.sharding().fully_replicated(), alg, "uneven operands are not supported");
      return alg == MatmulAlgorithm::kAllGather ? allgather_product(a, b, rows, overlap)
                                                : reduce_scatter_product(a, b, rows, overlap);
    }
    case MatmulAlgorithm::kSumma:
      for (const auto& e : {a, b})
        require(!e.sharding().uneven() || e.sharding().fully_replicated(), alg, "uneven operands are not supported");
      return summa_product(a, b, overlap);
    case MatmulAlgorithm::kAuto: break;
  }
  throw Error(ErrorCode::kInternal, "matmul: no algorithm chosen");
}

}  // namespace shardkit
