#pragma once

// The one description of the distributed matmul algorithms: a table of {algorithm, names, layouts, whether it takes
// uneven shards, body}. The chooser, the preconditions, the resharding of operands, the result's sharding and the
// error messages all read it; each body (local.cpp, allgather_ring.cpp, reduce_scatter_ring.cpp, summa.cpp) only
// computes this rank's block of C from operand blocks already in its layout.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/sharding/matmul.hpp"

namespace shardkit::detail {

/// What cuts one dimension of an operand in a layout.
enum class Cut : std::uint8_t {
  kNone,   ///< not cut
  kAxes,   ///< a mesh axis or tuple of axes, the same wherever it appears in one layout
  kMeshX,  ///< the first axis of a 2-d mesh
  kMeshY,  ///< the second axis of a 2-d mesh
};

/// How A (M x K), B (K x N) and C (M x N) are cut, dimension by dimension.
struct Layout {
  std::array<Cut, 2> a, b, c;
};

/// One rank's operand blocks in an algorithm's layout.
struct Blocks {
  const ShardedArray& a;
  const ShardedArray& b;
  const Axes& axes;  ///< what Cut::kAxes stands for
  bool overlap;      ///< overlap each step's transfer with a GEMM
};

/// One algorithm. Operands matching one of its layouts are taken as they are; others are resharded to the first.
struct MatmulEntry {
  MatmulAlgorithm algorithm;
  std::string_view name;
  std::vector<std::string_view> aliases;  ///< other spellings parse_matmul_algorithm accepts
  std::vector<Layout> layouts;
  bool takes_uneven;            ///< cut dimensions need not divide by their axes' sizes
  Array (*run)(const Blocks&);  ///< this rank's block of C
};

/// Every algorithm, in the order the chooser tries their layouts.
const std::vector<MatmulEntry>& matmul_table();
/// The entry of `algorithm` (kAuto: none). @throws InvalidArgument for kAuto.
const MatmulEntry& matmul_entry(MatmulAlgorithm algorithm);
/// The algorithm for operands that match no layout in the table.
inline constexpr MatmulAlgorithm kFallbackMatmul = MatmulAlgorithm::kLocal;

/// What Cut::kAxes stands for when `a` and `b` are in `layout` as they are; nullopt when they are not.
std::optional<Axes> match_layout(const Layout& layout, const ShardedArray& a, const ShardedArray& b);
/// The spec of one operand of a layout on `mesh`.
/// @throws InvalidArgument, prefixed by `where`, for a 2-d layout on another mesh.
PartitionSpec layout_spec(const std::array<Cut, 2>& cuts, const Mesh& mesh, const Axes& axes, std::string_view where);
/// A layout as text, with `axes` for Cut::kAxes and 'x', 'y' for a 2-d mesh's axes.
std::string layout_text(const Layout& layout);

/// Runs `entry` on a and b: reshards them to its layout (unless they already match one), checks that its cut
/// dimensions divide (unless it takes uneven shards) and wraps the block of C its body computes.
/// @throws InvalidArgument naming the algorithm, its layout and the dimensions that do not fit.
ShardedArray run_matmul(const MatmulEntry& entry, const ShardedArray& a, const ShardedArray& b, bool overlap);

/// Message tags of the rings (each ring runs on its own axis communicator; distinct tags keep a stray message of
/// one from matching the other).
enum MatmulTag : int {
  kAllGatherRingTag = 23,
  kReduceScatterRingTag = 29,
};

/// The bodies.
Array local_gemm(const Blocks& blocks);
Array allgather_ring(const Blocks& blocks);
Array reduce_scatter_ring(const Blocks& blocks);
Array summa(const Blocks& blocks);

}  // namespace shardkit::detail
