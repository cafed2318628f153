#include "shardkit/sharding/mesh.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <map>
#include <mutex>
#include <set>

#include "shardkit/core/array.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit {
namespace detail {

struct MeshState {
  std::vector<std::int64_t> shape;
  std::vector<std::string> names;
  std::int64_t size = 1;
  std::vector<int> devices;   // rank at each row-major position (empty when row-major)
  std::vector<int> position;  // row-major position of each rank, the inverse of devices (empty when row-major)
  bool row_major = true;      // devices[p] == p for every p
  std::shared_ptr<Communicator> comm;  // null for an abstract mesh
  std::mutex mu;
  std::map<std::vector<std::string>, std::shared_ptr<Communicator>> axis_comms;
};

}  // namespace detail

namespace {

std::shared_ptr<Communicator> world_comm() {
  // One world communicator per process for meshes made without one (created on first use).
  static std::mutex mu;
  static std::weak_ptr<Communicator> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (auto c = cached.lock()) return c;
  auto c = Communicator::world();
  cached = c;
  return c;
}

std::string default_axis_name(std::size_t i) {
  static const char* kNames[] = {"x", "y", "z", "w"};
  if (i < 4) return kNames[i];
  std::string name = "a";
  name += std::to_string(i);
  return name;
}

}  // namespace

MeshShape parse_mesh_shape(std::string_view text) {
  MeshShape out;
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  SHARDKIT_CHECK(!s.empty(), "empty mesh description");
  const bool named = s.find('=') != std::string::npos;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    std::size_t end = s.find_first_of(named ? "," : ",x", pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    SHARDKIT_CHECK(!item.empty(), "cannot parse mesh \"", text, "\": empty item");
    std::string name, size_text = item;
    if (named) {
      const std::size_t eq = item.find('=');
      SHARDKIT_CHECK(eq != std::string::npos && eq > 0, "cannot parse mesh \"", text, "\": expected name=size, got \"",
                     item, "\"");
      name = item.substr(0, eq);
      size_text = item.substr(eq + 1);
    } else {
      name = default_axis_name(out.shape.size());
    }
    SHARDKIT_CHECK(!size_text.empty() && size_text.size() <= 9 &&
                       std::all_of(size_text.begin(), size_text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }),
                   "cannot parse mesh \"", text, "\": \"", size_text, "\" is not a size");
    const std::int64_t size = std::stoll(size_text);
    SHARDKIT_CHECK_GT(size, 0, "cannot parse mesh \"", text, "\": axis '", name, "' must have a positive size");
    SHARDKIT_CHECK(std::find(out.names.begin(), out.names.end(), name) == out.names.end(), "cannot parse mesh \"", text,
                   "\": axis name '", name, "' is used twice");
    out.shape.push_back(size);
    out.names.push_back(name);
    pos = end + 1;
  }
  return out;
}

Mesh::Mesh(std::vector<std::int64_t> shape, std::vector<std::string> axis_names, std::shared_ptr<Communicator> comm)
    : Mesh(std::move(shape), std::move(axis_names), std::vector<int>{}, std::move(comm)) {}

Mesh::Mesh(std::vector<std::int64_t> shape, std::vector<std::string> axis_names, std::vector<int> devices,
           std::shared_ptr<Communicator> comm)
    : Mesh(AbstractTag{}, std::move(shape), std::move(axis_names), std::move(devices)) {
  state_->comm = comm ? std::move(comm) : world_comm();
  if (state_->size != state_->comm->size()) {
    throw InvalidArgument(detail::concat("Mesh ", to_string(), " has ", state_->size, " positions but communicator '",
                                         state_->comm->name(), "' has ", state_->comm->size(),
                                         " ranks: the mesh size must equal the number of processes"));
  }
}

Mesh Mesh::abstract(std::vector<std::int64_t> shape, std::vector<std::string> axis_names, std::vector<int> devices) {
  return Mesh(AbstractTag{}, std::move(shape), std::move(axis_names), std::move(devices));
}

