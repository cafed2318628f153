// Checkpoints at 1-4 ranks: saved by jobs of 1..n ranks (the first ranks of the world) on meshes of one and two axes,
// loaded by jobs of 1..n ranks with other specs, every block bit-equal to what distribute() gives; replicas splitting
// the writing; damaged files found and named; the errors a user can act on; which steps count as committed.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "checkpoint_test_util.hpp"

namespace shardkit::testing {
namespace {

namespace ck = shardkit::checkpoint;

struct ArrayCase {
  std::string key;
  Shape shape;
  DType dtype;
  bool plain = false;
};

std::vector<ArrayCase> cases() {
  std::vector<ArrayCase> c = {{"a/even", {8, 6}, DType::kFloat32},  {"a/uneven", {7, 5}, DType::kInt16},
                              {"b/empty", {0, 3}, DType::kFloat64}, {"b/nocols", {3, 0}, DType::kInt8},
                              {"vec", {5}, DType::kBFloat16},       {"scalar", {}, DType::kComplex128, true},
                              {"zero_d", {}, DType::kInt64},        {"plain2d", {5, 4}, DType::kUInt32, true}};
  for (int t = 0; t < 15; ++t) {
    const auto dt = static_cast<DType>(t);
    c.push_back({"dtypes/" + std::string(dtype_name(dt)), {6, 3}, dt});
  }
  return c;
}

// Specs of an array of `ndim` dimensions over a mesh's axes (one and two axes), replicated and partly replicated.
std::vector<PartitionSpec> specs_for(int ndim, const Mesh& m) {
  if (ndim == 0) return {P()};
  const bool two = m.ndim() == 2;
  if (ndim == 1) return two ? std::vector<PartitionSpec>{P(Axes{"x", "y"}), P("y"), P()} : std::vector{P("x"), P()};
  if (two) return {P("x", "y"), P(Axes{"x", "y"}), P("y"), P(kNone, Axes{"y", "x"}), P()};
  return {P("x"), P(kNone, "x"), P()};
}

std::vector<Mesh> meshes_of(const std::shared_ptr<Communicator>& c) {
  std::vector<Mesh> m;
  const auto k = static_cast<std::int64_t>(c->size());
  m.emplace_back(std::vector<std::int64_t>{k}, std::vector<std::string>{"x"}, c);
  if (k == 4) m.emplace_back(std::vector<std::int64_t>{2, 2}, std::vector<std::string>{"x", "y"}, c);
  if (k == 2) m.emplace_back(std::vector<std::int64_t>{1, 2}, std::vector<std::string>{"x", "y"}, c);
  return m;
}

TEST(Checkpoint, SavedOnAnyRanksLoadsOnAnyRanksBitForBit) {
  auto world = Communicator::world();
  const int n = world->size();
  const SharedTmpDir root;
  std::vector<std::shared_ptr<Communicator>> jobs(static_cast<std::size_t>(n) + 1);
  for (int k = 1; k <= n; ++k) jobs[static_cast<std::size_t>(k)] = first_ranks(k);
  const auto all = cases();
  std::int64_t step = 0;
  int loads = 0;
  for (int k = 1; k <= n; ++k) {
    // Every rank knows the saving meshes' count (for the loop); only job k's ranks build and save them.
    const int mesh_count = k == 4 || k == 2 ? 2 : 1;
    for (int mi = 0; mi < mesh_count; ++mi) {
      for (int rot = 0; rot < 2; ++rot, ++step) {
        std::string saved_on;
        if (const auto& job = jobs[static_cast<std::size_t>(k)]) {
          const Mesh mesh = meshes_of(job)[static_cast<std::size_t>(mi)];
          saved_on = mesh.to_string();
          std::vector<ck::Entry> entries;
          for (std::size_t j = 0; j < all.size(); ++j) {
            const auto& c = all[j];
            if (c.plain) {
              entries.push_back({c.key, test_global(c.shape, c.dtype)});
              continue;
            }
            const auto specs = specs_for(static_cast<int>(c.shape.size()), mesh);
            const NamedSharding s(mesh, specs[(j + static_cast<std::size_t>(rot)) % specs.size()], true);
            entries.push_back({c.key, from_local(test_block(c.shape, c.dtype, s, mesh.rank()), c.shape, s)});
          }
          // The second rotation cuts inner chunks small: loads then read parts of files and copy across rows.
          const ck::SaveHandle h =
              ck::save(root, entries, {.step = step, .chunk_bytes = rot == 0 ? (4 << 20) : 40, .sync = false});
          EXPECT_EQ(h.step(), step);
        }
        world->barrier().wait();
        for (int m = 1; m <= n; ++m) {
          const auto& job = jobs[static_cast<std::size_t>(m)];
          if (!job) continue;
          for (const Mesh& mesh : meshes_of(job)) {
            for (int rot2 = 0; rot2 < 2; ++rot2) {
              std::vector<ck::Target> targets;
              for (std::size_t j = 0; j < all.size(); ++j) {
                const auto specs = specs_for(static_cast<int>(all[j].shape.size()), mesh);
                targets.push_back({all[j].key, specs[(j + 1 + static_cast<std::size_t>(rot2)) % specs.size()],
                                   all[j].shape, all[j].dtype});
              }
              const auto loaded = ck::load(root, mesh, targets, {.step = step, .uneven = true});
              ASSERT_EQ(loaded.size(), targets.size());
              for (std::size_t j = 0; j < all.size(); ++j) {
                const NamedSharding want(mesh, targets[j].spec, true);
                EXPECT_EQ(loaded[j].sharding(), want) << all[j].key;
                EXPECT_TRUE(same_bits(loaded[j].local(), test_block(all[j].shape, all[j].dtype, want, mesh.rank())))
                    << all[j].key << " saved at step " << step << " by " << k << " ranks, loaded on "
                    << mesh.to_string() << " with " << targets[j].spec.to_string();
              }
              ++loads;
            }
          }
        }
        world->barrier().wait();
      }
    }
  }
  EXPECT_GT(loads, 0);
  // The blocks equal distribute()'s, literally: one array through the collective path as well.
  const Mesh line = Mesh::line("x", world);
  const NamedSharding s(line, P("x"), true);
  const Array global = test_global({7, 5}, DType::kInt16);
  const ShardedArray d = distribute(global, s);
  const auto l = ck::load(root, line, {{"a/uneven", P("x")}}, {.step = 0, .uneven = true});
  EXPECT_TRUE(same_bits(l[0].local(), d.local()));
}

// Gathers every rank's bytes_written.
std::vector<std::int64_t> written_by(const ck::SaveHandle& h, Communicator& comm) {
  Result r = comm.allgather(Array::from_values<std::int64_t>({static_cast<std::int64_t>(h.bytes_written())}));
  r.token.wait();
  return r.value.to_vector<std::int64_t>();
}

TEST(Checkpoint, ReplicasSplitTheWritingAndPlainScalarsHaveOneWriter) {
  auto world = Communicator::world();
  const int n = world->size();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{8, 3};
  // Fully replicated: the chunk grid is cut along the first dimension so that every copy writes a part.
  const NamedSharding rep(line, P());
  auto h = ck::save(root, {{"rep", from_local(test_global(shape, DType::kFloat32), shape, rep)}}, {.sync = false});
  for (auto b : written_by(h, *world)) EXPECT_GT(b, 0) << "a replica wrote nothing";
  const auto info = ck::inspect(root, h.step());
  ASSERT_EQ(info.arrays.size(), 1u);
  EXPECT_EQ(info.arrays[0].chunk_shape, (Shape{(8 + n - 1) / n, 3}));
  // A plain scalar: one file, one writer.
  h = ck::save(root, {{"s", Array::from_values<double>({2.5}, Shape{})}}, {.sync = false});
  int writers = 0;
  for (auto b : written_by(h, *world)) writers += b > 0;
  EXPECT_EQ(writers, 1);
  if (n == 4) {
    // P('x') on (2, 2): two blocks of two copies each; each block's copies write half of it.
    const Mesh m({2, 2}, {"x", "y"}, world);
    const NamedSharding s(m, P("x"));
    h = ck::save(root, {{"half", from_local(test_block(shape, DType::kInt32, s, m.rank()), shape, s)}},
                 {.sync = false});
    for (auto b : written_by(h, *world)) EXPECT_GT(b, 0);
    EXPECT_EQ(ck::inspect(root, h.step()).arrays[0].chunk_shape, (Shape{4, 2}));
  }
  const auto loaded = ck::load(root, line, {{"rep", P("x")}}, {.step = 0, .uneven = true});
  EXPECT_TRUE(same_bits(loaded[0].local(),
                        test_block(shape, DType::kFloat32, NamedSharding(line, P("x"), true), world->rank())));
}

void flip_byte(const std::string& path, std::int64_t offset_from_end, bool from_end) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  struct stat st {};
  ::fstat(fd, &st);
  const off_t at = from_end ? st.st_size - offset_from_end : offset_from_end;
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, at), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
  ::close(fd);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, ADamagedFileIsFoundAndNamedAndOnlyItsReadersFail) {
  auto world = Communicator::world();
  const int n = world->size();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{16, 4};
  const NamedSharding s(line, P(), false);
  // Replicated over a 1-rank-per-part grid: chunk files of 16/n rows; inner chunks of one row (16 bytes).
  const auto h = ck::save(root, {{"arr", from_local(test_global(shape, DType::kInt32), shape, s)}},
                          {.chunk_bytes = 16, .sync = false});
  const std::string file = h.path() + "/arr/c/0/0";
  if (world->rank() == 0) flip_byte(file, 1, false);  // inside inner chunk (0, 0): row 0
  world->barrier().wait();
  // Everyone reading row 0 fails, naming file, array and chunk; the others read their rows without it.
  const NamedSharding rows(line, P("x"), true);
  const std::string err = error_of([&] { ck::load(root, line, {{"arr", P("x")}}, {.uneven = true}); });
  if (rows.index(shape, world->rank())[0].start == 0) {
    EXPECT_NE(err.find(file), std::string::npos) << err;
    EXPECT_NE(err.find("'arr'"), std::string::npos) << err;
    EXPECT_NE(err.find("chunk (0, 0), inner chunk (0, 0)"), std::string::npos) << err;
    EXPECT_NE(err.find("crc32c"), std::string::npos) << err;
  } else {
    EXPECT_EQ(err, "") << "rank " << world->rank() << " does not need row 0";
  }
  EXPECT_NE(error_of([&] { ck::inspect(root, h.step(), true); }).find(file), std::string::npos);
  world->barrier().wait();
  if (world->rank() == 0) {
    flip_byte(file, 1, false);  // undo
    flip_byte(file, 9, true);   // inside the index
  }
  world->barrier().wait();
  std::string e2 = error_of([&] { ck::load(root, line, {{"arr", P()}}); });
  EXPECT_NE(e2.find("index fails its crc32c"), std::string::npos) << e2;
  world->barrier().wait();
  if (world->rank() == 0) {
    flip_byte(file, 9, true);  // undo
    EXPECT_EQ(::truncate(file.c_str(), 10), 0);
  }
  world->barrier().wait();
  e2 = error_of([&] { ck::load(root, line, {{"arr", P()}}); });
  EXPECT_NE(e2.find("shorter"), std::string::npos) << e2;
  world->barrier().wait();
  if (world->rank() == 0) ::unlink(file.c_str());
  world->barrier().wait();
  e2 = error_of([&] { ck::load(root, line, {{"arr", P()}}); });
  EXPECT_NE(e2.find("missing"), std::string::npos) << e2;
  EXPECT_NE(e2.find(file), std::string::npos) << e2;
  (void)n;
}

