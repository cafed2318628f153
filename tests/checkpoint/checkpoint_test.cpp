// Checkpoints at 1-4 ranks: saved by jobs of 1..n ranks (the first ranks of the world) on meshes of one and two axes,
// loaded by jobs of 1..n ranks with other specs, every block bit-equal to what distribute() gives; replicas splitting
// the writing; damaged files found and named; a rank reading only what its block meets; the errors a user can act on.
// The commit and the background writer: checkpoint_commit_test.cpp.

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

}  // namespace
}  // namespace shardkit::testing
