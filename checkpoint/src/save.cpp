// save(): plan every array's chunks and writers (the same on every rank), stage this rank's blocks, write its chunk
// files into the step's temporary directory (on the caller's thread, or on a background thread that makes no
// collective call), then at wait() agree that every rank did, and rank 0 writes the metadata (the manifest last) and
// renames the directory into place.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "agree.hpp"
#include "chunk_file.hpp"
#include "files.hpp"
#include "janitor.hpp"
#include "metadata.hpp"
#include "plan.hpp"
#include "shardkit/checkpoint/checkpoint.hpp"
#include "shardkit/core/crc32c.hpp"
#include "shardkit/core/error.hpp"
#include "steps.hpp"

namespace shardkit::checkpoint {

using namespace detail;

namespace {

// Test hooks: SHARDKIT_CHECKPOINT_TEST_KILL=<stage>:<rank> kills that rank with SIGKILL at that stage of a save, and
// SHARDKIT_CHECKPOINT_TEST_FAIL=<stage>:<rank> makes it raise there ("stage": as it stages a block it writes from;
// "write": after each chunk file it writes; "manifest": rank 0 once every rank has written, before the step's
// zarr.json (which holds the manifest); "rename": rank 0 after it, before the step's rename; "cleanup": rank 0
// between keep_last's renames).
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
    throw BackendError("filesystem", 0,
                       std::string("injected failure at '") + stage + "' (SHARDKIT_CHECKPOINT_TEST_FAIL)");
}

// Where a step keeps the per-rank state (SaveOptions::rank_state_json); '%' starts no escape the Python package
// makes of a tree's key.
constexpr const char* kRankStateBytes = "%rank_state/bytes";
constexpr const char* kRankStateLengths = "%rank_state/lengths";

}  // namespace

namespace detail {

// A save from its start to its commit; shared by its SaveHandles and the in-flight slot.
struct PendingSave {
  std::shared_ptr<Communicator> comm;
  SaveOptions options;
  std::string root;
  std::string tmp;
  std::string path;
  std::int64_t step = 0;
  std::vector<Plan> plans;
  std::vector<Entry> rank_state;  // the entries made of options.rank_state_json (plans point into them: never resized)
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
  // Held by the one wait() that finishes the save (another thread's wait() waits for it, then sees its outcome).
  std::mutex finishing;

  // A program that ends with a save in flight (wait_for_saves() never called): the writer is joined, nothing is
  // committed, and the next save removes the temporary directory.
  ~PendingSave() {
    if (writer.joinable()) writer.join();
  }
};

}  // namespace detail

namespace {

std::mutex g_in_flight_mu;
std::shared_ptr<detail::PendingSave> g_in_flight;

std::shared_ptr<Communicator> saving_comm(const std::vector<Entry>& entries, const SaveOptions& options) {
  if (options.comm) return options.comm;
  for (const auto& e : entries)
    if (const auto* s = std::get_if<ShardedArray>(&e.value)) {
      SHARDKIT_CHECK(!s->mesh().is_abstract(), "save: array '", e.key, "' is on an abstract mesh");
      return s->mesh().comm();
    }
  return Communicator::world();
}

// The host copy of this rank's block that its chunk files come from: the caller's array itself when the save
// writes before returning and the block is on the host and contiguous, a copy otherwise (the caller may overwrite
// its arrays once a background save has returned).
void stage(Plan& p, int rank, bool copy) {
  if (p.mine.empty()) return;
  kill_point("stage", rank);
  const Array& src = p.sharded != nullptr ? p.sharded->local() : std::get<Array>(p.entry->value);
  src.wait_ready();
  if (src.device().kind != DeviceKind::kCPU)
    p.host = src.to(Device::cpu()).contiguous();
  else
    p.host = copy ? src.clone().contiguous() : src.contiguous();
  p.block_box =
      p.sharded != nullptr ? p.sharded->sharding().index(p.meta.layout.shape, rank) : whole(p.meta.layout.shape);
  p.entry = nullptr;
  p.sharded = nullptr;
}

// Writes this rank's chunk files (no collective call: it may run on the background thread).
void write_files(detail::PendingSave& s) {
  try {
    // Rank 0 made the directory: a rank that does not see it writes to another file system than rank 0's.
    if (!s.plans.empty() && !exists(s.tmp))
      throw BackendError("filesystem", ENOENT,
                         "save: the step's temporary directory '" + s.tmp +
                             "', made by rank 0, is not visible here: "
                             "the checkpoint's root must be on a file system every rank shares");
    for (const auto& p : s.plans) {
      for (const auto& cell : p.mine) {
        const std::string rel = p.meta.key + "/" + chunk_key(cell);
        const std::string path = s.tmp + "/" + rel;
        make_dirs(path.substr(0, path.rfind('/')));
        const WrittenChunk w = write_chunk_file(path, p.meta.layout, cell, p.host.data(), p.block_box, s.options.sync);
        s.records.push_back({rel, w.size, w.crc32c});
        s.bytes += w.size;
        if (s.kill_at_write) std::raise(SIGKILL);
        if (s.fail_at_write)  // names the thread's priority, which the tests of writer_nice check
          throw BackendError("filesystem", 0,
                             "injected failure at 'write' (SHARDKIT_CHECKPOINT_TEST_FAIL; the writing thread's nice "
                             "value: " +
                                 std::to_string(::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()))) + ")");
      }
    }
  } catch (const std::exception& e) {
    s.write_failure = failure_text(e);
  }
}

