// save(): plan every array's chunks and writers (the same on every rank), stage this rank's blocks, write its chunk
// files into the step's temporary directory (on the caller's thread, or on a background thread that makes no
// collective call), then at wait() agree that every rank did, and rank 0 writes the metadata (the manifest last) and
// renames the directory into place.

#include <csignal>
#include <cstdlib>
#include <random>
#include <mutex>
#include <set>
#include <thread>

#include "agree.hpp"
#include "chunk_file.hpp"
#include "files.hpp"
#include "metadata.hpp"
#include "shardkit/checkpoint/checkpoint.hpp"
#include "shardkit/core/crc32c.hpp"
#include "shardkit/core/error.hpp"
#include "steps.hpp"

namespace shardkit::checkpoint {

using namespace detail;

namespace {

// Test hooks: SHARDKIT_CHECKPOINT_TEST_KILL=<stage>:<rank> kills that rank with SIGKILL at that stage of a save, and
// SHARDKIT_CHECKPOINT_TEST_FAIL=<stage>:<rank> makes it raise there ("write": after each chunk file it writes;
// "manifest": rank 0 once every rank has written, before the step's zarr.json (which holds the manifest); "rename":
// rank 0 after it, before
// the step's rename; "cleanup": rank 0 between keep_last's renames).
bool hook_set(const char* variable, const char* stage, int rank) {
  const char* spec = std::getenv(variable);
  if (spec == nullptr) return false;
  const std::string s = spec;
  const auto colon = s.find(':');
  return colon != std::string::npos && s.substr(0, colon) == stage && std::atoi(s.c_str() + colon + 1) == rank;
}

void kill_point(const char* stage, int rank) {
  if (hook_set("SHARDKIT_CHECKPOINT_TEST_KILL", stage, rank)) std::raise(SIGKILL);
  if (hook_set("SHARDKIT_CHECKPOINT_TEST_FAIL", stage, rank))
    throw BackendError("filesystem", 0, std::string("injected failure at '") + stage + "' (SHARDKIT_CHECKPOINT_TEST_FAIL)");
}

void check_key(const std::string& key) {
  if (key.empty()) throw InvalidArgument("save: an empty key");
  std::size_t start = 0;
  while (true) {
    const auto slash = key.find('/', start);
    const std::string seg = key.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (seg.empty() || seg == "." || seg == ".." || seg.rfind("__", 0) == 0 || seg == kZarrJson ||
        seg.find('\0') != std::string::npos)
      throw InvalidArgument("save: key '" + key + "' has a segment '" + seg +
                            "' Zarr cannot name (empty, '.', '..', starting with '__', or a metadata file's name)");
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
}

}  // namespace

namespace detail {

// Everything about one entry every rank works out alike, and this rank's part: the chunk files it writes and the
// host copy of its block they come from.
struct Plan {
  ArrayMeta meta;
  const Entry* entry = nullptr;               // the caller's, until staged
  const ShardedArray* sharded = nullptr;      // likewise
  std::vector<std::vector<std::int64_t>> mine;
  Array host;
  Box block_box;
};

// A save from its start to its commit; shared by its SaveHandles and the in-flight slot.
struct PendingSave {
  std::shared_ptr<Communicator> comm;
  SaveOptions options;
  std::string root;
  std::string tmp;
  std::string path;
  std::int64_t step = 0;
  std::vector<Plan> plans;
  std::thread writer;
  // Written by the writer, read after joining it.
  std::vector<FileRecord> records;
  std::string write_failure;
  std::uint64_t bytes = 0;
  // The test hooks of the "write" stage, read on the caller's thread (the environment is not the writer's to read).
  bool kill_at_write = false;
  bool fail_at_write = false;
  // Guarded by mu.
  std::mutex mu;
  bool finished = false;
  std::exception_ptr error;
};

}  // namespace detail

namespace {

std::mutex g_in_flight_mu;
std::shared_ptr<detail::PendingSave> g_in_flight;

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

std::int64_t linear(const std::vector<std::int64_t>& cell, const Shape& grid) {
  std::int64_t l = 0;
  for (std::size_t d = 0; d < cell.size(); ++d) l = l * grid[d] + cell[d];
  return l;
}

std::shared_ptr<Communicator> saving_comm(const std::vector<Entry>& entries, const SaveOptions& options) {
  if (options.comm) return options.comm;
  for (const auto& e : entries)
    if (const auto* s = std::get_if<ShardedArray>(&e.value)) {
      SHARDKIT_CHECK(!s->mesh().is_abstract(), "save: array '", e.key, "' is on an abstract mesh");
      return s->mesh().comm();
    }
  return Communicator::world();
}

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
    const Shape grid = p.meta.layout.grid();
    for_each_index(grid, [&](const std::vector<std::int64_t>& cell) {
      const std::vector<int> h = holders(p, cell, comm.size());
      SHARDKIT_ASSERT(!h.empty(), "no rank holds a chunk of '", p.meta.key, "'");
      if (h[static_cast<std::size_t>(linear(cell, grid) % static_cast<std::int64_t>(h.size()))] == comm.rank())
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

// The host copy of this rank's block that its chunk files come from: the caller's array itself when the save
// writes before returning and the block is on the host and contiguous, a copy otherwise (the caller may overwrite
// its arrays once a background save has returned).
void stage(Plan& p, int rank, bool copy) {
  if (p.mine.empty()) return;
  const Array& src = p.sharded != nullptr ? p.sharded->local() : std::get<Array>(p.entry->value);
  src.wait_ready();
  if (src.device().kind != DeviceKind::kCPU)
    p.host = src.to(Device::cpu()).contiguous();
  else
    p.host = copy ? src.clone().contiguous() : src.contiguous();
  p.block_box = p.sharded != nullptr ? p.sharded->sharding().index(p.meta.layout.shape, rank) : whole(p.meta.layout.shape);
  p.entry = nullptr;
  p.sharded = nullptr;
}

// Writes this rank's chunk files (no collective call: it may run on the background thread).
void write_files(detail::PendingSave& s) {
  try {
    for (const auto& p : s.plans) {
      for (const auto& cell : p.mine) {
        const EncodedChunk enc = encode_chunk(p.meta.layout, cell, p.host.data(), p.block_box);
        const std::string rel = p.meta.key + "/" + chunk_key(cell);
        const std::string path = s.tmp + "/" + rel;
        make_dirs(path.substr(0, path.rfind('/')));
        write_new_file(path, enc.pieces, s.options.sync);
        s.records.push_back({rel, enc.size, enc.crc32c});
        s.bytes += enc.size;
        if (s.kill_at_write) std::raise(SIGKILL);
        if (s.fail_at_write) throw BackendError("filesystem", 0, "injected failure at 'write' (SHARDKIT_CHECKPOINT_TEST_FAIL)");
      }
    }
  } catch (const std::exception& e) {
    s.write_failure = failure_text(e);
  }
}

std::string meta_text(const std::vector<Plan>& plans, const SaveOptions& o) {
  std::string s = "step=" + (o.step ? std::to_string(*o.step) : std::string("auto")) +
                  " keep_last=" + std::to_string(o.keep_last) + " blocking=" + std::to_string(o.blocking) +
                  " metadata=" + o.metadata_json + " tree=" + o.tree_json + "\n";
  for (const auto& p : plans) s += array_json(p.meta);
  return s;
}

// Rank 0's part after every rank has written: the arrays' and groups' metadata, then the step's (with the manifest),
// the rename; then keep_last's removals.
void commit(const std::vector<Plan>& plans, const SaveOptions& o, const std::string& root, const std::string& tmp,
            std::int64_t step, int world, std::vector<FileRecord> records, int rank) {
  auto write_meta = [&](const std::string& rel, const std::string& text) {
    write_text_file(tmp + "/" + rel, text, o.sync);
    records.push_back({rel, text.size(), crc32c(text.data(), text.size())});
  };
  StepMeta sm{step, world, o.metadata_json, o.tree_json, {}, {}};
  std::set<std::string> groups;
  for (const auto& p : plans) {
    sm.keys.push_back(p.meta.key);
    make_dirs(tmp + "/" + p.meta.key);
    write_meta(p.meta.key + "/" + kZarrJson, array_json(p.meta));
    for (auto slash = p.meta.key.find('/'); slash != std::string::npos; slash = p.meta.key.find('/', slash + 1))
      groups.insert(p.meta.key.substr(0, slash));
  }
  for (const auto& g : groups) write_meta(g + "/" + kZarrJson, group_json());
  if (o.sync)
    for (const auto& d : dirs_under(tmp)) sync_dir(d);
  kill_point("manifest", rank);
  sm.files = std::move(records);
  write_text_file(tmp + "/" + kZarrJson, step_json(sm), o.sync);
  if (o.sync) sync_dir(tmp);
  kill_point("rename", rank);
  rename_path(tmp, step_path(root, step));
  if (o.sync) sync_dir(root);
  if (o.keep_last > 0) {
    std::vector<std::int64_t> all = steps(root);
    while (static_cast<int>(all.size()) > o.keep_last) {
      const std::string doomed = root + "/" + kTmpPrefix + "delete-" + std::to_string(all.front());
      rename_path(step_path(root, all.front()), doomed);
      if (o.sync) sync_dir(root);
      kill_point("cleanup", rank);
      remove_tree(doomed);
      all.erase(all.begin());
    }
  }
}

// The collective end of a save: every rank's writes agreed on, rank 0's commit, its outcome agreed on.
void finish(detail::PendingSave& s) {
  if (s.writer.joinable()) s.writer.join();
  Communicator& comm = *s.comm;
  const int rank = comm.rank();
  std::vector<std::string> recs;
  try {
    recs = agree(comm, s.write_failure, records_text(s.records));
  } catch (...) {
    if (rank == 0) {
      try {
        remove_tree(s.tmp);
      } catch (...) {
      }
    }
    throw;
  }
  std::string failure;
  if (rank == 0) {
    try {
      std::vector<FileRecord> all;
      for (const auto& t : recs)
        for (auto& r : parse_records_text(t)) all.push_back(std::move(r));
      commit(s.plans, s.options, s.root, s.tmp, s.step, comm.size(), std::move(all), rank);
    } catch (const std::exception& e) {
      failure = failure_text(e);
    }
  }
  agree(comm, failure);
}

}  // namespace

std::int64_t SaveHandle::step() const {
  SHARDKIT_CHECK(state_ != nullptr, "SaveHandle: no save");
  return state_->step;
}

const std::string& SaveHandle::path() const {
  SHARDKIT_CHECK(state_ != nullptr, "SaveHandle: no save");
  return state_->path;
}

std::uint64_t SaveHandle::bytes_written() const {
  SHARDKIT_CHECK(state_ != nullptr, "SaveHandle: no save");
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->finished ? state_->bytes : 0;
}

bool SaveHandle::done() const {
  if (state_ == nullptr) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->finished;
}

void SaveHandle::wait() {
  if (state_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->finished) {
      if (state_->error) std::rethrow_exception(state_->error);
      return;
    }
  }
  std::exception_ptr error;
  try {
    finish(*state_);
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->finished = true;
    state_->error = error;
    state_->plans.clear();  // the staged copies
  }
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mu);
    if (g_in_flight == state_) g_in_flight.reset();
  }
  if (error) std::rethrow_exception(error);
}

void wait_for_saves() {
  std::shared_ptr<detail::PendingSave> s;
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mu);
    s = g_in_flight;
  }
  if (s) SaveHandle(s).wait();
}

