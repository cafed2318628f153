#pragma once

// Skipping a GPU test for want of a GPU. With SHARDKIT_REQUIRE_GPU=1 (CI's simulated-GPU run, scripts/gpu_check.sh)
// the skip is a failure instead, so a GPU suite can never pass by running nothing.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace shardkit::testing {

/// True when SHARDKIT_REQUIRE_GPU is set to anything but "" or "0".
inline bool gpu_required() {
  const char* v = std::getenv("SHARDKIT_REQUIRE_GPU");
  return v && *v && std::string(v) != "0";
}

}  // namespace shardkit::testing

/// Skips the current test because no GPU is available (`reason` is streamed), or fails it under SHARDKIT_REQUIRE_GPU=1.
#define SHARDKIT_GPU_SKIP(reason)                                                             \
  do {                                                                                        \
    if (::shardkit::testing::gpu_required()) GTEST_FAIL() << "SHARDKIT_REQUIRE_GPU=1: " << reason; \
    GTEST_SKIP() << reason;                                                                   \
  } while (0)
