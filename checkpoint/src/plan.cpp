#include "plan.hpp"

#include <cstdio>
#include <map>
#include <set>

#include "shardkit/core/error.hpp"

namespace shardkit::checkpoint::detail {

namespace {

void check_key(const std::string& key) {
  if (key.empty()) throw InvalidArgument("save: an empty key");
  std::size_t start = 0;
  while (true) {
    const auto slash = key.find('/', start);
    const std::string seg = key.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (seg.empty() || seg.find_first_not_of('.') == std::string::npos || seg.rfind("__", 0) == 0 || seg == kZarrJson ||
        seg.find('\0') != std::string::npos)
      throw InvalidArgument("save: key '" + key + "' has a segment '" + seg +
                            "' Zarr cannot name (empty, periods only, starting with '__', or a metadata file's name)");
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
}

// The ranks whose block holds chunk `cell`, ascending.
std::vector<int> holders(const Plan& p, const std::vector<std::int64_t>& cell, int comm_size) {
  std::vector<int> out;
  if (p.sharded == nullptr) {
    for (int r = 0; r < comm_size; ++r) out.push_back(r);
    return out;
  }
  const Box chunk = p.meta.layout.chunk_box(cell);
  const NamedSharding& s = p.sharded->sharding();
  for (int r = 0; r < comm_size; ++r) {
    const Box block = s.index(p.meta.layout.shape, r);
    if (intersect(block, chunk) == chunk) out.push_back(r);
  }
  return out;
}

}  // namespace

std::vector<Plan> plan(const std::vector<Entry>& entries, const Communicator& comm, std::int64_t chunk_bytes) {
  std::vector<Plan> plans;
  std::set<std::string> keys;
  for (const auto& e : entries) {
    check_key(e.key);
    if (!keys.insert(e.key).second) throw InvalidArgument("save: key '" + e.key + "' appears twice");
    Plan p;
    p.entry = &e;
    p.meta.key = e.key;
    if (const auto* s = std::get_if<ShardedArray>(&e.value)) {
      const Mesh& m = s->mesh();
      if (m.is_abstract() || m.comm()->size() != comm.size() || m.rank() != comm.rank())
        throw InvalidArgument("save: array '" + e.key + "' is on " + m.to_string() +
                              ", which is not over the saving communicator (" + std::to_string(comm.size()) +
                              " ranks); pass SaveOptions::comm or save each mesh's arrays apart");
      p.sharded = s;
      p.meta.layout.shape = s->shape();
      p.meta.layout.dtype = s->dtype();
      p.meta.layout.chunk = save_chunk_shape(s->shape(), s->sharding());
      p.meta.mesh_shape = m.shape();
      p.meta.mesh_axes = m.axis_names();
      p.meta.mesh_devices = m.devices();
      p.meta.spec = s->spec().normalized();
      p.meta.uneven = s->sharding().uneven();
    } else {
      const Array& a = std::get<Array>(e.value);
      p.meta.plain = true;
      p.meta.layout.shape = a.shape();
      p.meta.layout.dtype = a.dtype();
      p.meta.layout.chunk = plain_chunk_shape(a.shape(), comm.size());
    }
    p.meta.layout.inner = inner_chunk_shape(p.meta.layout.chunk, dtype_size(p.meta.layout.dtype), chunk_bytes);
    // The holders of a block take its chunks in turn (counted per set of holders, so that the copies of every
    // replicated block share its writing, whatever the grid's shape).
    std::map<std::vector<int>, std::int64_t> turns;
    for_each_index(p.meta.layout.grid(), [&](const std::vector<std::int64_t>& cell) {
      const std::vector<int> h = holders(p, cell, comm.size());
      SHARDKIT_ASSERT(!h.empty(), "no rank holds a chunk of '", p.meta.key, "'");
      const std::int64_t turn = turns[h]++;
      if (h[static_cast<std::size_t>(turn % static_cast<std::int64_t>(h.size()))] == comm.rank())
        p.mine.push_back(cell);
    });
    plans.push_back(std::move(p));
  }
  // A key that is another's group (a/b and a/b/c) cannot be both an array and a group.
  for (const auto& k : keys) {
    auto it = keys.lower_bound(k + "/");
    if (it != keys.end() && it->rfind(k + "/", 0) == 0)
      throw InvalidArgument("save: key '" + k + "' is an array and the group of '" + *it + "'");
  }
  return plans;
}

std::string plan_digest(const std::vector<Plan>& plans, const SaveOptions& o) {
  std::string s = "step=" + (o.step ? std::to_string(*o.step) : std::string("auto")) +
                  " keep_last=" + std::to_string(o.keep_last) + " blocking=" + std::to_string(o.blocking) +
                  " rank_state=" + std::to_string(o.rank_state_json.has_value()) + " metadata=" + o.metadata_json +
                  " tree=" + o.tree_json + "\n";
  for (const auto& p : plans) s += array_json(p.meta);
  // FNV-1a (64 bits) and the length: ranks compare this, not the text (every rank's text on every rank would take
  // ranks x keys x hundreds of bytes on each).
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  char out[40];
  std::snprintf(out, sizeof(out), "%zu:%016llx", s.size(), static_cast<unsigned long long>(h));
  return out;
}

}  // namespace shardkit::checkpoint::detail
