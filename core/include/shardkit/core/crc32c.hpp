#pragma once
// CRC-32C (Castagnoli), the checksum of Zarr v3's `crc32c` codec, iSCSI and ext4: the hardware instruction where the
// CPU has it (SSE 4.2), a table otherwise; both give the same value.

#include <cstddef>
#include <cstdint>

namespace shardkit {

/// CRC-32C of `size` bytes at `data`, continuing from `crc` (the CRC of the bytes before; 0 to start).
/// crc32c(b, crc32c(a)) == crc32c(a followed by b).
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept;

/// CRC-32C of a followed by b, from crc_a = crc32c(a), crc_b = crc32c(b) and b's length, without reading either
/// (zlib's crc32_combine for the Castagnoli polynomial): O(log size_b).
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t size_b) noexcept;

}  // namespace shardkit
