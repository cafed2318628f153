#include "metadata.hpp"

#include <nlohmann/json.hpp>

#include "shardkit/core/error.hpp"

namespace shardkit::checkpoint::detail {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kFormatVersion = 1;

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw BackendError("checkpoint", 0, "cannot read checkpoint metadata '" + path + "': " + why);
}

Json fill_value(DType t) {
  if (t == DType::kBool) return false;
  if (is_complex(t)) return Json::array({0.0, 0.0});
  if (is_floating(t)) return 0.0;
  return 0;
}

Json bytes_codec(DType t) {
  Json c = {{"name", "bytes"}};
  if (dtype_size(t) > 1) c["configuration"] = {{"endian", "little"}};
  return c;
}

Json spec_json(const PartitionSpec& spec) {
  Json out = Json::array();
  for (const auto& e : spec.entries()) {
    if (e.is_none())
      out.push_back(nullptr);
    else if (e.axes().size() == 1)
      out.push_back(e.axes()[0]);
    else
      out.push_back(e.axes().names());
  }
  return out;
}

PartitionSpec parse_spec(const Json& j) {
  std::vector<PartitionSpec::Entry> entries;
  for (const auto& e : j) {
    if (e.is_null())
      entries.emplace_back(kNone);
    else if (e.is_string())
      entries.emplace_back(e.get<std::string>());
    else
      entries.emplace_back(Axes(e.get<std::vector<std::string>>()));
  }
  return PartitionSpec(std::move(entries));
}

Shape shape_of(const Json& j) { return j.get<Shape>(); }

}  // namespace

std::string array_json(const ArrayMeta& m) {
  const Layout& l = m.layout;
  Json attrs = {{"key", m.key}, {"plain", m.plain}};
  if (!m.plain) {
    attrs["mesh"] = {{"shape", m.mesh_shape}, {"axes", m.mesh_axes}, {"devices", m.mesh_devices}};
    attrs["spec"] = spec_json(m.spec);
    attrs["uneven"] = m.uneven;
  }
  Json j = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", l.shape},
      {"data_type", std::string(dtype_name(l.dtype))},
      {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", l.chunk}}}}},
      {"chunk_key_encoding", {{"name", "default"}, {"configuration", {{"separator", "/"}}}}},
      {"fill_value", fill_value(l.dtype)},
      {"codecs",
       Json::array({{{"name", "sharding_indexed"},
                     {"configuration",
                      {{"chunk_shape", l.inner},
                       {"codecs", Json::array({bytes_codec(l.dtype), {{"name", "crc32c"}}})},
                       {"index_codecs", Json::array({bytes_codec(DType::kUInt64), {{"name", "crc32c"}}})},
                       {"index_location", "end"}}}}})},
      {"attributes", {{"shardkit", attrs}}},
  };
  return j.dump(2) + "\n";
}

