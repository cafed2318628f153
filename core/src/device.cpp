#include "shardkit/core/device.hpp"

namespace shardkit {

std::string Device::to_string() const {
  switch (kind) {
    case DeviceKind::kCPU: return "cpu";
    case DeviceKind::kCUDA: return "cuda:" + std::to_string(index);
    case DeviceKind::kCUDAHost: return "cuda_host";
    case DeviceKind::kCUDAManaged: break;
  }
  return "cuda_managed:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.to_string(); }

}  // namespace shardkit
