// libFuzzer target: parsing of partition specs (PartitionSpec::parse) and mesh shapes (parse_mesh_shape), and
// NamedSharding's shard computations (validate / shard_shape / index / local_shape) on abstract meshes for fuzzed
// global shapes. Nothing here communicates, so MPI is linked but never initialised.
//
// Checked for every input (a violation aborts, which libFuzzer reports as a crash and saves):
// - Every call returns or throws shardkit::InvalidArgument; any other exception escapes and is reported.
// - parse_mesh_shape keeps its documented promises (positive sizes, unique non-empty names) and its result prints
//   back to text that parses to the same mesh; PartitionSpec::parse round-trips through to_string().
// - Mesh::abstract, the NamedSharding constructor and validate() accept exactly what their documentation accepts
//   (independent models below).
// - Accepted shardings: shard_shape is the exact quotient (even) or the ceiling (uneven); every rank's index ranges
//   lie inside the array and are no longer than the shard shape (exactly as long, when even); over all ranks of a
//   small mesh the ranges tile each dimension; ranks outside the mesh are refused.
//
// Input layout (make_seeds.py writes seeds in it): a line of mesh text, a line of spec text, then little-endian fields
// (zero past the end):
//   u8 flags        bit 0 uneven, bit 1 build the mesh from the fields below instead of the mesh text
//   [bit 1 only] u8 ndim (mod 7), then per axis u8 name (mod 7, from x y z w a4 x "") and a size
//   i8 rank delta   the global rank is spec.size() + delta mod 4 - 1
//   a size per global dimension, then u8 k (mod 4) and k i32 ranks to query
// A size is `u8 v`: v < 0x80 is v itself; otherwise an i64 follows.

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_input.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/sharding/mesh.hpp"
#include "shardkit/sharding/named_sharding.hpp"
#include "shardkit/sharding/partition_spec.hpp"

namespace {

using shardkit::Axes;
using shardkit::IndexRange;
using shardkit::InvalidArgument;
using shardkit::Mesh;
using shardkit::MeshShape;
using shardkit::NamedSharding;
using shardkit::PartitionSpec;
using shardkit::Shape;
using shardkit::fuzz::FuzzInput;

std::int64_t small_or_i64(FuzzInput& in) {
  const std::uint8_t v = in.u8();
  return v < 0x80 ? v : in.i64();
}

// parse_mesh_shape: documented promises, and a round trip through Mesh::to_string's "x=2, y=4" form.
bool check_mesh_text(std::string_view text, MeshShape& out) {
  try {
    out = shardkit::parse_mesh_shape(text);
  } catch (const InvalidArgument&) {
    return false;
  }
  FUZZ_CHECK(!out.shape.empty());
  FUZZ_CHECK(out.shape.size() == out.names.size());
  std::set<std::string> names;
  std::string printed;
  for (std::size_t i = 0; i < out.shape.size(); ++i) {
    FUZZ_CHECK(out.shape[i] > 0);
    FUZZ_CHECK(!out.names[i].empty());
    FUZZ_CHECK(names.insert(out.names[i]).second);
    printed += (i ? ", " : "") + out.names[i] + "=" + std::to_string(out.shape[i]);
  }
  const MeshShape again = shardkit::parse_mesh_shape(printed);
  FUZZ_CHECK(again.shape == out.shape && again.names == out.names);
  return true;
}

// Mesh::abstract's documented rules, with ranks as int: the number of positions must fit in one.
bool mesh_ok(const std::vector<std::int64_t>& shape, const std::vector<std::string>& names) {
  if (shape.size() != names.size()) return false;
  std::set<std::string> seen;
  std::int64_t size = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (names[i].empty() || !seen.insert(names[i]).second || shape[i] <= 0) return false;
    if (__builtin_mul_overflow(size, shape[i], &size) || size > INT_MAX) return false;
  }
  return true;
}

bool make_mesh(std::vector<std::int64_t> shape, std::vector<std::string> names, Mesh& out) {
  const bool ok = mesh_ok(shape, names);
  try {
    out = Mesh::abstract(shape, names);
  } catch (const InvalidArgument&) {
    FUZZ_CHECK(!ok);
    return false;
  }
  FUZZ_CHECK(ok);
  std::int64_t size = 1;
  for (std::int64_t s : shape) size *= s;
  FUZZ_CHECK(out.size() == size);
  FUZZ_CHECK(out.rank() == -1 && out.is_abstract());
  for (const int r : {0, static_cast<int>(size - 1), static_cast<int>(size / 2)}) {
    const std::vector<std::int64_t> c = out.coords(r);
    FUZZ_CHECK(out.rank_at(c) == r);
  }
  (void)out.to_string();
  return true;
}

bool check_spec_text(std::string_view text, PartitionSpec& out) {
  try {
    out = PartitionSpec::parse(text);
  } catch (const InvalidArgument&) {
    return false;
  }
  // to_string quotes every name with '; a name holding ' itself cannot be printed back.
  for (const std::string& a : out.used_axes())
    if (a.find('\'') != std::string::npos) return true;
  const PartitionSpec again = PartitionSpec::parse(out.to_string());
  FUZZ_CHECK(again == out);
  FUZZ_CHECK(again.to_string() == out.to_string());
  return true;
}

bool sharding_ok(const Mesh& mesh, const PartitionSpec& spec) {
  std::set<std::string> seen;
  for (const std::string& a : spec.used_axes()) {
    const auto& names = mesh.axis_names();
    if (std::find(names.begin(), names.end(), a) == names.end() || !seen.insert(a).second) return false;
  }
  return true;
}

