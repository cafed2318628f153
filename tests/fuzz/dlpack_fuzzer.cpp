// libFuzzer target: DLPack import (from_dlpack) of versioned and legacy tensors built from fuzzed bytes, and the
// export/re-import round trip of what is accepted. Needs no MPI: core does not communicate.
//
// Checked for every input (a violation aborts, which libFuzzer reports as a crash and saves):
// - from_dlpack returns an Array or throws shardkit::InvalidArgument; any other exception escapes and is reported.
// - It accepts exactly the tensors the documented rules accept (an independent model below, valid()).
// - Rejected: the deleter has not run (the caller still owns the tensor).
// - Accepted: the Array describes the tensor (shape, strides, dtype, device, data + byte_offset, read-only flag);
//   the deleter has not run while an Array shares the storage, and has run exactly once after the last one died.
// - Exporting an accepted Array (versioned and legacy) and importing it again gives the same description.
// - Reading: the library only records the data pointer on import. The fuzzer itself copies the elements (a strided
//   copy through the library) only when the tensor points into its own buffer and every addressed byte lies inside
//   it; tensors pointing elsewhere (null, or an address nobody may read) are never read.
//
// Input layout (little-endian, fields past the end read as zero; make_seeds.py writes seeds in it):
//   u8 mode        bit 0 legacy, bit 1 null shape, bit 2 null strides, bits 3-4 data (0, 3: buffer; 1: null;
//                  2: an unreadable address), bit 5 null deleter
//   u32 major, u32 minor, u64 flags     (versioned only, read always)
//   i8 ndim, u8 code, u8 bits, u16 lanes, i32 device_type, i32 device_id, u64 byte_offset
//   then per dimension: a value for the shape and one for the strides, each `u8 v` (v < 0x80: v itself; else an i64
//   follows)

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fuzz_input.hpp"
#include "shardkit/core/dlpack.hpp"
#include "shardkit/core/error.hpp"

namespace {

using shardkit::Array;
using shardkit::DType;
using shardkit::InvalidArgument;
using shardkit::Shape;
using shardkit::Strides;
using shardkit::fuzz::FuzzInput;

constexpr std::size_t kBufferBytes = 4096;
alignas(256) unsigned char g_buffer[kBufferBytes];
// Recorded, compared and exported, never dereferenced.
void* const kUnreadable = reinterpret_cast<void*>(std::uintptr_t{1} << 40);

std::int64_t small_or_i64(FuzzInput& in) {
  const std::uint8_t v = in.u8();
  return v < 0x80 ? v : in.i64();
}

struct Counter {
  int deletes = 0;
};

// What the rules of from_dlpack's documentation say about a tensor, computed independently of the library.
struct Expectation {
  bool valid = false;
  DType dtype = DType::kFloat32;
  std::size_t itemsize = 0;
  std::int64_t numel = 0;
  Strides strides;
  unsigned __int128 span_bytes = 0;  // byte_offset + bytes from the first to past the last element (0 if empty)
};

bool dtype_of(DLDataType t, DType& out) {
  if (t.lanes != 1) return false;
  struct Known {
    std::uint8_t code, bits;
    DType dtype;
  };
  static constexpr Known kKnown[] = {
      {kDLBool, 8, DType::kBool},      {kDLInt, 8, DType::kInt8},           {kDLInt, 16, DType::kInt16},
      {kDLInt, 32, DType::kInt32},     {kDLInt, 64, DType::kInt64},         {kDLUInt, 8, DType::kUInt8},
      {kDLUInt, 16, DType::kUInt16},   {kDLUInt, 32, DType::kUInt32},       {kDLUInt, 64, DType::kUInt64},
      {kDLFloat, 16, DType::kFloat16}, {kDLBfloat, 16, DType::kBFloat16},   {kDLFloat, 32, DType::kFloat32},
      {kDLFloat, 64, DType::kFloat64}, {kDLComplex, 64, DType::kComplex64}, {kDLComplex, 128, DType::kComplex128},
  };
  for (const Known& k : kKnown)
    if (k.code == t.code && k.bits == t.bits) {
      out = k.dtype;
      return true;
    }
  return false;
}

Expectation expect(const DLTensor& t, bool versioned, std::uint32_t major) {
  Expectation e;
  if (versioned && major != DLPACK_MAJOR_VERSION) return e;
  if (t.ndim < 0 || t.ndim > 64) return e;
  if (t.ndim > 0 && t.shape == nullptr) return e;
  if (!dtype_of(t.dtype, e.dtype)) return e;
  e.itemsize = shardkit::dtype_size(e.dtype);
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      if (t.device.device_id < 0) return e;  // not a device
      break;
    default:
      return e;
  }
  constexpr auto kMax = static_cast<unsigned __int128>(INT64_MAX);
  // Element count: dimensions non-negative; zero if any is zero; otherwise the product must fit in 64 bits.
  bool zero = false;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return e;
    zero = zero || t.shape[i] == 0;
  }
  unsigned __int128 numel = 1;
  if (zero) {
    numel = 0;
  } else {
    for (int i = 0; i < t.ndim; ++i) {
      numel *= static_cast<unsigned __int128>(t.shape[i]);
      if (numel > kMax) return e;
    }
  }
  e.numel = static_cast<std::int64_t>(numel);
  // Strides: given (none negative), or row-major, saturating at INT64_MAX (only an empty shape gets there).
  e.strides.assign(static_cast<std::size_t>(t.ndim), 0);
  if (t.strides) {
    for (int i = 0; i < t.ndim; ++i) {
      if (t.strides[i] < 0) return e;
      e.strides[i] = t.strides[i];
    }
  } else {
    unsigned __int128 s = 1;
    for (int i = t.ndim; i-- > 0;) {
      e.strides[i] = static_cast<std::int64_t>(std::min(s, kMax));
      s = std::min(s, kMax + 1) * static_cast<unsigned __int128>(std::max<std::int64_t>(t.shape[i], 1));
    }
  }
  // Every addressed byte, offset included, must be addressable with 64-bit signed byte counts.
  if (t.byte_offset > INT64_MAX) return e;
  if (t.byte_offset % e.itemsize != 0) return e;
  if (e.numel > 0) {
    unsigned __int128 extent = 0;  // in elements, of the farthest element
    for (int i = 0; i < t.ndim; ++i) {
      const auto term = static_cast<unsigned __int128>(t.shape[i] - 1) * static_cast<unsigned __int128>(e.strides[i]);
      if (term > kMax) return e;
      extent += term;
      if (extent > kMax) return e;
    }
    const unsigned __int128 bytes = (extent + 1) * e.itemsize + t.byte_offset;
    if (bytes > kMax) return e;
    e.span_bytes = bytes;
    if (t.data == nullptr) return e;
  }
  e.valid = true;
  return e;
}