// Bytes this process has read through read()/pread() so far (/proc/self/io's rchar: every thread, sockets too).
std::int64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  std::int64_t value = 0;
  while (io >> key >> value)
    if (key == "rchar:") return value;
  return -1;
}

TEST(Checkpoint, ARankReadsOnlyTheInnerChunksItsBlockMeets) {
  auto world = Communicator::world();
  const int n = world->size();
  const SharedTmpDir root;
  // One file of 64 rows of 1 KiB, one row per inner chunk, written by rank 0 alone (a job of one rank).
  const Shape shape{64, 256};
  const std::int64_t row = 256 * 4;
  std::string file;
  if (auto one = first_ranks(1)) {
    const NamedSharding whole(Mesh::line("x", one), P("x"));
    const auto h = ck::save(root, {{"arr", from_local(test_global(shape, DType::kInt32), shape, whole)}},
                            {.comm = one, .chunk_bytes = row, .sync = false});
    file = h.path() + "/arr/c/0/0";
    flip_byte(file, 63 * (row + 4) + 5, false);  // inside the last row's inner chunk (each stored with its crc32c)
  }
  world->barrier().wait();
  const Mesh line = Mesh::line("x", world);
  const NamedSharding rows(line, P("x"), true);
  const auto box = rows.index(shape, world->rank())[0];
  const std::int64_t before = bytes_read_so_far();
  const std::string err = error_of([&] { ck::load(root, line, {{"arr", P("x")}}, {.uneven = true}); });
  const std::int64_t read = bytes_read_so_far() - before;
  if (box.stop == 64) {
    EXPECT_NE(err.find("inner chunk (63, 0)"), std::string::npos) << err;
  } else {
    EXPECT_EQ(err, "") << "rank " << world->rank() << " reads rows " << box.start << "-" << box.stop
                       << " and never the damaged row 63";
    // Its rows, the index (64 entries of 16 bytes and a crc32c) and the metadata (JSON, a few KiB): nothing more.
    const std::int64_t rows_bytes = (box.stop - box.start) * (row + 4);
    EXPECT_GE(read, rows_bytes);
    EXPECT_LE(read, rows_bytes + 64 * 16 + 4 + 16384) << "rank " << world->rank() << " read more than its rows";
    EXPECT_LT(read, 64 * row) << "a whole-file read";
  }
  (void)n;
}

