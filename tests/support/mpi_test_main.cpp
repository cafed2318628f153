// GoogleTest main for MPI tests: every rank runs every test; rank 0 prints the usual report, other ranks print only
// their failures (prefixed with the rank); at the end the results are combined so every rank exits with the same
// code, and rank 0 names the ranks that failed.

#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "shardkit/launch/runtime.hpp"

namespace {

// Prints failures of a non-zero rank, which has no default printer.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test name is remembered here: UnitTest::current_test_info() would deadlock inside OnTestPartResult.
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILURE in %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_ = "(outside a test)";
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int code = 0;
  {
    shardkit::Runtime runtime(&argc, &argv);
    const int rank = runtime.rank();
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(rank));
    }

    const int local = RUN_ALL_TESTS();

    // Combine: every rank learns which ranks failed, and all exit alike.
    MPI_Comm world = shardkit::to_mpi<MPI_Comm>(runtime.world());
    std::unique_ptr<int[]> all(new int[runtime.size()]);
    MPI_Allgather(&local, 1, MPI_INT, all.get(), 1, MPI_INT, world);
    std::string failed;
    for (int r = 0; r < runtime.size(); ++r)
      if (all[r] != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    if (!failed.empty()) {
      code = 1;
      if (rank == 0) std::fprintf(stderr, "shardkit test main: tests failed on rank(s) %s\n", failed.c_str());
    } else if (rank == 0) {
      std::printf("shardkit test main: all %d rank(s) passed\n", runtime.size());
    }
  }
  return code;
}
