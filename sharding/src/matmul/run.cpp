// Running a table entry: matching operands against its layouts, resharding them to one, checking that its cut
// dimensions divide, and wrapping the block of C its body computes in the layout's sharding.

#include <set>

#include "algorithm.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

bool divides(std::int64_t n, std::int64_t by) {
  return by > 0 && n % by == 0;
}

bool on_mesh_axes(Cut cut) {
  return cut == Cut::kMeshX || cut == Cut::kMeshY;
}

// The axes a cut stands for on `mesh` (the mesh is 2-d where the cut names its axes).
Axes axes_for(Cut cut, const Mesh& mesh, const Axes& axes) {
  switch (cut) {
    case Cut::kNone:
      return {};
    case Cut::kAxes:
      return axes;
    case Cut::kMeshX:
      return Axes(mesh.axis_names()[0]);
    case Cut::kMeshY:
      return Axes(mesh.axis_names()[1]);
  }
  return {};
}

// Whether `got` (the axes one dimension is cut by) is `cut`, binding Cut::kAxes on its first appearance.
bool match_cut(Cut cut, const Axes& got, const Mesh& mesh, std::optional<Axes>& bound) {
  if (cut == Cut::kAxes) {
    if (got.empty() || (bound && *bound != got)) return false;
    bound = got;
    return true;
  }
  if (on_mesh_axes(cut) && mesh.ndim() != 2) return false;
  return got == axes_for(cut, mesh, {});
}

// What Cut::kAxes stands for when resharding to `layout`: the axes of the first operand dimension the layout cuts
// by it and the operand already cuts, else every mesh axis.
Axes axes_to_reshard_to(const Layout& layout, const ShardedArray& a, const ShardedArray& b) {
  for (const auto& [cuts, x] : {std::pair{&layout.a, &a}, std::pair{&layout.b, &b}})
    for (std::size_t d = 0; d < 2; ++d)
      if ((*cuts)[d] == Cut::kAxes && !x->spec().axes(d).empty()) return x->spec().axes(d);
  return Axes(a.mesh().axis_names());
}

std::string spec_text(const std::array<Cut, 2>& cuts) {
  static const char* const kNames[] = {"None", "axes", "x", "y"};
  if (cuts[0] == Cut::kNone && cuts[1] == Cut::kNone) return "P()";
  return concat("P(", kNames[static_cast<int>(cuts[0])], ", ", kNames[static_cast<int>(cuts[1])], ")");
}

// `x` in `spec`: as it is when it already has that spec, else resharded (uneven where `uneven` and a cut dimension
// does not divide).
ShardedArray to_spec(const ShardedArray& x, const PartitionSpec& spec, bool uneven) {
  if (x.spec() == spec) return x;
  return reshard(x, NamedSharding(x.mesh(), spec, uneven));
}

}  // namespace

std::optional<Axes> match_layout(const Layout& layout, const ShardedArray& a, const ShardedArray& b) {
  std::optional<Axes> bound;
  for (std::size_t d = 0; d < 2; ++d)
    if (!match_cut(layout.a[d], a.spec().axes(d), a.mesh(), bound) ||
        !match_cut(layout.b[d], b.spec().axes(d), b.mesh(), bound))
      return std::nullopt;
  return bound.value_or(Axes());
}

PartitionSpec layout_spec(const std::array<Cut, 2>& cuts, const Mesh& mesh, const Axes& axes, std::string_view where) {
  if ((on_mesh_axes(cuts[0]) || on_mesh_axes(cuts[1])) && mesh.ndim() != 2)
    throw InvalidArgument(concat(where, ": needs a 2-d mesh (x, y), got ", mesh.to_string()));
  return PartitionSpec({axes_for(cuts[0], mesh, axes), axes_for(cuts[1], mesh, axes)}).normalized();
}

std::string layout_text(const Layout& layout) {
  return concat("A ", spec_text(layout.a), " @ B ", spec_text(layout.b), " -> C ", spec_text(layout.c));
}

ShardedArray run_matmul(const MatmulEntry& entry, const ShardedArray& a, const ShardedArray& b, bool overlap) {
  const Mesh& mesh = a.mesh();
  const Layout* layout = nullptr;
  std::optional<Axes> axes;
  for (const Layout& l : entry.layouts)
    if ((axes = match_layout(l, a, b))) {
      layout = &l;
      break;
    }
  if (!layout) {
    layout = &entry.layouts.front();
    axes = axes_to_reshard_to(*layout, a, b);
  }
  const std::string where = concat("matmul (", entry.name, ", ", layout_text(*layout), ")");
  std::string uneven_ones;  // the algorithms that take uneven shards, for the messages
  for (const MatmulEntry& e : matmul_table())
    if (e.takes_uneven) uneven_ones += concat(uneven_ones.empty() ? "" : ", ", e.name);
  const std::string hint = concat(" (use algorithm ", uneven_ones, ", which takes uneven shards)");
  const PartitionSpec spec_a = layout_spec(layout->a, mesh, *axes, where);
  const PartitionSpec spec_b = layout_spec(layout->b, mesh, *axes, where);
  const PartitionSpec spec_c = layout_spec(layout->c, mesh, *axes, where);
  if (!entry.takes_uneven)
    for (const ShardedArray* x : {&a, &b})
      if (x->sharding().uneven() && !x->sharding().fully_replicated())
        throw InvalidArgument(concat(where, ": uneven operands are not supported", hint));

  // Every cut dimension of A, B and C must divide by its axes' size, or the operand is cut unevenly.
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  struct Dim {
    const char* name;
    std::int64_t extent;
    Cut cut;
    int operand;  // 0: A, 1: B, 2: C
  };
  const Dim dims[] = {{"M", m, layout->a[0], 0}, {"K", k, layout->a[1], 0}, {"K", k, layout->b[0], 1},
                      {"N", n, layout->b[1], 1}, {"M", m, layout->c[0], 2}, {"N", n, layout->c[1], 2}};
  bool uneven[3] = {false, false, false};
  std::set<std::string> unfit;
  for (const Dim& d : dims) {
    if (d.cut == Cut::kNone) continue;
    const Axes cut = axes_for(d.cut, mesh, *axes);
    const std::int64_t size = mesh.axis_size(cut);
    if (divides(d.extent, size)) continue;
    uneven[d.operand] = true;
    unfit.insert(concat(d.name, "=", d.extent, " must divide by ", size, " (the ranks of ", cut.to_string(), ")"));
  }
  if (!entry.takes_uneven && !unfit.empty()) {
    std::string why;
    for (const std::string& u : unfit) why += concat(why.empty() ? "" : ", ", u);
    throw InvalidArgument(concat(where, ": ", why, hint));
  }

  const ShardedArray al = to_spec(a, spec_a, uneven[0]);
  const ShardedArray bl = to_spec(b, spec_b, uneven[1]);
  Array c = entry.run(Blocks{al, bl, *axes, overlap});
  // C is uneven where its cut dimensions do not divide, and, for an algorithm that takes uneven shards, where an
  // operand kept as it is was uneven.
  const bool c_uneven = uneven[2] || (entry.takes_uneven && (al.sharding().uneven() || bl.sharding().uneven()));
  return ShardedArray({m, n}, NamedSharding(mesh, spec_c, c_uneven), c);
}

}  // namespace shardkit::detail
