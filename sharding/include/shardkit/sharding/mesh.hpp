#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/sharding/partition_spec.hpp"

namespace shardkit {

/// Shape and axis names of a mesh, as parsed from text.
struct MeshShape {
  std::vector<std::int64_t> shape;
  std::vector<std::string> names;
};
/// Parses "x=2,y=4" (names and sizes) or "2x4" / "2,4" (sizes; names x, y, z, w, then a4, a5, ...).
/// @throws InvalidArgument on malformed text, non-positive sizes or repeated names.
MeshShape parse_mesh_shape(std::string_view text);

namespace detail {
struct MeshState;
}

/// Processes arranged on named axes, like JAX's Mesh: the ranks 0..P-1 of a communicator placed on the positions of
/// `shape`, row-major by default, or as a device array says (rank `devices[p]` at row-major position p, as JAX places
/// device `devices.flat[p]`). Every mapping between ranks and coordinates (blocks, axis indices, the order of ranks
/// in axis communicators) goes through coords() and rank_at(). A Mesh is a cheap handle: copies share the
/// communicators made for its axes, which are created on first use (a collective over the mesh) and cached per axis
/// subset.
class Mesh {
 public:
  /// Ranks in row-major order over `shape`.
  /// @throws InvalidArgument when names repeat or are empty, sizes are not positive, the product of the shape
  ///         exceeds INT_MAX (ranks are ints), or it differs from the communicator's size.
  Mesh(std::vector<std::int64_t> shape, std::vector<std::string> axis_names,
       std::shared_ptr<Communicator> comm = nullptr /* the world */);
  /// Rank `devices[p]` at row-major position p of `shape` (JAX's Mesh(np.array(devices).reshape(shape), names)).
  /// @throws InvalidArgument as above, or when `devices` is not a permutation of 0..size-1 (wrong length, a rank
  ///         outside the range, a rank twice).
  Mesh(std::vector<std::int64_t> shape, std::vector<std::string> axis_names, std::vector<int> devices,
       std::shared_ptr<Communicator> comm = nullptr /* the world */);

 private:
  struct AbstractTag {};
  Mesh(AbstractTag, std::vector<std::int64_t> shape, std::vector<std::string> axis_names, std::vector<int> devices);

 public:
  /// A 1-d mesh over every rank of `comm` (the world by default), with axis `name`.
  static Mesh line(std::string name = "x", std::shared_ptr<Communicator> comm = nullptr);
  /// From text, see parse_mesh_shape.
  static Mesh parse(std::string_view text, std::shared_ptr<Communicator> comm = nullptr);
  /// A mesh with no processes behind it (as JAX's AbstractMesh): shard shapes and index ranges can be worked out
  /// for any size, but rank() is -1 and anything that communicates raises InvalidArgument.
  static Mesh abstract(std::vector<std::int64_t> shape, std::vector<std::string> axis_names,
                       std::vector<int> devices = {} /* row-major */);

  const std::vector<std::int64_t>& shape() const noexcept;
  const std::vector<std::string>& axis_names() const noexcept;
  int ndim() const noexcept { return static_cast<int>(shape().size()); }
  std::int64_t size() const noexcept;
  /// Position of a named axis. @throws InvalidArgument for an unknown name (listing the mesh's axes).
  int axis_position(std::string_view name) const;
  /// Product of the sizes of `axes`. @throws InvalidArgument for unknown or repeated axes.
  std::int64_t axis_size(const Axes& axes) const;
  /// The rank at each row-major position (JAX's mesh.devices, flattened; 0..size-1 in order unless permuted).
  std::vector<int> devices() const;
  /// True when rank p sits at row-major position p.
  bool is_row_major() const noexcept;
  /// Mesh coordinates of a rank. @throws InvalidArgument for a rank outside the mesh.
  std::vector<std::int64_t> coords(int rank) const;
  /// The rank at some coordinates. @throws InvalidArgument for coordinates outside the mesh.
  int rank_at(const std::vector<std::int64_t>& coords) const;
  /// Row-major index of `rank`'s coordinates over `axes` (major to minor as given).
  std::int64_t axis_index(const Axes& axes, int rank) const;
  /// This process's rank in the mesh's communicator (-1 for an abstract mesh).
  int rank() const noexcept;
  bool is_abstract() const noexcept;
  std::int64_t axis_index(const Axes& axes) const { return axis_index(axes, rank()); }

  /// The communicator over every rank of the mesh (nullptr for an abstract mesh).
  const std::shared_ptr<Communicator>& comm() const noexcept;
  /// The communicator over the ranks that differ from this one only along `axes`, ranked by axis_index(axes).
  /// Created on first use (collective over the mesh) and cached; an empty Axes gives a one-rank communicator.
  std::shared_ptr<Communicator> axis_comm(const Axes& axes) const;
  /// Checks that every axis exists and none repeats. @throws InvalidArgument.
  void validate_axes(const Axes& axes, std::string_view what) const;

  /// "Mesh(x=2, y=2)", or "Mesh(x=2, y=2, devices=[3, 1, 2, 0])" when the ranks are not in row-major order.
  std::string to_string() const;
  /// Same shape, names, device order and communicator.
  friend bool operator==(const Mesh& a, const Mesh& b) noexcept;

 private:
  std::shared_ptr<detail::MeshState> state_;
};

}  // namespace shardkit
