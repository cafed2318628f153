#include "shardkit/sharding/named_sharding.hpp"

#include <algorithm>
#include <set>

#include "shardkit/core/error.hpp"

namespace shardkit {

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec, bool uneven)
    : mesh_(std::move(mesh)), spec_(std::move(spec)), uneven_(uneven) {
  std::set<std::string> seen;
  for (std::size_t d = 0; d < spec_.size(); ++d) {
    for (const std::string& a : spec_[d].axes()) {
      (void)mesh_.axis_position(a);  // throws for an unknown axis, naming the mesh's axes
      SHARDKIT_CHECK(seen.insert(a).second, "partition spec ", spec_.to_string(), " uses mesh axis '", a,
                     "' twice (each mesh axis may shard at most one dimension, once)");
    }
  }
}

namespace {

// ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b.
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// min(i * chunk, limit) for i, chunk, limit >= 0, without overflowing when i * chunk would pass limit.
std::int64_t clamped_product(std::int64_t i, std::int64_t chunk, std::int64_t limit) {
  if (chunk != 0 && i > limit / chunk) return limit;
  return std::min(i * chunk, limit);
}

}  // namespace

void NamedSharding::validate(const Shape& global) const {
  SHARDKIT_CHECK(spec_.size() <= global.size(), "partition spec ", spec_.to_string(), " has ", spec_.size(),
                 " entries but the array has rank ", global.size(), " (shape ", shape_to_string(global), ")");
  for (std::size_t d = 0; d < global.size(); ++d)
    SHARDKIT_CHECK_GE(global[d], 0, "negative size in dimension ", d, " of the global shape ", shape_to_string(global));
  if (uneven_) return;
  for (std::size_t d = 0; d < spec_.size(); ++d) {
    const std::int64_t n = num_shards(static_cast<int>(d));
    if (global[d] % n != 0) {
      std::string sizes;
      for (const std::string& a : spec_[d].axes())
        sizes += (sizes.empty() ? "" : ", ") + a + "=" + std::to_string(mesh_.axis_size(a));
      throw InvalidArgument(detail::concat("dimension ", d, " of size ", global[d], " is not divisible by ", n,
                                           ", the number of shards over mesh axes ", spec_[d].axes().to_string(), " (",
                                           sizes, "); pad the array, or opt in to uneven shards (uneven=true)"));
    }
  }
}

std::int64_t NamedSharding::num_shards(int d) const { return mesh_.axis_size(spec_.axes(static_cast<std::size_t>(d))); }

std::int64_t NamedSharding::shard_index(int d, int rank) const {
  return mesh_.axis_index(spec_.axes(static_cast<std::size_t>(d)), rank);
}

Shape NamedSharding::shard_shape(const Shape& global) const {
  validate(global);
  Shape s = global;
  for (std::size_t d = 0; d < spec_.size(); ++d) s[d] = ceil_div(global[d], num_shards(static_cast<int>(d)));
  return s;
}

std::vector<IndexRange> NamedSharding::index(const Shape& global, int rank) const {
  validate(global);
  // Also when no dimension is sharded: a rank outside the mesh holds no block.
  (void)mesh_.coords(rank);
  std::vector<IndexRange> out(global.size());
  for (std::size_t d = 0; d < global.size(); ++d) {
    if (d >= spec_.size() || spec_[d].is_none()) {
      out[d] = {0, global[d]};
      continue;
    }
    const std::int64_t n = num_shards(static_cast<int>(d));
    const std::int64_t chunk = ceil_div(global[d], n);  // equals global/n when even
    const std::int64_t i = shard_index(static_cast<int>(d), rank);
    out[d] = {clamped_product(i, chunk, global[d]), clamped_product(i + 1, chunk, global[d])};
  }
  return out;
}

Shape NamedSharding::local_shape(const Shape& global, int rank) const {
  const std::vector<IndexRange> idx = index(global, rank);
  Shape s(idx.size());
  for (std::size_t d = 0; d < idx.size(); ++d) s[d] = idx[d].size();
  return s;
}

std::vector<std::string> NamedSharding::replicated_axes() const {
  const std::vector<std::string> used = spec_.used_axes();
  std::vector<std::string> out;
  for (const std::string& a : mesh_.axis_names())
    if (std::find(used.begin(), used.end(), a) == used.end()) out.push_back(a);
  return out;
}

bool NamedSharding::is_primary(int rank) const {
  const std::vector<std::int64_t> c = mesh_.coords(rank);
  for (const std::string& a : replicated_axes())
    if (c[mesh_.axis_position(a)] != 0) return false;
  return true;
}

bool NamedSharding::fully_replicated() const {
  for (std::size_t d = 0; d < spec_.size(); ++d)
    if (num_shards(static_cast<int>(d)) > 1) return false;
  return true;
}

bool operator==(const NamedSharding& a, const NamedSharding& b) {
  return a.mesh_ == b.mesh_ && a.spec_ == b.spec_ && a.uneven_ == b.uneven_;
}

std::string NamedSharding::to_string() const {
  return detail::concat("NamedSharding(mesh=", mesh_.to_string(), ", spec=", spec_.to_string(),
                        uneven_ ? ", uneven" : "", ")");
}

}  // namespace shardkit