template <typename E>
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying: " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, ErrorsNameWhatIsWrong) {
  auto world = Communicator::world();
  const int n = world->size();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{8, 4};
  const NamedSharding s(line, P());
  const auto arr = from_local(test_global(shape, DType::kFloat32), shape, s);
  expect_error<InvalidArgument>([&] { ck::load(root, line, {{"w", P()}}); }, "no committed step");
  ck::save(root, {{"params/w", arr}}, {.step = 3, .metadata_json = R"({"lr":0.1})", .sync = false});
  expect_error<InvalidArgument>([&] { ck::load(root, line, {{"params/v", P()}}); }, "key 'params/v' is not in step 3");
  expect_error<InvalidArgument>(
      [&] {
        ck::load(root, line, {{"params/w", P()}}, {.step = 4});
      },
      "step 4 does not exist");
  expect_error<InvalidArgument>(
      [&] {
        ck::load(root, line, {{"params/w", P(), Shape{8, 5}}});
      },
      "saved with shape (8, 4); the caller expects (8, 5)");
  expect_error<InvalidArgument>(
      [&] {
        ck::load(root, line, {{"params/w", P(), std::nullopt, DType::kFloat64}});
      },
      "saved as float32; the caller expects float64");
  expect_error<InvalidArgument>([&] { ck::load(root, line, {{"params/w", P("y")}}); }, "cannot take P('y')");
  if (n == 3)  // 8 rows on 3 ranks, saved evenly: uneven cuts are an opt-in
    expect_error<InvalidArgument>([&] { ck::load(root, line, {{"params/w", P("x")}}); }, "cannot take P('x')");
  expect_error<InvalidArgument>(
      [&] {
        ck::save(root, {{"params/w", arr}}, {.step = 3, .sync = false});
      },
      "step 3 already exists");
  for (const std::string bad : {"", "a//b", "__x", "a/..", "a/...", "a/zarr.json"})
    expect_error<InvalidArgument>([&] { ck::save(root, {{bad, arr}}, {.sync = false}); }, "save: ");
  expect_error<InvalidArgument>([&] { ck::save(root, {{"a", arr}, {"a", arr}}, {.sync = false}); }, "appears twice");
  expect_error<InvalidArgument>(
      [&] {
        ck::save(root, {{"a", arr}, {"a/b", arr}}, {.sync = false});
      },
      "is an array and the group of 'a/b'");
  expect_error<InvalidArgument>(
      [&] {
        ck::save(root, {{"a", arr}}, {.metadata_json = "{oops", .sync = false});
      },
      "not one JSON value");
  if (n >= 2) {
    // Ranks disagreeing on the tree: every rank raises, and nothing is committed.
    const std::string key = world->rank() == 1 ? "other" : "a";
    expect_error<MismatchError>([&] { ck::save(root, {{key, arr}}, {.sync = false}); }, "rank 1");
  }
  EXPECT_EQ(ck::steps(root), (std::vector<std::int64_t>{3}));
  const auto info = ck::inspect(root, 3, true);
  EXPECT_TRUE(info.committed);
  EXPECT_TRUE(info.verified);
  EXPECT_EQ(info.metadata_json, R"({"lr":0.1})");
  EXPECT_EQ(info.saved_ranks, n);
  ASSERT_EQ(info.arrays.size(), 1u);
  EXPECT_EQ(info.arrays[0].key, "params/w");
  EXPECT_EQ(info.arrays[0].shape, shape);
  EXPECT_EQ(info.arrays[0].dtype, DType::kFloat32);
  EXPECT_EQ(info.arrays[0].mesh_shape, (std::vector<std::int64_t>{n}));
  EXPECT_EQ(info.arrays[0].spec, P());
  // Chunk files of c rows (the last padded), each one inner chunk with its crc32c, then a one-entry index and its crc.
  const std::uint64_t c = (8 + n - 1) / n, files = (8 + c - 1) / c;
  EXPECT_EQ(info.arrays[0].bytes, files * (c * 4 * 4 + 4 + 16 + 4));
}