std::int64_t shards_along(const Mesh& mesh, const PartitionSpec& spec, std::size_t d) {
  std::int64_t n = 1;
  for (const std::string& a : spec.axes(d)) n *= mesh.shape()[mesh.axis_position(a)];
  return n;
}

bool global_ok(const Mesh& mesh, const PartitionSpec& spec, const Shape& global, bool uneven) {
  if (spec.size() > global.size()) return false;
  for (std::int64_t g : global)
    if (g < 0) return false;
  if (uneven) return true;
  for (std::size_t d = 0; d < spec.size(); ++d)
    if (global[d] % shards_along(mesh, spec, d) != 0) return false;
  return true;
}

void check_sharding(const Mesh& mesh, const PartitionSpec& spec, bool uneven, const Shape& global,
                    const std::vector<int>& extra_ranks) {
  const bool ok = sharding_ok(mesh, spec);
  std::optional<NamedSharding> s;
  try {
    s.emplace(mesh, spec, uneven);
  } catch (const InvalidArgument&) {
    FUZZ_CHECK(!ok);
    return;
  }
  FUZZ_CHECK(ok);
  (void)s->to_string();
  (void)s->replicated_axes();
  (void)s->fully_replicated();
  FUZZ_CHECK(*s == NamedSharding(mesh, spec.normalized(), uneven));

  const bool valid = global_ok(mesh, spec, global, uneven);
  Shape block;
  try {
    block = s->shard_shape(global);
  } catch (const InvalidArgument&) {
    FUZZ_CHECK(!valid);
    return;
  }
  FUZZ_CHECK(valid);
  FUZZ_CHECK(block.size() == global.size());
  for (std::size_t d = 0; d < global.size(); ++d) {
    const std::int64_t n = shards_along(mesh, spec, d);
    FUZZ_CHECK(s->num_shards(static_cast<int>(d)) == n);
    if (uneven) {
      FUZZ_CHECK(block[d] == global[d] / n + (global[d] % n != 0));
    } else {
      FUZZ_CHECK(block[d] * n == global[d]);
    }
  }

  // Index ranges: every rank of a small mesh (the tiling is checked too), else a few.
  const std::int64_t size = mesh.size();
  const bool all = size <= 64;
  std::vector<int> ranks;
  if (all) {
    for (int r = 0; r < size; ++r) ranks.push_back(r);
  } else {
    ranks = {0, static_cast<int>(size - 1), static_cast<int>(size / 3)};
  }
  std::vector<std::vector<IndexRange>> seen(global.size());
  for (const int r : ranks) {
    const std::vector<IndexRange> idx = s->index(global, r);
    const Shape local = s->local_shape(global, r);
    FUZZ_CHECK(idx.size() == global.size() && local.size() == global.size());
    for (std::size_t d = 0; d < global.size(); ++d) {
      FUZZ_CHECK(0 <= idx[d].start && idx[d].start <= idx[d].stop && idx[d].stop <= global[d]);
      FUZZ_CHECK(idx[d].size() == local[d]);
      FUZZ_CHECK(local[d] <= block[d]);
      if (!uneven) FUZZ_CHECK(local[d] == block[d]);
      seen[d].push_back(idx[d]);
    }
    (void)s->is_primary(r);
  }
  if (all) {
    for (std::size_t d = 0; d < global.size(); ++d) {
      auto& v = seen[d];
      std::sort(v.begin(), v.end(), [](const IndexRange& a, const IndexRange& b) {
        return std::pair(a.start, a.stop) < std::pair(b.start, b.stop);
      });
      v.erase(std::unique(v.begin(), v.end()), v.end());
      std::int64_t covered = 0;
      for (const IndexRange& r : v) {
        if (r.size() == 0) continue;
        FUZZ_CHECK(r.start == covered);
        covered = r.stop;
      }
      FUZZ_CHECK(covered == global[d]);
    }
  }
  for (const int r : extra_ranks) {
    const bool inside = r >= 0 && r < size;
    try {
      (void)s->index(global, r);
      FUZZ_CHECK(inside);
    } catch (const InvalidArgument&) {
      FUZZ_CHECK(!inside);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const std::string_view mesh_text = in.line();
  const std::string_view spec_text = in.line();
  const std::uint8_t flags = in.u8();
  const bool uneven = flags & 1;

  MeshShape parsed;
  const bool parsed_ok = check_mesh_text(mesh_text, parsed);
  Mesh mesh = Mesh::abstract({}, {});
  bool have_mesh = false;
  if ((flags & 2) == 0 && parsed_ok) {
    have_mesh = make_mesh(parsed.shape, parsed.names, mesh);
  } else if (flags & 2) {
    static const char* kNames[] = {"x", "y", "z", "w", "a4", "x", ""};
    const int ndim = in.u8() % 7;
    std::vector<std::int64_t> shape;
    std::vector<std::string> names;
    for (int i = 0; i < ndim; ++i) {
      names.emplace_back(kNames[in.u8() % 7]);
      shape.push_back(small_or_i64(in));
    }
    have_mesh = make_mesh(std::move(shape), std::move(names), mesh);
  }

  PartitionSpec spec;
  if (!check_spec_text(spec_text, spec) || !have_mesh) return 0;

  const int delta = static_cast<int>(static_cast<std::uint8_t>(in.i8()) % 4) - 1;
  const std::int64_t rank = std::max<std::int64_t>(0, static_cast<std::int64_t>(spec.size()) + delta);
  Shape global;
  for (std::int64_t d = 0; d < rank && d < 16; ++d) global.push_back(small_or_i64(in));
  std::vector<int> extra_ranks(in.u8() % 4);
  for (int& r : extra_ranks) r = in.i32();
  check_sharding(mesh, spec, uneven, global, extra_ranks);
  return 0;
}