// The per-rank state's two arrays, over a line of the saving communicator (collective: the longest text is the
// rows' width), planned like the caller's arrays.
void add_rank_state(detail::PendingSave& s, const std::string& json) {
  Communicator& comm = *s.comm;
  Result widest =
      comm.allreduce(Array::from_values<std::int64_t>({static_cast<std::int64_t>(json.size())}), ReduceOp::kMax);
  widest.token.wait();
  const std::int64_t width = widest.value.to_vector<std::int64_t>()[0];
  const std::int64_t n = comm.size();
  Array row = Array::zeros({1, width}, DType::kUInt8);
  if (!json.empty()) std::memcpy(row.data(), json.data(), json.size());
  const NamedSharding by_rank(Mesh::line("ranks", s.comm), P("ranks"));
  s.rank_state.reserve(2);
  s.rank_state.push_back({std::string(kRankStateBytes), from_local(row, {n, width}, by_rank)});
  s.rank_state.push_back(
      {std::string(kRankStateLengths),
       from_local(Array::from_values<std::int64_t>({static_cast<std::int64_t>(json.size())}), {n}, by_rank)});
  for (auto& p : plan(s.rank_state, comm, s.options.chunk_bytes)) s.plans.push_back(std::move(p));
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
    // The newest keep_last steps stay, and the one just committed (a step numbered below the newest) too. The step
    // is committed by now: a cleanup that fails (a busy file on NFS) is a warning, never the save's error.
    try {
      std::vector<std::int64_t> all = steps(root);
      std::erase(all, step);
      int keep = o.keep_last - 1;
      std::random_device rd;
      while (static_cast<int>(all.size()) > std::max(keep, 0)) {
        // Renamed out of the steps' names here (readers stop seeing it), removed in the background.
        const std::string doomed =
            root + "/" + kTmpPrefix + "delete-" + std::to_string(all.front()) + "-" + std::to_string(rd());
        rename_path(step_path(root, all.front()), doomed);
        if (o.sync) sync_dir(root);
        kill_point("cleanup", rank);
        remove_later(doomed);
        all.erase(all.begin());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "shardkit: checkpoint: step %lld is committed, but removing older steps (keep_last=%d) "
                   "failed: %s\n",
                   static_cast<long long>(step), o.keep_last, e.what());
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
        remove_later(s.tmp);
      } catch (...) {  // the next save finds it
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
  std::lock_guard<std::mutex> one_finisher(state_->finishing);
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

namespace {

void finish_in_flight() {
  std::shared_ptr<detail::PendingSave> s;
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mu);
    s = g_in_flight;
  }
  if (s) SaveHandle(s).wait();
}

}  // namespace

void wait_for_saves() {
  finish_in_flight();
  drain_removals();
}

SaveHandle save(const std::string& root, const std::vector<Entry>& entries, const SaveOptions& options) {
  // At most one save in flight: the one before commits (or raises) first (the removals it queued go on).
  finish_in_flight();
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
    if (!options.caller_failure.empty()) throw InvalidArgument(options.caller_failure);
    check_json(options.metadata_json, "metadata_json");
    check_json(options.tree_json, "tree_json");
    if (options.rank_state_json) {
      // A binding that could not encode its value passes the reason after a NUL.
      if (!options.rank_state_json->empty() && options.rank_state_json->front() == '\0')
        throw InvalidArgument("save: rank_state must be JSON (dicts, lists, strings, numbers): " +
                              options.rank_state_json->substr(1));
      check_json(*options.rank_state_json, "rank_state");
    }
    SHARDKIT_CHECK(options.chunk_bytes > 0, "save: chunk_bytes must be positive, got ", options.chunk_bytes);
    SHARDKIT_CHECK(options.keep_last >= 0, "save: keep_last must be >= 0, got ", options.keep_last);
    SHARDKIT_CHECK(options.writer_nice >= 0 && options.writer_nice <= 19, "save: writer_nice must be 0 to 19, got ",
                   options.writer_nice);
    state->plans = plan(entries, comm, options.chunk_bytes);
  } catch (const std::exception& e) {
    failure = failure_text(e);
  }
  const std::vector<std::string> texts = agree(comm, failure, plan_digest(state->plans, options));
  for (std::size_t r = 1; r < texts.size(); ++r)
    if (texts[r] != texts[0])
      throw MismatchError("save: rank " + std::to_string(r) +
                          " passed other keys, shapes, dtypes, shardings or options than rank 0 (every rank must save "
                          "the same tree)");
  if (options.rank_state_json) add_rank_state(*state, *options.rank_state_json);

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
      // Removals run in the background; a backlog of more than one (removing slower than saving) is waited for, so
      // that keep_last still bounds what the root holds.
      if (removals_pending() > 1) drain_removals();
      for (const auto& name : list_dir(root))
        if (name.rfind(kTmpPrefix, 0) == 0) remove_later(root + "/" + name);
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
  if (options.blocking) {
    if (state->write_failure.empty()) write_files(*state);
    handle.wait();
    return handle;
  }
  // In flight even when this rank's staging failed: the failure is agreed on at wait(), where every rank is (here
  // the other ranks have returned, and their next collective would meet this rank's agreement instead).
  if (state->write_failure.empty()) {
    detail::PendingSave* raw = state.get();
    state->writer = std::thread([raw, nice = options.writer_nice] {
      lower_this_thread_priority(nice);  // below the caller's (SaveOptions::writer_nice)
      write_files(*raw);
    });
  }
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mu);
    g_in_flight = state;
  }
  return handle;
}

}  // namespace shardkit::checkpoint
