#pragma once
// Sharded checkpoints: a step is a Zarr v3 group under `root/step_<N>`, one Zarr array per key, its chunk grid the
// save-time block grid, each chunk file (a `sharding_indexed` shard with crc32c on every inner chunk and on the index)
// written whole by one rank. A step becomes visible only by the rename of its temporary directory, after every rank
// has written and synced its files; loading reads onto any mesh and specs, each rank reading only the inner chunks
// its block intersects. The format is described in docs/cpp.md ("Checkpoints").

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/sharding/sharded_array.hpp"

namespace shardkit::checkpoint {

/// One array of a step: a key path ("params/dense/w", segments separated by '/') and either a ShardedArray or a
/// plain Array that every rank holds alike (a scalar is a 0-d Array).
struct Entry {
  std::string key;
  std::variant<ShardedArray, Array> value;
};

/// How to save a step.
struct SaveOptions {
  /// The step's number; by default one past the newest committed step (0 in an empty root).
  std::optional<std::int64_t> step;
  /// User metadata: any JSON value, kept in the group's attributes ("null": none).
  std::string metadata_json = "null";
  /// The tree the keys came from, as JSON (the Python package keeps its pytree's structure here; "null": none).
  std::string tree_json = "null";
  /// After the commit, keep only the newest `keep_last` committed steps and the one just saved (0: keep every step);
  /// the others leave the steps at the commit and are removed in the background (wait_for_saves() waits for that).
  int keep_last = 0;
  /// The ranks that save together: by default the communicator of the first ShardedArray's mesh, else the world.
  std::shared_ptr<Communicator> comm;
  /// Target bytes of an inner chunk, the unit a load reads (chunks divide the save-time blocks exactly).
  std::int64_t chunk_bytes = std::int64_t{4} << 20;
  /// fsync every file and directory before the commit (turn off only for scratch data).
  bool sync = true;
  /// This rank's own state that is not an array (a data loader's position, an RNG's state) as one JSON value, kept
  /// per rank with the saving communicator's size; every rank passes one or none does. Stored as the arrays
  /// "%rank_state/bytes" (a row per rank: its UTF-8 text, zero-padded) and "%rank_state/lengths" (the texts' lengths),
  /// which the Python package's load_rank_state reads.
  std::optional<std::string> rank_state_json;
  /// A failure this rank met preparing its entries (a binding's conversion of a leaf, say): the save still takes
  /// part in the agreement, which makes every rank raise it (InvalidArgument) instead of leaving the others waiting.
  std::string caller_failure;
  /// false: save() returns once this rank's blocks are staged (copied to host memory the caller may then
  /// overwrite); a background thread, which makes no collective call, writes the files, and the commit runs at
  /// SaveHandle::wait(), at the next save() or at wait_for_saves(). At most one save is in flight.
  bool blocking = true;
  /// A background save's writer thread runs this much below the caller's priority (added to the thread's nice value,
  /// at most 19; 0: the caller's). By default the lowest: a caller busy on every core (a training loop on the CPU)
  /// keeps them, and the writer writes in their idle time and when the caller waits (wait(), the next save); on a
  /// GPU job, whose host cores are mostly idle, it writes at full speed either way.
  int writer_nice = 19;
};

namespace detail {
struct PendingSave;
}

/// A save, in flight or committed.
class SaveHandle {
 public:
  SaveHandle() = default;
  explicit SaveHandle(std::shared_ptr<detail::PendingSave> state) : state_(std::move(state)) {}
  std::int64_t step() const;
  /// The step's directory once committed.
  const std::string& path() const;
  /// Bytes this rank wrote (its chunk files); known once the save is done.
  std::uint64_t bytes_written() const;
  /// True once a wait() has finished the save (committed or failed): a background save commits only in a wait(), the
  /// next save() or wait_for_saves().
  bool done() const;
  /// Finishes the save: waits for this rank's writes, agrees with the other ranks that every rank's succeeded, and
  /// (rank 0) commits. Collective over the saving communicator while the save is in flight; returns at once after.
  /// @throws the save's error (on every rank alike), now and at every later wait().
  void wait();

