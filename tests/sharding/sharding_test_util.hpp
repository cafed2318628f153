#pragma once

// Helpers of the sharding tests: the meshes each world size is tested on, deterministic global arrays, and host
// references (concatenate, stack, group members).

#include "array_compare.hpp"
#include "mpi_test.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace shardkit::testing {

/// The permuted device orders tested at the current world size (JAX's Mesh(devices.reshape(shape), names) with the
/// devices out of order): (2) as [1, 0]; (3) as [2, 0, 1]; (4) as [2, 0, 3, 1], (2,2) as [3, 1, 2, 0] and the 3-d
/// (2,1,2) as [1, 3, 0, 2]. Rank devices[p] sits at row-major position p.
inline std::vector<Mesh> permuted_meshes() {
  std::vector<Mesh> m;
  auto world = Communicator::world();
  const int n = world->size();
  if (n == 2) m.emplace_back(std::vector<std::int64_t>{2}, std::vector<std::string>{"x"}, std::vector<int>{1, 0}, world);
  if (n == 3)
    m.emplace_back(std::vector<std::int64_t>{3}, std::vector<std::string>{"x"}, std::vector<int>{2, 0, 1}, world);
  if (n == 4) {
    m.emplace_back(std::vector<std::int64_t>{4}, std::vector<std::string>{"x"}, std::vector<int>{2, 0, 3, 1}, world);
    m.emplace_back(std::vector<std::int64_t>{2, 2}, std::vector<std::string>{"x", "y"}, std::vector<int>{3, 1, 2, 0},
                   world);
    m.emplace_back(std::vector<std::int64_t>{2, 1, 2}, std::vector<std::string>{"x", "y", "z"},
                   std::vector<int>{1, 3, 0, 2}, world);
  }
  return m;
}

/// The meshes tested at the current world size: (1); (2), (2,1); (3); (4), (2,2), (1,4), (4,1); then the permuted
/// ones of permuted_meshes().
inline const std::vector<Mesh>& test_meshes() {
  static std::vector<Mesh> meshes = [] {
    std::vector<Mesh> m;
    auto world = Communicator::world();
    const std::int64_t n = world->size();
    m.emplace_back(std::vector<std::int64_t>{n}, std::vector<std::string>{"x"}, world);
    if (n == 2) m.emplace_back(std::vector<std::int64_t>{2, 1}, std::vector<std::string>{"x", "y"}, world);
    if (n == 4) {
      m.emplace_back(std::vector<std::int64_t>{2, 2}, std::vector<std::string>{"x", "y"}, world);
      m.emplace_back(std::vector<std::int64_t>{1, 4}, std::vector<std::string>{"x", "y"}, world);
      m.emplace_back(std::vector<std::int64_t>{4, 1}, std::vector<std::string>{"x", "y"}, world);
    }
    for (Mesh& p : permuted_meshes()) m.push_back(std::move(p));
    return m;
  }();
  return meshes;
}

/// Every spec of a 2-d array over a mesh's axes: each axis at most once, on either dimension, tuples in both orders
/// (a sample for three axes).
inline std::vector<PartitionSpec> test_specs(const Mesh& m) {
  std::vector<PartitionSpec> out{P(), P(kNone, kNone)};
  const auto& n = m.axis_names();
  for (const auto& a : n) {
    out.push_back(P(a));
    out.push_back(P(kNone, a));
  }
  if (n.size() == 2) {
    out.push_back(P(n[0], n[1]));
    out.push_back(P(n[1], n[0]));
    out.push_back(P(Axes{n[0], n[1]}));
    out.push_back(P(Axes{n[1], n[0]}));
    out.push_back(P(kNone, Axes{n[1], n[0]}));
  }
  if (n.size() == 3) {
    out.push_back(P(n[0], Axes{n[2], n[1]}));
    out.push_back(P(Axes{n[1], n[2]}, n[0]));
  }
  return out;
}