// The library's strided copy against a direct read of the buffer, for tensors known to lie inside it.
void check_elements(const Array& a, const Expectation& e, std::uint64_t byte_offset) {
  const Array c = a.clone();
  FUZZ_CHECK(c.is_contiguous());
  const auto* dst = static_cast<const unsigned char*>(c.data());
  std::vector<std::int64_t> idx(a.shape().size(), 0);
  for (std::int64_t n = 0; n < a.numel(); ++n) {
    std::uint64_t off = byte_offset;
    for (std::size_t k = 0; k < idx.size(); ++k) off += static_cast<std::uint64_t>(idx[k] * e.strides[k]) * e.itemsize;
    FUZZ_CHECK(off + e.itemsize <= kBufferBytes);
    FUZZ_CHECK(std::memcmp(dst + n * static_cast<std::int64_t>(e.itemsize), g_buffer + off, e.itemsize) == 0);
    for (std::size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < a.shape()[k]) break;
      idx[k] = 0;
    }
  }
  // Bytes of a bool tensor here are arbitrary, not valid bools: only print the other dtypes.
  if (a.dtype() != DType::kBool && a.numel() <= 64) (void)a.to_string();
}

void check_same(const Array& a, const Array& b) {
  FUZZ_CHECK(a.shape() == b.shape());
  FUZZ_CHECK(a.strides() == b.strides());
  FUZZ_CHECK(a.dtype() == b.dtype());
  FUZZ_CHECK(a.device() == b.device());
  FUZZ_CHECK(a.data() == b.data());
}

