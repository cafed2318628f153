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
    // The message is for users: theirs and the values; the expression and source location go to where().
    EXPECT_EQ(std::string(e.what()), "sizes must match for op (3 == 5 is false)");
    EXPECT_EQ(e.where().rfind("a == b at tests/core/error_test.cpp:", 0), 0u) << e.where();
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
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("internal error in shardkit: broken invariant", 0), 0u) << msg;
    EXPECT_EQ(msg.find("error_test.cpp"), std::string::npos) << msg;
    EXPECT_NE(e.where().find("false at tests/core/error_test.cpp:"), std::string::npos) << e.where();
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
    EXPECT_EQ(std::string(e.what()).find("error_test.cpp"), std::string::npos) << e.what();
    EXPECT_NE(e.where().find("2 at tests/core/error_test.cpp:"), std::string::npos) << e.where();
  }
  EXPECT_NO_THROW(SHARDKIT_CUDA_CHECK(0));
}

TEST(Errors, CalledFunctionNamesTheNativeCall) {
  EXPECT_EQ(detail::called_function("MPI_Recv(buf, n, MPI_BYTE, 0, 0, comm, &st)"), " in MPI_Recv");
  EXPECT_EQ(detail::called_function("ns::f()"), " in ns::f");
  EXPECT_EQ(detail::called_function("2"), "");
  EXPECT_EQ(detail::called_function("(x)"), "");
  EXPECT_EQ(detail::called_function("a + f(x)"), "");
}

}  // namespace
}  // namespace shardkit
