// load(), inspect(), steps() and latest_step(): readers of committed steps. A load is local: each rank opens the
// chunk files its target block meets and reads only the inner chunks it needs.

#include <algorithm>
#include <map>

#include "chunk_file.hpp"
#include "files.hpp"
#include "metadata.hpp"
#include "shardkit/checkpoint/checkpoint.hpp"
#include "shardkit/core/crc32c.hpp"
#include "shardkit/core/error.hpp"
#include "steps.hpp"

namespace shardkit::checkpoint {

std::string detail::step_path(const std::string& root, std::int64_t step) {
  return root + "/step_" + std::to_string(step);
}

namespace {

using namespace detail;

std::string shape_text(const Shape& s) {
  std::string t = "(";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

// The step's directory, checked to be committed. @throws InvalidArgument naming the steps there are.
std::string committed_step(const std::string& root, std::int64_t step) {
  const std::vector<std::int64_t> all = steps(root);
  if (std::find(all.begin(), all.end(), step) == all.end()) {
    std::string have;
    for (auto s : all) have += (have.empty() ? "" : ", ") + std::to_string(s);
    throw InvalidArgument("checkpoint: step " + std::to_string(step) + " does not exist in '" + root +
                          "' (committed steps: " + (have.empty() ? "none" : have) + ")");
  }
  return step_path(root, step);
}

ArrayMeta read_array(const std::string& dir, const std::string& key) {
  const std::string path = dir + "/" + key + "/" + kZarrJson;
  return parse_array_json(read_text_file(path), path);
}

}  // namespace

std::vector<std::int64_t> steps(const std::string& root) {
  std::vector<std::int64_t> out;
  for (const auto& name : list_dir(root)) {
    if (name.rfind("step_", 0) != 0 || name.size() == 5) continue;
    const std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits.size() > 18)
      continue;
    if (!exists(root + "/" + name + "/" + kZarrJson)) continue;  // written last before the rename
    out.push_back(std::stoll(digits));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::int64_t> latest_step(const std::string& root) {
  const auto all = steps(root);
  if (all.empty()) return std::nullopt;
  return all.back();
}

StepInfo inspect(const std::string& root, std::int64_t step, bool verify) {
  StepInfo info;
  info.step = step;
  info.path = step_path(root, step);
  if (!exists(info.path + "/" + kZarrJson))
    throw InvalidArgument("checkpoint: step " + std::to_string(step) + " does not exist in '" + root + "'");
  const std::string group_path = info.path + "/" + kZarrJson;
  const StepMeta sm = parse_step_json(read_text_file(group_path), group_path);
  info.saved_ranks = sm.world_size;
  info.metadata_json = sm.metadata_json;
  info.tree_json = sm.tree_json;
  // A step's zarr.json, with its manifest, is written only at the commit, just before the rename to step_<N>.
  info.committed = true;
  const std::vector<FileRecord>& files = sm.files;
  for (const auto& key : sm.keys) {
    const ArrayMeta m = read_array(info.path, key);
    ArrayInfo a;
    a.key = key;
    a.shape = m.layout.shape;
    a.dtype = m.layout.dtype;
    a.plain = m.plain;
    a.mesh_shape = m.mesh_shape;
    a.mesh_axes = m.mesh_axes;
    a.mesh_devices = m.mesh_devices;
    a.spec = m.spec;
    a.uneven = m.uneven;
    a.chunk_shape = m.layout.chunk;
    a.inner_chunk_shape = m.layout.inner;
    const std::string prefix = key + "/c";
    for (const auto& f : files)
      if (f.path == prefix || f.path.rfind(prefix + "/", 0) == 0) a.bytes += f.size;
    info.arrays.push_back(std::move(a));
  }
  if (verify && info.committed) {
    std::vector<char> buf(std::size_t{16} << 20);
    for (const auto& f : files) {
      const std::string path = info.path + "/" + f.path;
      if (!exists(path)) throw BackendError("checkpoint", 0, "file '" + path + "' of the step's manifest is missing");
      Fd fd = open_read(path);
      const std::uint64_t size = file_size(fd);
      if (size != f.size)
        throw BackendError("checkpoint", 0, "file '" + path + "' holds " + std::to_string(size) +
                                                " bytes; the manifest says " + std::to_string(f.size));
      std::uint32_t crc = 0;
      for (std::uint64_t off = 0; off < size; off += buf.size()) {
        const std::uint64_t n = std::min<std::uint64_t>(buf.size(), size - off);
        read_at(fd, buf.data(), n, off);
        crc = crc32c(buf.data(), n, crc);
      }
      if (crc != f.crc32c) throw BackendError("checkpoint", 0, "file '" + path + "' fails its crc32c check");
    }
    info.verified = true;
  }
  return info;
}

std::vector<ShardedArray> load(const std::string& root, const Mesh& mesh, const std::vector<Target>& targets,
                               const LoadOptions& options) {
  std::int64_t step = 0;
  if (options.step) {
    step = *options.step;
  } else {
    const auto latest = latest_step(root);
    if (!latest) throw InvalidArgument("load: no committed step in '" + root + "'");
    step = *latest;
  }
  const std::string dir = committed_step(root, step);
  const std::string group_path = dir + "/" + kZarrJson;
  const StepMeta sm = parse_step_json(read_text_file(group_path), group_path);
  std::vector<ShardedArray> out;
  out.reserve(targets.size());
  for (const auto& t : targets) {
    if (std::find(sm.keys.begin(), sm.keys.end(), t.key) == sm.keys.end()) {
      std::string have;
      for (std::size_t i = 0; i < sm.keys.size() && i < 20; ++i) have += (i ? ", " : "") + sm.keys[i];
      if (sm.keys.size() > 20) have += ", ...";
      throw InvalidArgument("load: key '" + t.key + "' is not in step " + std::to_string(step) + " of '" + root +
                            "' (it holds: " + (have.empty() ? "nothing" : have) + ")");
    }
    const ArrayMeta m = read_array(dir, t.key);
    const Layout& l = m.layout;
    if (t.shape && *t.shape != l.shape)
      throw InvalidArgument("load: array '" + t.key + "' was saved with shape " + shape_text(l.shape) +
                            "; the caller expects " + shape_text(*t.shape));
    if (t.dtype && *t.dtype != l.dtype)
      throw InvalidArgument("load: array '" + t.key + "' was saved as " + std::string(dtype_name(l.dtype)) +
                            "; the caller expects " + std::string(dtype_name(*t.dtype)));
    std::optional<NamedSharding> sharding;
    try {
      sharding.emplace(mesh, t.spec, options.uneven.value_or(m.uneven));
      sharding->validate(l.shape);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("load: array '" + t.key + "' of shape " + shape_text(l.shape) + " cannot take " +
                            t.spec.to_string() + " on " + mesh.to_string() + ": " + e.what());
    }
    const Box want = sharding->index(l.shape, mesh.rank());
    Array block = Array::empty(sharding->local_shape(l.shape, mesh.rank()), l.dtype);
    for_each_cell_meeting(want, l.chunk, l.grid(), [&](const std::vector<std::int64_t>& cell) {
      ChunkReader reader(l, cell, dir + "/" + t.key + "/" + chunk_key(cell), t.key);
      reader.read(want, block.data(), want);
    });
    if (options.device.kind != DeviceKind::kCPU) block = block.to(options.device);
    out.emplace_back(l.shape, *sharding, std::move(block));
  }
  return out;
}

}  // namespace shardkit::checkpoint
