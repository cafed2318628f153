#pragma once

#include <ostream>
#include <string>

namespace shardkit {

/// Where memory lives. CPU is pageable host memory; CUDA is device memory of one GPU; CUDAHost is pinned host
/// memory (host-accessible, used for staging); CUDAManaged is unified memory (host- and device-accessible).
/// The last two exist so DLPack tensors of those kinds are imported as what they are.
enum class DeviceKind { kCPU, kCUDA, kCUDAHost, kCUDAManaged };

/// A memory location: a kind and, for CUDA kinds, a device index.
struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  /// Host memory.
  static constexpr Device cpu() noexcept { return {DeviceKind::kCPU, 0}; }
  /// Device memory of GPU `index`.
  static constexpr Device cuda(int index = 0) noexcept { return {DeviceKind::kCUDA, index}; }
  /// Pinned host memory.
  static constexpr Device cuda_host() noexcept { return {DeviceKind::kCUDAHost, 0}; }
  /// Unified (managed) memory, associated with GPU `index`.
  static constexpr Device cuda_managed(int index = 0) noexcept { return {DeviceKind::kCUDAManaged, index}; }

  /// True when the host can read and write the memory directly (CPU, pinned, managed).
  constexpr bool is_host_accessible() const noexcept { return kind != DeviceKind::kCUDA; }
  /// True when the memory belongs to the CUDA runtime (device, pinned or managed).
  constexpr bool is_cuda() const noexcept { return kind != DeviceKind::kCPU; }
  /// True for GPU device memory, which collectives route to NCCL.
  constexpr bool is_device_memory() const noexcept { return kind == DeviceKind::kCUDA || kind == DeviceKind::kCUDAManaged; }

  friend constexpr bool operator==(const Device& a, const Device& b) noexcept {
    // The index only distinguishes memory that belongs to one GPU.
    if (a.kind != b.kind) return false;
    return a.kind == DeviceKind::kCPU || a.kind == DeviceKind::kCUDAHost || a.index == b.index;
  }

  /// "cpu", "cuda:0", "cuda_host", "cuda_managed:1".
  std::string to_string() const;
};

std::ostream& operator<<(std::ostream& os, const Device& device);

}  // namespace shardkit
