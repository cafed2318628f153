// shardkit's matmul algorithms as a user calls them, on operands already in each algorithm's natural layout, and the
// front end of --profile (each algorithm's parts are in a file of their own).

#include <type_traits>

#include "bench.hpp"
#include "matmul_inputs.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;

namespace {

// Max |C - R| over this rank's block of a sharded result.
double sharded_error(const ShardedArray& c, const Reference& ref) {
  const auto idx = c.sharding().index(c.shape(), c.mesh().rank());
  const Array local = c.local().to(Device::cpu()).contiguous();
  ErrorMax e;
  visit_dtype(local.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* p = static_cast<const T*>(local.data());
      const std::int64_t cols = idx[1].stop - idx[1].start;
      for (std::int64_t i = idx[0].start; i < idx[0].stop; ++i)
        for (std::int64_t j = idx[1].start; j < idx[1].stop; ++j)
          e.add(static_cast<double>(p[(i - idx[0].start) * cols + (j - idx[1].start)]), ref.at(i, j));
    }
  });
  return e.worst;
}

const Mesh& mesh_for(const Bench& b, MatmulAlgorithm alg) {
  return alg == MatmulAlgorithm::kSumma ? b.summa_mesh : b.line_mesh;
}

// Why `alg` cannot run on its mesh at all ("" when it can).
std::string unfit(const Bench& b, MatmulAlgorithm alg) {
  const Mesh& mesh = mesh_for(b, alg);
  if (alg == MatmulAlgorithm::kSumma && mesh.ndim() != 2)
    return concat("SUMMA needs a 2-d mesh, got ", mesh.to_string());
  return "";
}

// @throws InvalidArgument when the sizes do not divide by the mesh.
std::shared_ptr<const Inputs> natural_inputs(const Bench& b, const Dims& d, MatmulAlgorithm alg, InputCache& cache) {
  for (const auto& [a, in] : cache)
    if (a == alg) return in;
  const Mesh& mesh = mesh_for(b, alg);
  const auto [sa, sb] = shardkit::examples::natural_layout(alg, mesh);
  const Device dev = b.rt.device();
  auto in = std::make_shared<const Inputs>(
      Inputs{shardkit::examples::matrix_sharded(0, {d.m, d.k}, NamedSharding(mesh, sa), b.opt.dtype, dev),
             shardkit::examples::matrix_sharded(1, {d.k, d.n}, NamedSharding(mesh, sb), b.opt.dtype, dev)});
  cache.emplace_back(alg, in);
  return in;
}

// The ring of `c`'s mesh; none when m or k does not divide by its size.
std::optional<Ring> ring_of(const PartContext& c) {
  Ring r;
  r.p = c.mesh.size();
  if (c.d.m % r.p || c.d.k % r.p) return std::nullopt;
  r.comm = c.mesh.axis_comm(Axes(c.mesh.axis_names()));
  r.i = r.comm->rank();
  r.left = static_cast<int>((r.i + r.p - 1) % r.p);
  r.right = static_cast<int>((r.i + 1) % r.p);
  return r;
}

}  // namespace

Method shardkit_method(const Bench& b, const Dims& d, MatmulAlgorithm alg, std::optional<bool> overlap,
                       InputCache& cache) {
  Method m;
  m.kind = overlap ? Kind::kProfile : Kind::kShardkit;
  m.name = matmul_algorithm_name(alg);
  if (overlap) m.part = *overlap ? "overlap_on" : "no_overlap";
  m.mesh = shape_label(mesh_for(b, alg).shape());
  m.skipped = unfit(b, alg);
  if (!m.skipped.empty()) return m;
  std::shared_ptr<const Inputs> in;
  try {
    in = natural_inputs(b, d, alg, cache);
  } catch (const InvalidArgument& e) {
    m.skipped = e.what();  // sizes that do not divide by the mesh
    return m;
  }
  auto c = std::make_shared<std::optional<ShardedArray>>();
  // The previous result is freed before the clock starts: only the product (with its own allocation) is timed.
  m.prepare = [c] { c->reset(); };
  m.run = [in, c, alg, overlap] { c->emplace(matmul(in->a, in->b, MatmulOptions{alg, overlap})); };
  m.local_error = [c](const Reference& ref) { return *c ? sharded_error(**c, ref) : 0.0; };
  return m;
}

// The parts mirror the steps the library takes for each algorithm, each kind run on its own with the same shapes and
// communicators: its local GEMMs, its transfers, and its element-wise work (reduce_scatter's adds, SUMMA's panel
// copies). Their sum against the no-overlap time shows the remaining cost (allocations, thread start); the
// forced-overlap time against the no-overlap one shows how much of the transfers overlap hides (or what it costs).
std::vector<Method> profile_methods(const Bench& b, const Dims& d, MatmulAlgorithm alg, InputCache& cache) {
  if (!unfit(b, alg).empty()) return {};
  std::shared_ptr<const Inputs> in;
  try {
    in = natural_inputs(b, d, alg, cache);
  } catch (const InvalidArgument&) {
    return {};  // the algorithm's own row says why
  }
  const PartContext c{
      d, mesh_for(b, alg), in->a.local(), in->b.local(), b.opt.dtype, b.rt.device(), matmul_algorithm_name(alg)};
  switch (alg) {
    case MatmulAlgorithm::kLocal:
      return local_parts(c);
    case MatmulAlgorithm::kAllGather:
    case MatmulAlgorithm::kReduceScatter: {
      const std::optional<Ring> ring = ring_of(c);
      if (!ring) return {};
      return alg == MatmulAlgorithm::kAllGather ? allgather_parts(c, *ring) : reduce_scatter_parts(c, *ring);
    }
    case MatmulAlgorithm::kSumma:
      return summa_parts(c);
    default:
      break;
  }
  return {};
}

Method PartContext::part(std::string name) const {
  Method m;
  m.kind = Kind::kProfile;
  m.name = algorithm;
  m.part = std::move(name);
  m.mesh = shape_label(mesh.shape());
  return m;
}

Method fresh_memory_part(Method m, std::vector<Shape> shapes, DType dt, Device dev) {
  m.run = [shapes = std::move(shapes), dt, dev] {
    for (const Shape& s : shapes) Array::empty(s, dt, dev).fill_zero();
  };
  return m;
}

}  // namespace shardkit::bench