/// A float64 array of `shape` with element i equal to i + 1000 * salt (exact, distinct).
inline Array iota(const Shape& shape, int salt = 0, DType dtype = DType::kFloat64) {
  Array a = Array::empty(shape, DType::kFloat64);
  auto* p = a.data_as<double>();
  for (std::int64_t i = 0; i < a.numel(); ++i) p[i] = static_cast<double>(i + 1000 * salt);
  if (dtype == DType::kFloat64) return a;
  Array out = Array::empty(shape, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* q = static_cast<T*>(out.data());
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      if constexpr (std::is_same_v<T, Half>)
        q[i] = float_to_half(static_cast<float>(p[i]));
      else if constexpr (std::is_same_v<T, BFloat16>)
        q[i] = float_to_bfloat16(static_cast<float>(p[i]));
      else
        q[i] = static_cast<T>(p[i]);
    }
  });
  return out;
}

/// Host concatenation along `dim`.
inline Array concat(const std::vector<Array>& parts, int dim) {
  Shape s = parts.at(0).shape();
  s[dim] = 0;
  for (const auto& p : parts) s[dim] += p.dim(dim);
  Array out = Array::empty(s, parts[0].dtype());
  std::int64_t off = 0;
  for (const auto& p : parts) {
    Array dst = out.slice(dim, off, off + p.dim(dim));
    dst.copy_from(p);
    off += p.dim(dim);
  }
  return out;
}

/// Host stacking along a new dimension `dim`.
inline Array stack(const std::vector<Array>& parts, int dim) {
  std::vector<Array> expanded;
  for (const auto& p : parts) {
    Shape s = p.shape();
    s.insert(s.begin() + dim, 1);
    expanded.push_back(p.contiguous().reshape(s));
  }
  return concat(expanded, dim);
}

/// Ranks that differ from `rank` only along `axes`, ordered by their index over `axes`.
inline std::vector<int> group_of(const Mesh& mesh, int rank, const Axes& axes) {
  std::vector<int> members(static_cast<std::size_t>(mesh.axis_size(axes)), -1);
  const std::vector<std::int64_t> mine = mesh.coords(rank);
  for (int r = 0; r < mesh.size(); ++r) {
    const std::vector<std::int64_t> c = mesh.coords(r);
    bool same = true;
    for (std::size_t i = 0; i < c.size(); ++i)
      if (!axes.contains(mesh.axis_names()[i]) && c[i] != mine[i]) same = false;
    if (same) members[mesh.axis_index(axes, r)] = r;
  }
  return members;
}

/// The block of `global` that `rank` holds under `sharding`.
inline Array block(const Array& global, const NamedSharding& sharding, int rank) {
  Array v = global;
  const auto idx = sharding.index(global.shape(), rank);
  for (std::size_t d = 0; d < idx.size(); ++d) v = v.slice(static_cast<int>(d), idx[d].start, idx[d].stop);
  return v.contiguous();
}

/// Exact equality of shape, dtype and values.
inline ::testing::AssertionResult equal(const Array& got, const Array& want) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shape " << shape_to_string(got.shape()) << " vs "
                                         << shape_to_string(want.shape());
  if (!allclose(got, want, 0.0, 0.0))
    return ::testing::AssertionFailure() << "values differ:\n got " << got.to_string() << "\nwant " << want.to_string();
  return ::testing::AssertionSuccess();
}

/// Subsets of the mesh axes to run axis collectives over: each axis, all axes, and all axes reversed.
inline std::vector<Axes> axis_sets(const Mesh& mesh) {
  std::vector<Axes> out;
  for (const auto& a : mesh.axis_names()) out.emplace_back(a);
  if (mesh.ndim() > 1) {
    out.emplace_back(mesh.axis_names());
    std::vector<std::string> rev(mesh.axis_names().rbegin(), mesh.axis_names().rend());
    out.emplace_back(rev);
  }
  return out;
}

}  // namespace shardkit::testing