SaveHandle save(const std::string& root, const std::vector<Entry>& entries, const SaveOptions& options) {
  // At most one save in flight: the one before commits (or raises) first.
  wait_for_saves();
  auto state = std::make_shared<detail::PendingSave>();
  state->comm = saving_comm(entries, options);
  state->options = options;
  state->options.comm = state->comm;
  state->root = root;
  Communicator& comm = *state->comm;
  const int rank = comm.rank();

  // 1. Plan locally, then check every rank planned the same (keys, shapes, dtypes, shardings, options).
  std::string failure;
  try {
    check_json(options.metadata_json, "metadata_json");
    check_json(options.tree_json, "tree_json");
    SHARDKIT_CHECK(options.chunk_bytes > 0, "save: chunk_bytes must be positive, got ", options.chunk_bytes);
    SHARDKIT_CHECK(options.keep_last >= 0, "save: keep_last must be >= 0, got ", options.keep_last);
    state->plans = plan(entries, comm, options.chunk_bytes);
  } catch (const std::exception& e) {
    failure = failure_text(e);
  }
  const std::vector<std::string> texts = agree(comm, failure, meta_text(state->plans, options));
  for (std::size_t r = 1; r < texts.size(); ++r)
    if (texts[r] != texts[0])
      throw MismatchError("save: rank " + std::to_string(r) +
                          " passed other keys, shapes, dtypes, shardings or options than rank 0 (every rank must save "
                          "the same tree)");

  // 2. Rank 0 picks the step, clears what earlier saves left, and makes the temporary directory.
  std::string prepared;
  failure.clear();
  if (rank == 0) {
    try {
      make_dirs(root);
      const std::vector<std::int64_t> done = steps(root);
      const std::int64_t step = options.step ? *options.step : (done.empty() ? 0 : done.back() + 1);
      if (step < 0) throw InvalidArgument("save: step must be >= 0, got " + std::to_string(step));
      if (exists(step_path(root, step)))
        throw InvalidArgument("save: step " + std::to_string(step) + " already exists in '" + root + "'");
      for (const auto& name : list_dir(root))
        if (name.rfind(kTmpPrefix, 0) == 0) remove_tree(root + "/" + name);
      std::random_device rd;
      const std::uint64_t nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
      const std::string tmp = root + "/" + kTmpPrefix + "step_" + std::to_string(step) + "-" + std::to_string(nonce);
      make_dirs(tmp);
      prepared = std::to_string(step) + "\n" + tmp;
    } catch (const std::exception& e) {
      failure = failure_text(e);
    }
  }
  const std::string chosen = agree(comm, failure, prepared)[0];
  state->step = std::stoll(chosen.substr(0, chosen.find('\n')));
  state->tmp = chosen.substr(chosen.find('\n') + 1);
  state->path = step_path(root, state->step);

  // 3. Stage this rank's blocks and write its files: here, or on a background thread.
  state->kill_at_write = hook_set("SHARDKIT_CHECKPOINT_TEST_KILL", "write", rank);
  state->fail_at_write = hook_set("SHARDKIT_CHECKPOINT_TEST_FAIL", "write", rank);
  try {
    for (auto& p : state->plans) stage(p, rank, !options.blocking);
  } catch (const std::exception& e) {
    state->write_failure = failure_text(e);
  }
  SaveHandle handle(state);
  if (options.blocking || !state->write_failure.empty()) {
    if (state->write_failure.empty()) write_files(*state);
    handle.wait();
    return handle;
  }
  detail::PendingSave* raw = state.get();
  state->writer = std::thread([raw] { write_files(*raw); });
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mu);
    g_in_flight = state;
  }
  return handle;
}

}  // namespace shardkit::checkpoint