ArrayMeta parse_array_json(const std::string& text, const std::string& path) {
  try {
    const Json j = Json::parse(text);
    if (j.at("zarr_format") != 3 || j.at("node_type") != "array") bad(path, "not a Zarr v3 array");
    ArrayMeta m;
    m.layout.shape = shape_of(j.at("shape"));
    m.layout.dtype = dtype_from_name(j.at("data_type").get<std::string>());
    m.layout.chunk = shape_of(j.at("chunk_grid").at("configuration").at("chunk_shape"));
    const Json& codecs = j.at("codecs");
    if (codecs.size() != 1 || codecs[0].at("name") != "sharding_indexed")
      bad(path, "codecs other than one sharding_indexed are not written by shardkit");
    const Json& conf = codecs[0].at("configuration");
    m.layout.inner = shape_of(conf.at("chunk_shape"));
    if (conf.at("index_location") != "end") bad(path, "index_location must be 'end'");
    for (const char* field : {"codecs", "index_codecs"}) {
      const Json& chain = conf.at(field);
      if (chain.size() != 2 || chain[0].at("name") != "bytes" || chain[1].at("name") != "crc32c")
        bad(path, std::string(field) + " must be [bytes, crc32c]");
    }
    if (m.layout.chunk.size() != m.layout.shape.size() || m.layout.inner.size() != m.layout.shape.size())
      bad(path, "chunk shapes do not match the array's rank");
    for (std::size_t d = 0; d < m.layout.shape.size(); ++d)
      if (m.layout.chunk[d] <= 0 || m.layout.inner[d] <= 0 || m.layout.chunk[d] % m.layout.inner[d] != 0)
        bad(path, "inner chunks do not tile the chunks");
    const Json& a = j.at("attributes").at("shardkit");
    m.key = a.at("key").get<std::string>();
    m.plain = a.at("plain").get<bool>();
    if (!m.plain) {
      m.mesh_shape = a.at("mesh").at("shape").get<std::vector<std::int64_t>>();
      m.mesh_axes = a.at("mesh").at("axes").get<std::vector<std::string>>();
      m.mesh_devices = a.at("mesh").at("devices").get<std::vector<int>>();
      m.spec = parse_spec(a.at("spec"));
      m.uneven = a.at("uneven").get<bool>();
    }
    return m;
  } catch (const Json::exception& e) {
    bad(path, e.what());
  } catch (const InvalidArgument& e) {
    bad(path, e.what());
  }
}

std::string step_json(const StepMeta& m) {
  Json attrs = {{"format", "shardkit-checkpoint"},
                {"version", kFormatVersion},
                {"step", m.step},
                {"world_size", m.world_size},
                {"keys", m.keys},
                {"metadata", Json::parse(m.metadata_json)},
                {"tree", Json::parse(m.tree_json)}};
  Json files = Json::object();
  for (const auto& r : m.files) files[r.path] = {{"size", r.size}, {"crc32c", r.crc32c}};
  attrs["manifest"] = files;
  const Json j = {{"zarr_format", 3}, {"node_type", "group"}, {"attributes", {{"shardkit", attrs}}}};
  return j.dump(2) + "\n";
}

std::string group_json() {
  const Json j = {{"zarr_format", 3}, {"node_type", "group"}, {"attributes", Json::object()}};
  return j.dump(2) + "\n";
}

StepMeta parse_step_json(const std::string& text, const std::string& path) {
  try {
    const Json j = Json::parse(text);
    const Json& a = j.at("attributes").at("shardkit");
    if (a.at("format") != "shardkit-checkpoint") bad(path, "not a shardkit checkpoint step");
    if (a.at("version").get<int>() > kFormatVersion)
      bad(path, "written by a newer shardkit (format version " + a.at("version").dump() + ")");
    StepMeta m;
    m.step = a.at("step").get<std::int64_t>();
    m.world_size = a.at("world_size").get<int>();
    m.keys = a.at("keys").get<std::vector<std::string>>();
    m.metadata_json = a.at("metadata").dump();
    m.tree_json = a.contains("tree") ? a.at("tree").dump() : "null";
    for (const auto& [name, v] : a.at("manifest").items())
      m.files.push_back({name, v.at("size").get<std::uint64_t>(), v.at("crc32c").get<std::uint32_t>()});
    return m;
  } catch (const Json::exception& e) {
    bad(path, e.what());
  }
}

std::string records_text(const std::vector<FileRecord>& files) {
  Json j = Json::array();
  for (const auto& r : files) j.push_back({r.path, r.size, r.crc32c});
  return j.dump();
}

std::vector<FileRecord> parse_records_text(const std::string& text) {
  std::vector<FileRecord> out;
  if (text.empty()) return out;
  for (const auto& r : Json::parse(text))
    out.push_back({r.at(0).get<std::string>(), r.at(1).get<std::uint64_t>(), r.at(2).get<std::uint32_t>()});
  return out;
}

void check_json(const std::string& text, const char* what) {
  if (!Json::accept(text))
    throw InvalidArgument(std::string("save: ") + what + " is not one JSON value: " + text.substr(0, 200));
}

}  // namespace shardkit::checkpoint::detail