TEST(Checkpoint, OnlyCommittedStepsCountAndLeftoversAreCleared) {
  auto world = Communicator::world();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{5, 2};
  const auto arr = from_local(test_global(shape, DType::kInt64), shape, NamedSharding(line, P()));
  EXPECT_EQ(ck::latest_step(root), std::nullopt);
  EXPECT_EQ(ck::save(root, {{"a", arr}}).step(), 0);  // synced
  EXPECT_EQ(ck::save(root, {{"a", arr}}, {.sync = false}).step(), 1);
  if (world->rank() == 0) {
    // What a job killed mid-save leaves: a temporary directory, and (by hand) a step without its manifest.
    ::mkdir((root.path() + "/.tmp-step_2-99").c_str(), 0755);
    std::ofstream(root.path() + "/.tmp-step_2-99/junk") << "partial";
    ::mkdir((root.path() + "/step_7").c_str(), 0755);
  }
  world->barrier().wait();
  EXPECT_EQ(ck::steps(root), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(ck::latest_step(root), 1);
  EXPECT_EQ(ck::save(root, {{"a", arr}}, {.keep_last = 2, .sync = false}).step(), 2);
  EXPECT_EQ(ck::steps(root), (std::vector<std::int64_t>{1, 2}));
  ck::wait_for_saves();  // the removals the save queued
  world->barrier().wait();
  if (world->rank() == 0) {
    for (const auto& name : {".tmp-step_2-99"}) EXPECT_FALSE(::access((root.path() + "/" + name).c_str(), F_OK) == 0);
  }
  const auto loaded = ck::load(root, line, {{"a", P()}});
  EXPECT_TRUE(same_bits(loaded[0].local(), test_global(shape, DType::kInt64)));
}

// The thread that writes a background save runs writer_nice below the caller (at most 19), a blocking save's writing
// at the caller's priority (the test hook's failure names the writing thread's nice value).
TEST(Checkpoint, TheBackgroundWriterRunsBelowTheCallersPriority) {
  auto world = Communicator::world();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{9, 4};
  const NamedSharding s(line, P("x"), true);
  const ShardedArray x = from_local(test_block(shape, DType::kFloat64, s, world->rank()), shape, s);
  const int caller = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  const int victim = world->size() > 1 ? 1 : 0;  // a rank that holds rows
  ::setenv("SHARDKIT_CHECKPOINT_TEST_FAIL", ("write:" + std::to_string(victim)).c_str(), 1);
  struct Case {
    bool blocking;
    std::optional<int> nice;
    int expected;
  };
  for (const Case& c : {Case{false, std::nullopt, 19}, Case{false, 3, std::min(19, caller + 3)}, Case{false, 0, caller},
                        Case{true, std::nullopt, caller}}) {
    ck::SaveOptions o{.sync = false, .blocking = c.blocking};
    if (c.nice) o.writer_nice = *c.nice;
    expect_error<BackendError>(
        [&] {
          ck::save(root, {{"w", x}}, o).wait();
        },
        "nice value: " + std::to_string(c.expected) + ")");
  }
  ::unsetenv("SHARDKIT_CHECKPOINT_TEST_FAIL");
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())), caller);  // the caller's own is untouched
  for (int nice : {-1, 20})
    expect_error<InvalidArgument>([&] { ck::save(root, {{"w", x}}, {.sync = false, .writer_nice = nice}); },
                                  "writer_nice must be 0 to 19, got " + std::to_string(nice));
  EXPECT_TRUE(ck::steps(root).empty());
}

