#include "shardkit/core/dlpack.hpp"

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <vector>

#include "array_compare.hpp"

namespace shardkit {
namespace {

// A producer-side tensor with a deleter that counts its calls.
struct Producer {
  std::vector<float> data{0, 1, 2, 3, 4, 5};
  std::vector<std::int64_t> shape{2, 3};
  std::vector<std::int64_t> strides{3, 1};
  int deletes = 0;
  DLManagedTensorVersioned versioned{};
  DLManagedTensor legacy{};

  Producer() {
    DLTensor t{};
    t.data = data.data();
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape.data();
    t.strides = strides.data();
    versioned.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    versioned.dl_tensor = t;
    versioned.manager_ctx = this;
    versioned.deleter = [](DLManagedTensorVersioned* self) { ++static_cast<Producer*>(self->manager_ctx)->deletes; };
    legacy.dl_tensor = t;
    legacy.manager_ctx = this;
    legacy.deleter = [](DLManagedTensor* self) { ++static_cast<Producer*>(self->manager_ctx)->deletes; };
  }
};

TEST(DLPack, VersionedImportSharesMemoryAndDeletesOnce) {
  Producer p;
  {
    Array a = from_dlpack(&p.versioned);
    EXPECT_EQ(a.data(), p.data.data());
    EXPECT_EQ(a.shape(), (Shape{2, 3}));
    EXPECT_EQ(a.dtype(), DType::kFloat32);
    EXPECT_FALSE(a.read_only());
    Array view = a.slice(1, 1, 2);
    Array copy = a;
    a = Array();
    EXPECT_EQ(p.deletes, 0);
    EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{1, 4}));
  }
  EXPECT_EQ(p.deletes, 1);
}

TEST(DLPack, LegacyImportDeletesOnce) {
  Producer p;
  p.legacy.dl_tensor.strides = nullptr;  // legacy producers may omit strides for compact tensors
  {
    Array a = from_dlpack(&p.legacy);
    EXPECT_TRUE(a.is_contiguous());
    EXPECT_EQ(a.to_vector<float>()[5], 5.0f);
  }
  EXPECT_EQ(p.deletes, 1);
}

TEST(DLPack, ReadOnlyFlagIsHonoured) {
  Producer p;
  p.versioned.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  Array a = from_dlpack(&p.versioned);
  EXPECT_TRUE(a.read_only());
  EXPECT_THROW(a.fill_zero(), InvalidArgument);
  EXPECT_EQ(p.data[1], 1.0f);
  DLManagedTensorVersioned* out = to_dlpack_versioned(a);
  EXPECT_TRUE(out->flags & DLPACK_FLAG_BITMASK_READ_ONLY);  // re-export keeps the promise
  out->deleter(out);
}

TEST(DLPack, ByteOffsetIsApplied) {
  Producer p;
  p.versioned.dl_tensor.byte_offset = 3 * sizeof(float);
  p.shape = {3};
  p.strides = {1};
  p.versioned.dl_tensor.ndim = 1;
  Array a = from_dlpack(&p.versioned);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{3, 4, 5}));
}

// Each malformed tensor raises InvalidArgument and leaves ownership with the caller: no deleter call.
TEST(DLPack, MalformedInputIsRejected) {
  auto expect_rejected = [](auto mutate, const char* what) {
    Producer p;
    mutate(p);
    EXPECT_THROW(from_dlpack(&p.versioned), InvalidArgument) << what;
    EXPECT_EQ(p.deletes, 0) << what;
  };
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.data = nullptr; }, "null data, non-zero size");
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.dtype = {kDLFloat8_e4m3fn, 8, 1}; }, "float8 dtype");
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.dtype = {kDLFloat, 32, 4}; }, "vector lanes");
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.device = {kDLVulkan, 0}; }, "unknown device");
  expect_rejected([](Producer& p) { p.shape[0] = -2; }, "negative shape");
  expect_rejected([](Producer& p) { p.strides[0] = -3; }, "negative stride");
  expect_rejected([](Producer& p) { p.strides[0] = INT64_MAX / 2; }, "overflowing stride");
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.byte_offset = 2; }, "misaligned byte offset");
  expect_rejected([](Producer& p) { p.versioned.version.major = DLPACK_MAJOR_VERSION + 1; }, "future major version");
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.ndim = -1; }, "negative ndim");
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.shape = nullptr; }, "null shape");
  EXPECT_THROW(from_dlpack(static_cast<DLManagedTensorVersioned*>(nullptr)), InvalidArgument);
  EXPECT_THROW(from_dlpack(static_cast<DLManagedTensor*>(nullptr)), InvalidArgument);

  Producer p;
  p.legacy.dl_tensor.data = nullptr;
  EXPECT_THROW(from_dlpack(&p.legacy), InvalidArgument);
  EXPECT_EQ(p.deletes, 0);
}

