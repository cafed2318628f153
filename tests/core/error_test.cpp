#include "shardkit/core/error.hpp"

#include <gtest/gtest.h>

namespace shardkit {
namespace {

TEST(Errors, CheckMacrosPrintBothOperands) {
  const int a = 3, b = 5;
  try {
    SHARDKIT_CHECK_EQ(a, b, "sizes must match for ", "op");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sizes must match for op"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3 == 5)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("a == b"), std::string::npos) << msg;
    EXPECT_NE(msg.find("error_test.cpp"), std::string::npos) << msg;
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_NO_THROW(SHARDKIT_CHECK_LT(a, b, "ordered"));
  EXPECT_THROW(SHARDKIT_CHECK_GT(a, b), InvalidArgument);
  EXPECT_THROW(SHARDKIT_CHECK(a == b), InvalidArgument);
}

TEST(Errors, HierarchyAndCodes) {
  EXPECT_THROW(SHARDKIT_ASSERT(1 == 2, "broken"), Error);
  try {
    SHARDKIT_ASSERT(false, "broken invariant");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
  const BackendError be("MPI", 17, "MPI error 17");
  EXPECT_EQ(be.backend(), "MPI");
  EXPECT_EQ(be.native_code(), 17);
  EXPECT_EQ(be.code(), ErrorCode::kBackend);
  EXPECT_STREQ(error_code_name(MismatchError("x").code()), "MismatchError");
  EXPECT_STREQ(error_code_name(TimeoutError("x").code()), "TimeoutError");
}

TEST(Errors, CudaCheckReportsTheCall) {
  // A non-zero code through the CUDA check: the message names the call, whether or not CUDA is built.
  try {
    SHARDKIT_CUDA_CHECK(2);
    FAIL() << "no throw";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.backend(), "CUDA");
    EXPECT_EQ(e.native_code(), 2);
    EXPECT_NE(std::string(e.what()).find("CUDA error 2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(SHARDKIT_CUDA_CHECK(0));
}

}  // namespace
}  // namespace shardkit