TEST(Checkpoint, ABackgroundSaveCommitsAtWaitFromItsOwnCopy) {
  auto world = Communicator::world();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{9, 4};
  const NamedSharding s(line, P("x"), true);
  Array block = test_block(shape, DType::kFloat64, s, world->rank());
  const Array original = block.clone();
  ck::SaveHandle h = ck::save(root, {{"w", from_local(block, shape, s)}}, {.sync = false, .blocking = false});
  // Staged: the caller may overwrite its block at once; the step is not committed before wait().
  std::memset(block.data(), 0xAB, block.nbytes());
  EXPECT_EQ(ck::latest_step(root), std::nullopt);
  h.wait();
  EXPECT_TRUE(h.done());
  EXPECT_EQ(ck::latest_step(root), 0);
  EXPECT_TRUE(same_bits(ck::load(root, line, {{"w", P("x")}}, {.uneven = true})[0].local(), original));
  // A second background save is finished by the next save (at most one in flight), a third by wait_for_saves().
  ck::SaveHandle h1 = ck::save(root, {{"w", from_local(original, shape, s)}}, {.sync = false, .blocking = false});
  ck::SaveHandle h2 = ck::save(root, {{"w", from_local(original, shape, s)}}, {.sync = false, .blocking = false});
  EXPECT_TRUE(h1.done());
  EXPECT_EQ(ck::steps(root), (std::vector<std::int64_t>{0, 1}));
  ck::wait_for_saves();
  EXPECT_TRUE(h2.done());
  EXPECT_EQ(ck::steps(root), (std::vector<std::int64_t>{0, 1, 2}));
  h2.wait();  // done: returns at once
  // A rank's failure to write surfaces at wait(), on every rank alike, and nothing is committed.
  const int victim = world->size() > 1 ? 1 : 0;  // a rank that holds rows (at 4 ranks the last holds none)
  ::setenv("SHARDKIT_CHECKPOINT_TEST_FAIL", ("write:" + std::to_string(victim)).c_str(), 1);
  ck::SaveHandle bad = ck::save(root, {{"w", from_local(original, shape, s)}}, {.sync = false, .blocking = false});
  ::unsetenv("SHARDKIT_CHECKPOINT_TEST_FAIL");
  expect_error<BackendError>([&] { bad.wait(); }, "injected failure at 'write'");
  expect_error<BackendError>([&] { bad.wait(); }, "injected failure");  // and again at every later wait()
  EXPECT_EQ(ck::steps(root), (std::vector<std::int64_t>{0, 1, 2}));
  ck::wait_for_saves();  // the removal of the failed save's directory
  world->barrier().wait();
  if (world->rank() == 0) {
    for (const auto& name : std::filesystem::directory_iterator(root.path())) {
      EXPECT_NE(name.path().filename().string().rfind(".tmp-", 0), 0u) << name.path() << " was left behind";
    }
  }
}

