#include <gtest/gtest.h>

#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit {
namespace {

TEST(DeviceBinding, NoGpusMeansCpu) {
  const DeviceBinding b = choose_device(1, 4, 0);
  EXPECT_EQ(b.device, Device::cpu());
  EXPECT_FALSE(b.shared);
  EXPECT_TRUE(b.warning.empty());
}

TEST(DeviceBinding, OneRankPerGpu) {
  for (int r = 0; r < 4; ++r) {
    const DeviceBinding b = choose_device(r, 4, 8);
    EXPECT_EQ(b.device, Device::cuda(r));
    EXPECT_FALSE(b.shared);
  }
}

TEST(DeviceBinding, SharedGpusWarn) {
  const DeviceBinding b = choose_device(3, 4, 2);
  EXPECT_EQ(b.device, Device::cuda(1));
  EXPECT_TRUE(b.shared);
  EXPECT_NE(b.warning.find("4 ranks on this node share 2 GPUs"), std::string::npos) << b.warning;
  EXPECT_TRUE(choose_device(0, 2, 1).shared);
}

TEST(DeviceBinding, RejectsImpossibleInput) {
  EXPECT_THROW(choose_device(4, 4, 1), InvalidArgument);
  EXPECT_THROW(choose_device(0, 1, -1), InvalidArgument);
}

}  // namespace
}  // namespace shardkit
