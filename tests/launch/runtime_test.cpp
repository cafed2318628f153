#include <mpi.h>

#include <cstdlib>

#include "mpi_test.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit {
namespace {

TEST(Runtime, RanksMatchMpi) {
  const Runtime& rt = testing::runtime();
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(rt.rank(), rank);
  EXPECT_EQ(rt.size(), size);
  EXPECT_TRUE(rt.owns_mpi());  // the test main created the Runtime before anything touched MPI
  EXPECT_GE(rt.thread_level(), ThreadLevel::kSerialized);
  EXPECT_EQ(&Runtime::instance(), Runtime::current());
}

TEST(Runtime, WorldIsADuplicateNotTheWorld) {
  const Runtime& rt = testing::runtime();
  MPI_Comm world = to_mpi<MPI_Comm>(rt.world());
  EXPECT_NE(world, MPI_COMM_WORLD);
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(world, MPI_COMM_WORLD, &result);
  EXPECT_EQ(result, MPI_CONGRUENT);
  // Errors on our communicators come back as codes, not aborts.
  MPI_Errhandler handler;
  MPI_Comm_get_errhandler(world, &handler);
  EXPECT_EQ(handler, MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&handler);
}

// The Runtime hands the collectives layer the job's facts (JobInfo) while it lives: the same world duplicate, device,
// job id (the same on every rank) and clock offset it reports itself.
TEST(Runtime, PublishesTheJobsFactsToTheCollectivesLayer) {
  const Runtime& rt = testing::runtime();
  const JobInfo* job = JobInfo::current();
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job, &rt.job());
  const JobInfo& as_job = rt;  // a Runtime passes for its JobInfo: Communicator::world(rt)
  EXPECT_EQ(&as_job, job);
  EXPECT_EQ(job->world, rt.world());
  EXPECT_EQ(job->device, rt.device());
  EXPECT_EQ(job->id, rt.job_id());
  EXPECT_NE(job->id, 0u);
  EXPECT_EQ(job->clock.offset_us, rt.clock_offset().offset_us);
  std::uint64_t root_id = job->id;
  MPI_Bcast(&root_id, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  EXPECT_EQ(root_id, job->id);
}

TEST(Runtime, LocalRanksAndHost) {
  const Runtime& rt = testing::runtime();
  EXPECT_GE(rt.local_rank(), 0);
  EXPECT_LT(rt.local_rank(), rt.local_size());
  EXPECT_LE(rt.local_size(), rt.size());
  EXPECT_FALSE(rt.host().empty());
  // Local ranks are unique among the ranks of one host.
  const int key = rt.local_rank();
  std::vector<int> keys(rt.size());
  MPI_Allgather(&key, 1, MPI_INT, keys.data(), 1, MPI_INT, to_mpi<MPI_Comm>(rt.world()));
  std::vector<char> name(256, 0);
  std::copy(rt.host().begin(), rt.host().begin() + std::min<std::size_t>(rt.host().size(), 255), name.begin());
  std::vector<char> names(256 * rt.size());
  MPI_Allgather(name.data(), 256, MPI_CHAR, names.data(), 256, MPI_CHAR, to_mpi<MPI_Comm>(rt.world()));
  for (int a = 0; a < rt.size(); ++a)
    for (int b = a + 1; b < rt.size(); ++b)
      if (std::string(&names[256 * a]) == std::string(&names[256 * b])) {
        EXPECT_NE(keys[a], keys[b]);
      }
}

TEST(Runtime, GpuCountAndBinding) {
  const Runtime& rt = testing::runtime();
  EXPECT_EQ(rt.gpu_count(), cuda::device_count());
  if (std::getenv("SHARDKIT_TEST_EXPECT_NO_GPU")) {
    EXPECT_EQ(rt.gpu_count(), 0) << "CUDA_VISIBLE_DEVICES is empty";
  }
  if (rt.gpu_count() == 0) {
    EXPECT_EQ(rt.device(), Device::cpu());
    EXPECT_FALSE(rt.binding().shared);
  } else {
    EXPECT_EQ(rt.device(), Device::cuda(rt.local_rank() % rt.gpu_count()));
    EXPECT_EQ(cuda::current_device(), rt.device().index);
    EXPECT_EQ(rt.binding().shared, rt.local_size() > rt.gpu_count());
    EXPECT_EQ(rt.warnings().empty(), !rt.binding().shared);
  }
}

TEST(Runtime, DescribeNamesRankDeviceAndLibraries) {
  const Runtime& rt = testing::runtime();
  const std::string d = rt.describe();
  EXPECT_NE(d.find("rank " + std::to_string(rt.rank()) + "/" + std::to_string(rt.size())), std::string::npos) << d;
  EXPECT_NE(d.find("host=" + rt.host()), std::string::npos) << d;
  EXPECT_NE(d.find("device=" + rt.device().to_string()), std::string::npos) << d;
  EXPECT_NE(d.find("MPI: " + mpi_vendor()), std::string::npos) << d;
  EXPECT_NE(d.find("backend="), std::string::npos) << d;
}

TEST(Runtime, SecondRuntimeIsRefused) {
  EXPECT_THROW(Runtime second, Error);
  EXPECT_NE(Runtime::current(), nullptr);  // the failed attempt left the live one in place
}

TEST(MpiComm, DupAndSplitOwnTheirCommunicators) {
  const Runtime& rt = testing::runtime();
  MpiComm dup = MpiComm::dup(rt.world());
  EXPECT_EQ(dup.size(), rt.size());
  EXPECT_EQ(dup.rank(), rt.rank());
  MpiComm halves = MpiComm::split(rt.world(), rt.rank() % 2, rt.rank());
  EXPECT_EQ(halves.size(), (rt.size() + 1 - rt.rank() % 2) / 2);
  EXPECT_EQ(halves.rank(), rt.rank() / 2);
  MpiComm none = MpiComm::split(rt.world(), rt.rank() == 0 ? 0 : -1, 0);
  EXPECT_EQ(none.is_null(), rt.rank() != 0);
  MpiComm moved = std::move(dup);
  EXPECT_TRUE(dup.is_null());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(moved.size(), rt.size());
}

TEST(MpiComm, ErrorsBecomeBackendErrors) {
  const Runtime& rt = testing::runtime();
  try {
    // Sending to a rank that does not exist is an error MPI reports (MPI_ERRORS_RETURN on our communicator).
    int x = 0;
    SHARDKIT_MPI_CHECK(MPI_Send(&x, 1, MPI_INT, rt.size() + 5, 0, to_mpi<MPI_Comm>(rt.world())));
    FAIL() << "no error";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.backend(), "MPI");
    EXPECT_NE(std::string(e.what()).find("MPI_Send"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardkit
