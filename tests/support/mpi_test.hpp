#pragma once

// Helpers for tests that run under mpirun with the shared MPI gtest main (mpi_test_main.cpp).

#include <gtest/gtest.h>

#include "gpu_required.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::testing {

/// The Runtime the test main created.
inline Runtime& runtime() { return Runtime::instance(); }

}  // namespace shardkit::testing

/// Skips the current test (cleanly, on every rank alike) when no GPU is visible; fails it under SHARDKIT_REQUIRE_GPU=1.
#define SHARDKIT_SKIP_WITHOUT_GPU()                                                          \
  do {                                                                                       \
    if (::shardkit::cuda::device_count() == 0)                                               \
      SHARDKIT_GPU_SKIP("no GPU: " << ::shardkit::cuda::unavailable_reason());               \
  } while (0)
