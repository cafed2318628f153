// Deliberately fails on the last rank only. ctest runs it through expect_failure.cmake, which passes when the run
// exits non-zero and rank 0 reports the last rank as failed: one rank's failure must fail the whole job.

#include "mpi_test.hpp"

namespace {

TEST(FailurePropagation, LastRankFails) {
  const auto& rt = shardkit::testing::runtime();
  EXPECT_NE(rt.rank(), rt.size() - 1) << "deliberate failure on the last rank";
}

}  // namespace