// A rank whose staging fails in a background save: save() returns on every rank (none waits in an agreement the
// others are not in), every rank raises at wait() naming it, with the failure's own class and backend, and the
// communicator goes on working.
TEST(Checkpoint, ABackgroundSaveWhoseStagingFailsRaisesAtWaitOnEveryRank) {
  auto world = Communicator::world();
  const int n = world->size();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{2 * n, 3};
  const auto arr = from_local(test_block(shape, DType::kFloat32, NamedSharding(line, P("x")), world->rank()), shape,
                              NamedSharding(line, P("x")));
  const int victim = n - 1;
  ::setenv("SHARDKIT_CHECKPOINT_TEST_FAIL", ("stage:" + std::to_string(victim)).c_str(), 1);
  auto h = ck::save(root, {{"w", arr}}, {.sync = false, .blocking = false});
  ::unsetenv("SHARDKIT_CHECKPOINT_TEST_FAIL");
  world->barrier().wait();  // the next collective meets the others' barrier, not an agreement
  try {
    h.wait();
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.backend(), "filesystem") << e.what();
    EXPECT_NE(std::string(e.what()).find("injected failure at 'stage'"), std::string::npos) << e.what();
    if (world->rank() != victim) {
      EXPECT_NE(std::string(e.what()).find("on rank " + std::to_string(victim)), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(ck::steps(root).empty());
  // keep_last never removes the step just saved, even one numbered below the others.
  for (std::int64_t step : {5, 6, 7}) ck::save(root, {{"w", arr}}, {.step = step, .sync = false});
  ck::save(root, {{"w", arr}}, {.step = 3, .keep_last = 2, .sync = false});
  EXPECT_EQ(ck::steps(root), (std::vector<std::int64_t>{3, 7}));
}

// The copies of a block share its writing on a 2-d mesh too (blocks replicated along x, chunks cut along rows), and
// a dimension with no divisor near the inner-chunk target is read whole rather than element by element.
TEST(Checkpoint, ReplicasOnA2dMeshShareTheWritingAndPrimeLengthsKeepWholeInnerChunks) {
  auto world = Communicator::world();
  const int n = world->size();
  const SharedTmpDir root;
  if (n == 4) {
    const Mesh grid({2, 2}, {"x", "y"}, world);
    const Shape shape{4, 4};
    const NamedSharding cols(grid, P(kNone, "y"));
    const auto h = ck::save(root, {{"c", from_local(test_block(shape, DType::kInt32, cols, grid.rank()), shape, cols)}},
                            {.sync = false});
    for (auto b : written_by(h, *world)) EXPECT_GT(b, 0) << "a replica wrote nothing";
  }
  const Shape prime{1009};
  const NamedSharding whole(Mesh::line("x", world), P());
  const auto h = ck::save(root, {{"p", from_local(test_global(prime, DType::kFloat32), prime, whole)}},
                          {.chunk_bytes = 1024, .sync = false});
  for (const auto& a : ck::inspect(root, h.step()).arrays)
    if (a.key == "p") {
      // 1009 (one rank: a prime), 505 = 5 x 101, 337 (prime), 253 = 11 x 23 elements per chunk; target 256.
      const std::int64_t inner = a.inner_chunk_shape[0], chunk = a.chunk_shape[0];
      EXPECT_TRUE(inner == chunk || inner * 16 >= 256) << "inner chunks of " << inner << " of " << chunk;
      EXPECT_LT(a.bytes, 1009u * 4u * 5u / 4u) << "crc32c and index entries outweigh the data";
    }
  const auto back = ck::load(root, Mesh::line("x", world), {{"p", P("x")}}, {.uneven = true});
  EXPECT_TRUE(same_bits(
      back[0].local(),
      test_block(prime, DType::kFloat32, NamedSharding(Mesh::line("x", world), P("x"), true), world->rank())));
}

// A block whose rows have no divisor near the target (2 x 1031 rows of 2 KiB) keeps inner chunks of 2 rows, not one
// of the whole block (which a reader of a part would read whole); readers read runs of them, straight into their
// block where they land whole, through staging where they need a part of each row.
TEST(Checkpoint, AnAwkwardBlockKeepsSmallInnerChunksReadInRuns) {
  auto world = Communicator::world();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const std::int64_t n = world->size();
  const Shape shape{2 * 1031 * n, 512};
  const NamedSharding rows(line, P("x"));
  const auto h =
      ck::save(root, {{"a", from_local(test_block(shape, DType::kFloat32, rows, world->rank()), shape, rows)}},
               {.chunk_bytes = 256 << 10, .sync = false});  // a target of 128 rows
  const ck::ArrayInfo info = ck::inspect(root, h.step()).arrays.at(0);
  EXPECT_EQ(info.chunk_shape, (Shape{2 * 1031, 512}));
  EXPECT_EQ(info.inner_chunk_shape, (Shape{2, 512}));
  // Inner chunks larger than a reader's slice (1 MiB blocks, one inner chunk each): read and checked a slice at a time.
  const Shape big{256 * n, 1024};
  ck::save(root, {{"b", from_local(test_block(big, DType::kFloat32, rows, world->rank()), big, rows)}},
           {.step = 1, .sync = false});
  EXPECT_EQ(ck::inspect(root, 1).arrays.at(0).inner_chunk_shape, (Shape{256, 1024}));
  // Loaded whole on every rank (straight into the block) and transposed (through staging).
  for (const PartitionSpec& spec : {P(), P(kNone, "x")}) {
    const NamedSharding target(line, spec, true);
    const auto back = ck::load(root, line, {{"a", spec}}, {.step = 0, .uneven = true});
    EXPECT_TRUE(same_bits(back[0].local(), test_block(shape, DType::kFloat32, target, world->rank())))
        << spec.to_string();
    const auto back_big = ck::load(root, line, {{"b", spec}}, {.step = 1, .uneven = true});
    EXPECT_TRUE(same_bits(back_big[0].local(), test_block(big, DType::kFloat32, target, world->rank())))
        << spec.to_string();
  }
  // A flipped byte in the third slice of a large inner chunk, and in the last small one of a run.
  world->barrier().wait();
  if (world->rank() == 0) {
    flip_byte(root.path() + "/step_1/b/c/0/0", (600 << 10) + 3, false);
    flip_byte(root.path() + "/step_0/a/c/0/0", 4 + 16 * 1031 + 4 + 1, true);  // past the index and its crc32c
  }
  world->barrier().wait();
  for (const PartitionSpec& spec : {P(), P(kNone, "x")}) {
    std::string e = error_of([&] { ck::load(root, line, {{"b", spec}}, {.step = 1, .uneven = true}); });
    EXPECT_NE(e.find("step_1/b/c/0/0' of array 'b' (chunk (0, 0), inner chunk (0, 0)) is damaged: its data fails"),
              std::string::npos)
        << e;
    e = error_of([&] { ck::load(root, line, {{"a", spec}}, {.step = 0, .uneven = true}); });
    EXPECT_NE(e.find("inner chunk (1030, 0)) is damaged: its data fails"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace shardkit::testing
