#pragma once
// The JSON of a checkpoint: each array's zarr.json (Zarr v3 array metadata with the sharding_indexed codec and
// crc32c, and shardkit's attributes: key, saved mesh and spec) and the step group's zarr.json (the keys, the step, the
// saving world's size, user metadata, the tree, and the manifest: every other file's size and crc32c). The step's
// zarr.json is the last file written before the commit's rename; the manifest lives in it, not in a file of its own,
// because Zarr readers (zarr-python) warn of every file in a group that is not a Zarr node.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "layout.hpp"
#include "shardkit/sharding/partition_spec.hpp"

namespace shardkit::checkpoint::detail {

/// Zarr's metadata file name.
inline constexpr const char* kZarrJson = "zarr.json";

/// What an array's zarr.json holds.
struct ArrayMeta {
  std::string key;
  Layout layout;
  bool plain = false;
  std::vector<std::int64_t> mesh_shape;
  std::vector<std::string> mesh_axes;
  std::vector<int> mesh_devices;
  PartitionSpec spec;
  bool uneven = false;
};

/// One file of a step: its path relative to the step's directory, size and crc32c.
struct FileRecord {
  std::string path;
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};

/// What a step group's zarr.json holds.
struct StepMeta {
  std::int64_t step = 0;
  int world_size = 0;
  std::string metadata_json = "null";
  std::string tree_json = "null";
  std::vector<std::string> keys;
  std::vector<FileRecord> files;  ///< the manifest
};

std::string array_json(const ArrayMeta& meta);
/// @throws BackendError naming `path` when the text is not an array this version can read.
ArrayMeta parse_array_json(const std::string& text, const std::string& path);

std::string step_json(const StepMeta& meta);
/// A plain Zarr v3 group (the groups between a step and its arrays).
std::string group_json();
/// @throws BackendError naming `path` when the text is not a shardkit step group.
StepMeta parse_step_json(const std::string& text, const std::string& path);


/// A rank's file records as compact text, and back (they travel between ranks at the commit).
std::string records_text(const std::vector<FileRecord>& files);
std::vector<FileRecord> parse_records_text(const std::string& text);

/// Checks `text` (the option `what`) is one JSON value. @throws InvalidArgument.
void check_json(const std::string& text, const char* what);

}  // namespace shardkit::checkpoint::detail