// Views, export and re-import of an accepted array; none of them reads the elements.
void exercise(const Array& a, bool read_only) {
  (void)a.describe();
  (void)a.is_contiguous();
  if (a.ndim() > 0 && a.shape()[0] > 0) {
    const Array s = a.select(0, a.shape()[0] - 1);
    FUZZ_CHECK(s.ndim() == a.ndim() - 1);
    const Array h = a.slice(0, a.shape()[0] / 2, a.shape()[0]);
    FUZZ_CHECK(h.shape()[0] == a.shape()[0] - a.shape()[0] / 2);
  }
  std::vector<int> reversed(static_cast<std::size_t>(a.ndim()));
  for (int i = 0; i < a.ndim(); ++i) reversed[i] = a.ndim() - 1 - i;
  const Array p = a.permute(reversed);
  FUZZ_CHECK(p.numel() == a.numel());

  DLManagedTensorVersioned* v = shardkit::to_dlpack_versioned(a);
  FUZZ_CHECK(((v->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0) == read_only);
  {
    const Array back = shardkit::from_dlpack(v);  // owns v from here
    check_same(a, back);
    FUZZ_CHECK(back.read_only() == read_only);
  }
  DLManagedTensor* l = shardkit::to_dlpack_legacy(p);
  {
    const Array back = shardkit::from_dlpack(l);
    check_same(p, back);
  }
}

template <typename Managed>
void run(Managed* m, const Expectation& e, const Counter& counter, bool counted) {
  const DLTensor& t = m->dl_tensor;
  bool accepted = false;
  try {
    Array a = shardkit::from_dlpack(m);
    accepted = true;
    FUZZ_CHECK(e.valid);
    FUZZ_CHECK(a.shape() == Shape(t.shape, t.shape + t.ndim));
    FUZZ_CHECK(a.strides() == e.strides);
    FUZZ_CHECK(a.dtype() == e.dtype);
    FUZZ_CHECK(a.numel() == e.numel);
    FUZZ_CHECK(a.data() == (t.data ? static_cast<char*>(t.data) + t.byte_offset : nullptr));
    bool read_only = false;
    if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>)
      read_only = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    FUZZ_CHECK(a.read_only() == read_only);
    const bool in_buffer = t.data == g_buffer && t.device.device_type == kDLCPU;
    if (in_buffer && e.span_bytes <= kBufferBytes && a.numel() <= 4096) check_elements(a, e, t.byte_offset);
    exercise(a, read_only);
    FUZZ_CHECK(counter.deletes == 0);
  } catch (const InvalidArgument&) {
    FUZZ_CHECK(!accepted);  // nothing after the import may throw
    FUZZ_CHECK(!e.valid);
    FUZZ_CHECK(counter.deletes == 0);  // the caller still owns the tensor
    return;
  }
  if (counted) FUZZ_CHECK(counter.deletes == 1);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (std::size_t i = 0; i < kBufferBytes; ++i) g_buffer[i] = static_cast<unsigned char>(i * 131 + 7);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const std::uint8_t mode = in.u8();
  const bool legacy = mode & 1;
  const bool null_shape = mode & 2;
  const bool null_strides = mode & 4;
  const int data_choice = (mode >> 3) & 3;
  const bool null_deleter = mode & 0x20;
  const std::uint32_t major = in.u32();
  const std::uint32_t minor = in.u32();
  const std::uint64_t flags = in.u64();

  DLTensor t{};
  t.ndim = in.i8();
  t.dtype.code = in.u8();
  t.dtype.bits = in.u8();
  t.dtype.lanes = in.u16();
  t.device.device_type = static_cast<DLDeviceType>(in.i32());
  t.device.device_id = in.i32();
  t.byte_offset = in.u64();
  // Arrays as long as ndim says (when ndim is valid): the library may read that many entries, never more.
  const std::size_t n = t.ndim > 0 ? static_cast<std::size_t>(t.ndim) : 0;
  std::vector<std::int64_t> shape(n), strides(n);
  for (std::size_t i = 0; i < n; ++i) {
    shape[i] = small_or_i64(in);
    strides[i] = small_or_i64(in);
  }
  t.shape = null_shape ? nullptr : shape.data();
  t.strides = null_strides ? nullptr : strides.data();
  t.data = data_choice == 1 ? nullptr : data_choice == 2 ? kUnreadable : static_cast<void*>(g_buffer);

  Counter counter;
  const Expectation e = expect(t, !legacy, major);
  if (legacy) {
    DLManagedTensor m{};
    m.dl_tensor = t;
    m.manager_ctx = &counter;
    m.deleter =
        null_deleter ? nullptr : [](DLManagedTensor* self) { ++static_cast<Counter*>(self->manager_ctx)->deletes; };
    run(&m, e, counter, !null_deleter);
  } else {
    DLManagedTensorVersioned m{};
    m.version = {major, minor};
    m.flags = flags;
    m.dl_tensor = t;
    m.manager_ctx = &counter;
    m.deleter = null_deleter ? nullptr : [](DLManagedTensorVersioned* self) {
      ++static_cast<Counter*>(self->manager_ctx)->deletes;
    };
    run(&m, e, counter, !null_deleter);
  }
  return 0;
}