 private:
  std::shared_ptr<detail::PendingSave> state_;
};

/// Saves `entries` as a new step under `root` (created if missing). Collective over the saving communicator: every
/// rank passes the same keys, shapes, dtypes and shardings (compared; a difference is a MismatchError on every rank).
/// Each chunk file is written by one rank, the copies of a replicated block splitting the writing among them. Every
/// rank writes and syncs its files, the ranks agree that all did, then one rank writes the manifest and renames the
/// step into place; a failure anywhere means no rank commits and every rank raises. A save still in flight is
/// finished first.
/// @throws InvalidArgument for a bad key, a key twice, a step that exists, a mesh not over the saving communicator;
///         BackendError (backend "filesystem") when a file cannot be written.
SaveHandle save(const std::string& root, const std::vector<Entry>& entries, const SaveOptions& options = {});

/// Finishes the save in flight, if any (collective over its communicator, like SaveHandle::wait()), and waits for the
/// removals saves queued (keep_last's older steps and what failed saves left: a save renames them out of the steps'
/// names and removes them on a background thread, so that it returns once its step is committed). A program that
/// saves with blocking = false calls it before it exits (the Python package does, at exit; the removals also finish
/// at exit).
void wait_for_saves();

/// What a step holds about one array.
struct ArrayInfo {
  std::string key;
  Shape shape;
  DType dtype = DType::kFloat32;
  /// True for a plain array (held by every rank at save time): no mesh or spec.
  bool plain = false;
  std::vector<std::int64_t> mesh_shape;  ///< the saved mesh's shape
  std::vector<std::string> mesh_axes;    ///< and its axis names
  std::vector<int> mesh_devices;         ///< the rank at each row-major position of the saved mesh
  PartitionSpec spec;                    ///< the saved spec
  bool uneven = false;                   ///< the saved sharding's evenness
  Shape chunk_shape;                     ///< the chunk grid (one file per chunk)
  Shape inner_chunk_shape;               ///< the unit of reading inside a chunk file
  std::uint64_t bytes = 0;               ///< bytes of its chunk files
};

/// What a step holds.
struct StepInfo {
  std::int64_t step = 0;
  std::string path;
  bool committed = false;  ///< renamed into place with a manifest
  bool verified = false;   ///< every file's size and crc32c checked against the manifest (inspect(..., verify))
  int saved_ranks = 0;     ///< the saving communicator's size
  std::string metadata_json = "null";
  std::string tree_json = "null";
  std::vector<ArrayInfo> arrays;
};

/// The committed steps under `root`, ascending (none for a missing root). Temporary directories are not steps.
std::vector<std::int64_t> steps(const std::string& root);

/// The newest committed step, or nothing.
std::optional<std::int64_t> latest_step(const std::string& root);

/// What step `step` holds, read from its metadata (no mesh needed, local to the calling rank). With `verify`, reads
/// every file and checks its size and crc32c against the manifest.
/// @throws InvalidArgument for a step that does not exist; BackendError when a file is damaged (naming it).
StepInfo inspect(const std::string& root, std::int64_t step, bool verify = false);

/// One array to load: its key, the spec to shard it by on the target mesh, and optionally the shape and dtype the
/// caller expects (a difference is an InvalidArgument naming the key and both values).
struct Target {
  std::string key;
  PartitionSpec spec;
  std::optional<Shape> shape;
  std::optional<DType> dtype;
};

/// How to load.
struct LoadOptions {
  /// The step; by default the newest committed one.
  std::optional<std::int64_t> step;
  /// Whether the target shardings may cut unevenly; by default as saved (an array saved evenly must divide evenly
  /// on the target mesh unless this is true).
  std::optional<bool> uneven;
  /// Where the loaded blocks live (default: the CPU).
  Device device = Device::cpu();
};

/// Loads `targets` onto `mesh`: each rank reads the inner chunks its target block intersects (and nothing else),
/// checks their crc32c, and gets its block of `distribute(global, NamedSharding(mesh, spec))`, bit for bit. Local:
/// no collective (every rank reads what it needs itself).
/// @throws InvalidArgument for a missing step or key (naming it), a shape or dtype that differs from the caller's,
///         a spec the mesh cannot take; BackendError when a file is missing or damaged (naming file, array, chunk).
std::vector<ShardedArray> load(const std::string& root, const Mesh& mesh, const std::vector<Target>& targets,
                               const LoadOptions& options = {});

}  // namespace shardkit::checkpoint
