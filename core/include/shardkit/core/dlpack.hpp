#pragma once

// DLPack exchange (https://dmlc.github.io/dlpack/latest/). The structs are declared, not defined, here: users who
// pass them in include their own dlpack/dlpack.h, and the ABI is the spec's.

#include <cstdint>

#include "shardkit/core/array.hpp"
#include "shardkit/core/cuda.hpp"

struct DLManagedTensorVersioned;
struct DLManagedTensor;

namespace shardkit {

/// The DLPack version this build speaks (the header's DLPACK_MAJOR_VERSION / DLPACK_MINOR_VERSION).
struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};
DLPackVersion dlpack_version() noexcept;

/// Imports a versioned (DLPack 1.x) tensor without copying.
///
/// On success the returned Array owns `tensor`: its deleter runs exactly once, when the last Array sharing the
/// storage is destroyed. The read-only flag becomes Array::read_only(). On failure nothing is taken: the caller
/// still owns `tensor` and must call its deleter.
/// @throws InvalidArgument for a null tensor, an unsupported major version, null data with a non-zero size, an
///         unknown dtype or device, a negative shape, negative or overflowing strides, or a byte offset that is
///         not a multiple of the element size.
Array from_dlpack(DLManagedTensorVersioned* tensor);
/// Imports a legacy (pre-1.0) tensor; same ownership and checks as the versioned form (no flags exist).
Array from_dlpack(DLManagedTensor* tensor);

/// Exports `array` as a versioned tensor sharing its storage. The caller (consumer) must call the returned tensor's
/// deleter exactly once.
/// @param read_only  additionally mark the export read-only (it is always marked when the array is read-only).
/// @param consumer_stream  the CUDA stream the consumer will read on (the DLPack `stream` argument), or nullptr.
///        Given for CUDA memory, that stream waits for the array's pending work on the device and the host does not
///        block; otherwise the host waits for the array's ready event first.
DLManagedTensorVersioned* to_dlpack_versioned(const Array& array, bool read_only = false,
                                              StreamHandle consumer_stream = nullptr);
/// Exports `array` as a legacy tensor (for consumers that do not accept DLPack 1.x); `consumer_stream` as above.
DLManagedTensor* to_dlpack_legacy(const Array& array, StreamHandle consumer_stream = nullptr);

}  // namespace shardkit