Mesh::Mesh(AbstractTag, std::vector<std::int64_t> shape, std::vector<std::string> axis_names, std::vector<int> devices)
    : state_(std::make_shared<detail::MeshState>()) {
  SHARDKIT_CHECK_EQ(shape.size(), axis_names.size(), "Mesh: one name per axis");
  std::set<std::string> seen;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    SHARDKIT_CHECK(!axis_names[i].empty(), "Mesh: axis ", i, " has an empty name");
    SHARDKIT_CHECK(seen.insert(axis_names[i]).second, "Mesh: axis name '", axis_names[i], "' is used twice");
    SHARDKIT_CHECK_GT(shape[i], 0, "Mesh: axis '", axis_names[i], "' must have a positive size");
    // Ranks are ints: a mesh must have at most INT_MAX positions (checked before the product can overflow).
    SHARDKIT_CHECK(shape[i] <= INT_MAX / state_->size, "Mesh: shape ", shape_to_string(shape),
                   " has more positions than ranks can number (", INT_MAX, ")");
    state_->size *= shape[i];
  }
  const auto n = static_cast<std::size_t>(state_->size);
  state_->shape = std::move(shape);
  state_->names = std::move(axis_names);
  // Row-major (no device array): rank p at position p, with no per-position tables (abstract meshes may have up to
  // INT_MAX positions).
  if (devices.empty()) return;
  SHARDKIT_CHECK_EQ(devices.size(), n, "Mesh: the device array must hold one rank per position of the shape ",
                    shape_to_string(state_->shape));
  // A JAX mesh holds each device once; here a device is a rank, so the array must be a permutation of the ranks.
  state_->position.assign(n, -1);
  for (std::size_t p = 0; p < n; ++p) {
    const int r = devices[p];
    SHARDKIT_CHECK(r >= 0 && static_cast<std::size_t>(r) < n, "Mesh: device array holds rank ", r,
                   ", outside 0..", n - 1, " (it must be a permutation of the ranks 0..", n - 1, ")");
    SHARDKIT_CHECK(state_->position[r] < 0, "Mesh: device array holds rank ", r,
                   " twice (it must be a permutation of the ranks 0..", n - 1, ")");
    state_->position[r] = static_cast<int>(p);
    state_->row_major = state_->row_major && r == static_cast<int>(p);
  }
  if (state_->row_major) {
    state_->position.clear();
    return;
  }
  state_->devices = std::move(devices);
}

Mesh Mesh::line(std::string name, std::shared_ptr<Communicator> comm) {
  auto c = comm ? std::move(comm) : world_comm();
  const std::int64_t n = c->size();
  return Mesh({n}, {std::move(name)}, std::move(c));
}

Mesh Mesh::parse(std::string_view text, std::shared_ptr<Communicator> comm) {
  MeshShape m = parse_mesh_shape(text);
  return Mesh(std::move(m.shape), std::move(m.names), std::move(comm));
}

const std::vector<std::int64_t>& Mesh::shape() const noexcept { return state_->shape; }
const std::vector<std::string>& Mesh::axis_names() const noexcept { return state_->names; }
std::int64_t Mesh::size() const noexcept { return state_->size; }
int Mesh::rank() const noexcept { return state_->comm ? state_->comm->rank() : -1; }
bool Mesh::is_abstract() const noexcept { return state_->comm == nullptr; }
std::vector<int> Mesh::devices() const {
  if (!state_->row_major) return state_->devices;
  std::vector<int> d(static_cast<std::size_t>(state_->size));
  for (std::size_t p = 0; p < d.size(); ++p) d[p] = static_cast<int>(p);
  return d;
}
bool Mesh::is_row_major() const noexcept { return state_->row_major; }
const std::shared_ptr<Communicator>& Mesh::comm() const noexcept { return state_->comm; }

int Mesh::axis_position(std::string_view name) const {
  const auto& n = state_->names;
  const auto it = std::find(n.begin(), n.end(), name);
  if (it == n.end()) {
    std::string known;
    for (const auto& a : n) known += (known.empty() ? "'" : ", '") + a + "'";
    throw InvalidArgument(detail::concat("unknown mesh axis '", name, "' (the mesh has axes ", known, ")"));
  }
  return static_cast<int>(it - n.begin());
}

void Mesh::validate_axes(const Axes& axes, std::string_view what) const {
  // A few names at most: pairwise comparison, no allocation (this runs before every axis collective).
  for (std::size_t i = 0; i < axes.size(); ++i) {
    (void)axis_position(axes[i]);
    for (std::size_t j = 0; j < i; ++j)
      SHARDKIT_CHECK(axes[j] != axes[i], what, ": mesh axis '", axes[i], "' is used twice");
  }
}

