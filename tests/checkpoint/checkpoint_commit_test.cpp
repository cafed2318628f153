// Checkpoints at 1-4 ranks, their commit and the background writer: which steps count as committed and what is left
// over, the writer's priority, a background save committing from its own copy and failing on every rank alike; and
// the chunk layout of replicated and awkward blocks. Saving and loading across meshes: checkpoint_test.cpp.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "checkpoint_test_util.hpp"

namespace shardkit::testing {
namespace {

namespace ck = shardkit::checkpoint;

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