// Found by tests/fuzz/dlpack_fuzzer: empty tensors skipped the stride and offset checks (a negative stride was then
// refused after ownership had passed, so the deleter ran although from_dlpack reported failure: a double delete for
// the caller); an extent of INT64_MAX overflowed; a negative CUDA ordinal was accepted.
TEST(DLPack, EdgeCasesAreRejectedWithoutDeleting) {
  auto expect_rejected = [](auto mutate, const char* what) {
    Producer p;
    mutate(p);
    EXPECT_THROW(from_dlpack(&p.versioned), InvalidArgument) << what;
    EXPECT_EQ(p.deletes, 0) << what;
  };
  expect_rejected(
      [](Producer& p) {
        p.shape = {0, 3};
        p.strides = {-3, 1};
      },
      "empty, negative stride");
  expect_rejected(
      [](Producer& p) {
        p.shape = {0, 3};
        p.versioned.dl_tensor.byte_offset = 1ULL << 63;
      },
      "empty, byte offset past 64-bit addressing");
  expect_rejected(
      [](Producer& p) {
        p.shape = {2, 1};
        p.strides = {INT64_MAX, 1};
      },
      "extent of INT64_MAX elements");
  expect_rejected([](Producer& p) { p.versioned.dl_tensor.device = {kDLCUDA, -1}; }, "negative CUDA device id");
}

// Whether a shape is empty does not depend on where its zero is, and printing an empty array does not walk its
// dimensions (both found by the fuzzer).
TEST(DLPack, EmptyShapeWithHugeDimensionsIsEmpty) {
  Producer p;
  p.shape = {1LL << 62, 4, 0};
  p.strides = {4, 1, 1};
  p.versioned.dl_tensor.ndim = 3;
  p.versioned.dl_tensor.shape = p.shape.data();
  p.versioned.dl_tensor.strides = p.strides.data();
  {
    Array a = from_dlpack(&p.versioned);
    EXPECT_EQ(a.numel(), 0);
    EXPECT_EQ(a.to_string(), "[]");  // printed at once, not row by empty row
  }
  EXPECT_EQ(p.deletes, 1);
  // Without strides: the row-major ones of such a shape pass 64 bits (they saturate; nothing is addressed).
  p.shape = {0, 1LL << 40, 1LL << 40};
  p.versioned.dl_tensor.strides = nullptr;
  {
    Array a = from_dlpack(&p.versioned);
    EXPECT_EQ(a.strides(), (Strides{INT64_MAX, 1LL << 40, 1}));
    EXPECT_EQ(a.clone().numel(), 0);
  }
  EXPECT_EQ(p.deletes, 2);
}

TEST(DLPack, EmptyTensorMayHaveNullData) {
  Producer p;
  p.shape = {0, 3};
  p.versioned.dl_tensor.data = nullptr;
  {
    Array a = from_dlpack(&p.versioned);
    EXPECT_EQ(a.numel(), 0);
  }
  EXPECT_EQ(p.deletes, 1);
}

TEST(DLPack, ExportRoundTripsEveryDtype) {
  for (DType d : kAllDTypes) {
    Array a = Array::arange(6, d).reshape({2, 3});
    DLManagedTensorVersioned* v = to_dlpack_versioned(a);
    EXPECT_EQ(v->version.major, static_cast<std::uint32_t>(DLPACK_MAJOR_VERSION));
    EXPECT_EQ(v->dl_tensor.data, a.data());
    EXPECT_EQ(v->flags, 0u);
    Array back = from_dlpack(v);  // takes ownership; its deleter frees the export context
    EXPECT_EQ(back.dtype(), d);
    EXPECT_EQ(back.shape(), a.shape());
    EXPECT_TRUE(allclose(back, a)) << dtype_name(d);

    DLManagedTensor* l = to_dlpack_legacy(a.slice(1, 1, 3));
    EXPECT_EQ(l->dl_tensor.strides[0], 3);
    Array lb = from_dlpack(l);
    EXPECT_FALSE(lb.is_contiguous());
    EXPECT_EQ(lb.shape(), (Shape{2, 2}));
  }
}

TEST(DLPack, ExportKeepsStorageAliveUntilDeleted) {
  DLManagedTensorVersioned* v = nullptr;
  std::weak_ptr<void> watch;
  {
    Array a = Array::arange(4, DType::kInt64);
    watch = a.storage();
    v = to_dlpack_versioned(a);
  }
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(static_cast<std::int64_t*>(v->dl_tensor.data)[3], 3);
  v->deleter(v);
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace shardkit