std::int64_t Mesh::axis_size(const Axes& axes) const {
  validate_axes(axes, "axis_size");
  std::int64_t n = 1;
  for (const std::string& a : axes) n *= state_->shape[axis_position(a)];
  return n;
}

std::vector<std::int64_t> Mesh::coords(int rank) const {
  SHARDKIT_CHECK(rank >= 0 && rank < state_->size, "rank ", rank, " outside ", to_string(),
                 state_->comm ? "" : " (an abstract mesh has no rank of its own)");
  std::vector<std::int64_t> c(state_->shape.size());
  std::int64_t r = state_->row_major ? rank : state_->position[static_cast<std::size_t>(rank)];
  for (std::size_t i = state_->shape.size(); i-- > 0;) {
    c[i] = r % state_->shape[i];
    r /= state_->shape[i];
  }
  return c;
}

int Mesh::rank_at(const std::vector<std::int64_t>& coords) const {
  SHARDKIT_CHECK_EQ(coords.size(), state_->shape.size(), "rank_at: one coordinate per axis");
  std::int64_t r = 0;
  for (std::size_t i = 0; i < coords.size(); ++i) {
    SHARDKIT_CHECK(coords[i] >= 0 && coords[i] < state_->shape[i], "coordinate ", coords[i], " outside axis '",
                   state_->names[i], "'");
    r = r * state_->shape[i] + coords[i];
  }
  return state_->row_major ? static_cast<int>(r) : state_->devices[static_cast<std::size_t>(r)];
}

std::int64_t Mesh::axis_index(const Axes& axes, int rank) const {
  validate_axes(axes, "axis_index");
  const std::vector<std::int64_t> c = coords(rank);
  std::int64_t idx = 0;
  for (const std::string& a : axes) {
    const int p = axis_position(a);
    idx = idx * state_->shape[p] + c[p];
  }
  return idx;
}

std::shared_ptr<Communicator> Mesh::axis_comm(const Axes& axes) const {
  validate_axes(axes, "axis_comm");
  SHARDKIT_CHECK(state_->comm != nullptr, "the abstract mesh ", to_string(), " has no processes to communicate with");
  if (state_->row_major && axes.size() == state_->names.size()) {
    // All axes in mesh order over row-major ranks: the mesh communicator itself (already ranked by axis index).
    bool in_order = true;
    for (std::size_t i = 0; i < axes.size(); ++i) in_order = in_order && axes[i] == state_->names[i];
    if (in_order) return state_->comm;
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& slot = state_->axis_comms[axes.names()];
  if (!slot) {
    // Ranks that agree on every other axis form a group; within it, order by the row-major index of their coordinates
    // over `axes` (not by rank: on a permuted mesh that order is what all_gather, ppermute and psum_scatter follow).
    const int r = rank();
    const std::vector<std::int64_t> c = coords(r);
    std::int64_t color = 0;
    for (std::size_t i = 0; i < state_->names.size(); ++i)
      if (!axes.contains(state_->names[i])) color = color * state_->shape[i] + c[i];
    slot = state_->comm->split(static_cast<int>(color), static_cast<int>(axis_index(axes, r)),
                               "mesh axes " + (axes.empty() ? std::string("()") : axes.to_string()));
  }
  return slot;
}

std::string Mesh::to_string() const {
  std::string s = "Mesh(";
  for (std::size_t i = 0; i < state_->names.size(); ++i)
    s += (i ? ", " : "") + state_->names[i] + "=" + std::to_string(state_->shape[i]);
  if (!state_->row_major) {
    s += ", devices=[";
    for (std::size_t p = 0; p < state_->devices.size(); ++p) s += (p ? ", " : "") + std::to_string(state_->devices[p]);
    s += "]";
  }
  return s + ")";
}

bool operator==(const Mesh& a, const Mesh& b) noexcept {
  return a.state_ == b.state_ ||
         (a.state_->shape == b.state_->shape && a.state_->names == b.state_->names &&
          a.state_->row_major == b.state_->row_major && a.state_->devices == b.state_->devices && a.state_->comm == b.state_->comm);
}

}  // namespace shardkit
