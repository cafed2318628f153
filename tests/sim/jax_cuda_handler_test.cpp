// The XLA:GPU handler (bindings/src/jax/ffi_handlers.cpp: shardkit_collective_cuda) called the way XLA calls it — a
// call frame holding the program's stream, its buffers and the "call" attribute — on the simulated GPU, whose delays
// make a missing order visible. What XLA relies on: the operation reads its input only after the work XLA put on its
// stream before the call, and XLA's work after the call sees the result, with the host never waiting.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <future>
#include <thread>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu_required.hpp"
#include "jax_comms.hpp"
#include "mpi_test.hpp"
#include "shardkit/collectives/communicator.hpp"
#include "shardkit/collectives/launch_fence.hpp"
#include "shardkit/core/cuda.hpp"
#include "xla/ffi/api/c_api.h"

// The opaque error type of the C API, as this test's stand-in for XLA's runtime makes it.
struct XLA_FFI_Error {
  std::string message;
};

extern "C" XLA_FFI_Error* shardkit_collective_cuda(XLA_FFI_CallFrame* frame);

namespace shardkit::py {
// The handle registry of the Python layer, reduced to one communicator: the world.
Communicator& jax_comm(std::int64_t handle, OpKind) {
  static std::shared_ptr<Communicator> world = Communicator::world();
  SHARDKIT_CHECK(handle == 1, "unknown communicator handle ", handle);
  return *world;
}
}  // namespace shardkit::py

namespace shardkit::testing {
namespace {

// ---- a stand-in for XLA's side of the FFI ---------------------------------------------------------------------------

XLA_FFI_Error* error_create(XLA_FFI_Error_Create_Args* args) { return new XLA_FFI_Error{args->message}; }

// The execution context is the stream itself here.
XLA_FFI_Error* stream_get(XLA_FFI_Stream_Get_Args* args) {
  args->stream = reinterpret_cast<void*>(args->ctx);
  return nullptr;
}

const XLA_FFI_Api& fake_api() {
  static const XLA_FFI_Api api = [] {
    XLA_FFI_Api a{};
    a.struct_size = XLA_FFI_Api_STRUCT_SIZE;
    a.XLA_FFI_Error_Create = error_create;
    a.XLA_FFI_Stream_Get = stream_get;
    return a;
  }();
  return api;
}

struct Operand {
  XLA_FFI_DataType dtype;
  void* data;
  std::vector<std::int64_t> dims;
};

Operand token() { return {XLA_FFI_DataType_TOKEN, nullptr, {}}; }
Operand f32(void* data, std::int64_t n) { return {XLA_FFI_DataType_F32, data, {n}}; }

// The handler's eleven arguments, in the order shardkit/jax/_ops.py writes them (no status, no call site, the peers of
// a program's own sendrecv).
using Call = std::array<std::int64_t, 11>;
Call call_of(OpKind op, int root = 0) {
  return {static_cast<std::int64_t>(op), 1, static_cast<std::int64_t>(ReduceOp::kSum), root, 0, -1, 0, -1,
          /*status=*/0, /*site=*/0, /*peers=*/static_cast<std::int64_t>(Peers::kUnknown)};
}

// Calls the handler as XLA would, on `stream`. Returns the handler's error message, "" on success.
std::string call_handler(StreamHandle stream, std::vector<Operand> args, std::vector<Operand> rets, Call call) {
  auto buffers = [](std::vector<Operand>& ops) {
    std::vector<XLA_FFI_Buffer> b(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i)
      b[i] = {XLA_FFI_Buffer_STRUCT_SIZE, nullptr, ops[i].dtype, ops[i].data,
              static_cast<std::int64_t>(ops[i].dims.size()), ops[i].dims.data()};
    return b;
  };
  std::vector<XLA_FFI_Buffer> arg_buf = buffers(args), ret_buf = buffers(rets);
  std::vector<XLA_FFI_ArgType> arg_types(args.size(), XLA_FFI_ArgType_BUFFER);
  std::vector<XLA_FFI_RetType> ret_types(rets.size(), XLA_FFI_RetType_BUFFER);
  std::vector<void*> arg_ptr, ret_ptr;
  for (auto& b : arg_buf) arg_ptr.push_back(&b);
  for (auto& b : ret_buf) ret_ptr.push_back(&b);

  XLA_FFI_Array array{XLA_FFI_DataType_S64, call.size(), call.data()};
  XLA_FFI_ByteSpan name{"call", 4};
  XLA_FFI_ByteSpan* names[] = {&name};
  XLA_FFI_AttrType attr_types[] = {XLA_FFI_AttrType_ARRAY};
  void* attrs[] = {&array};

  XLA_FFI_CallFrame frame{};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.api = &fake_api();
  frame.ctx = reinterpret_cast<XLA_FFI_ExecutionContext*>(stream);
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  frame.args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, static_cast<std::int64_t>(args.size()), arg_types.data(),
                arg_ptr.data()};
  frame.rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, static_cast<std::int64_t>(rets.size()), ret_types.data(),
                ret_ptr.data()};
  frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 1, attr_types, names, attrs};
  std::unique_ptr<XLA_FFI_Error> err(shardkit_collective_cuda(&frame));
  return err ? err->message : std::string();
}

// ---- device buffers filled and read on XLA's stream -------------------------------------------------------------

class XlaGpuHandler : public ::testing::Test {
 protected:
  void SetUp() override {
    if (runtime().device().kind != DeviceKind::kCUDA) SHARDKIT_GPU_SKIP("the XLA:GPU handler needs a GPU");
    dev_ = runtime().device().index;
    stream_ = cuda::Stream::create(dev_);
  }

  // A device array of n floats written on XLA's stream from `values` (a delayed copy on the simulated GPU).
  void* device_from(const std::vector<float>& values) {
    void* d = cuda::malloc_device(values.size() * sizeof(float), dev_);
    void* h = cuda::malloc_host_pinned(values.size() * sizeof(float));
    std::copy(values.begin(), values.end(), static_cast<float*>(h));
    cuda::memcpy_async(d, h, values.size() * sizeof(float), stream_.handle());
    owned_.push_back({d, true});
    owned_.push_back({h, false});
    return d;
  }
  void* device_empty(std::size_t n) {
    void* d = cuda::malloc_device(n * sizeof(float), dev_);
    owned_.push_back({d, true});
    return d;
  }
  // `n` floats of `d` as read by a copy XLA puts on its stream after the call; the host then waits for the stream.
  std::vector<float> read_after(const void* d, std::size_t n) {
    std::vector<float> out(n);
    void* h = cuda::malloc_host_pinned(n * sizeof(float));
    owned_.push_back({h, false});
    cuda::memcpy_async(h, d, n * sizeof(float), stream_.handle());
    stream_.synchronize();
    std::copy(static_cast<float*>(h), static_cast<float*>(h) + n, out.begin());
    return out;
  }
  void TearDown() override {
    if (stream_.handle()) stream_.synchronize();
    for (auto [p, device] : owned_) device ? cuda::free_device(p) : cuda::free_host_pinned(p);
  }

  int dev_ = -1;
  cuda::Stream stream_;
  std::vector<std::pair<void*, bool>> owned_;
};

std::vector<float> rank_values(int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(r + 1 + static_cast<int>(i % 7));
  return v;
}

TEST_F(XlaGpuHandler, AllreduceOrderedOnXlasStream) {
  const int r = runtime().rank(), n = runtime().size();
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{4099}}) {
    SCOPED_TRACE(::testing::Message() << len << " elements");
    void* x = device_from(rank_values(r, len));
    void* out = device_empty(len);
    const auto s = static_cast<std::int64_t>(len);
    ASSERT_EQ(call_handler(stream_.handle(), {token(), f32(x, s)}, {token(), f32(out, s)},
                           call_of(OpKind::kAllreduce)),
              "");
    std::vector<float> want(len, 0.0f);
    for (int q = 0; q < n; ++q) {
      const std::vector<float> v = rank_values(q, len);
      for (std::size_t i = 0; i < len; ++i) want[i] += v[i];
    }
    EXPECT_EQ(read_after(out, len), want);
  }
}

// bcast's value on the root is its input: the handler copies it into XLA's result buffer on XLA's stream.
TEST_F(XlaGpuHandler, BcastFillsTheRootsResultOnXlasStream) {
  const int r = runtime().rank(), root = runtime().size() - 1;
  const std::size_t len = 1031;
  void* x = device_from(rank_values(r, len));
  void* out = device_empty(len);
  const auto s = static_cast<std::int64_t>(len);
  ASSERT_EQ(call_handler(stream_.handle(), {token(), f32(x, s)}, {token(), f32(out, s)}, call_of(OpKind::kBcast, root)),
            "");
  EXPECT_EQ(read_after(out, len), rank_values(root, len));
}

// An error reaches XLA as an error whose message names shardkit's class (shardkit.jax._ops raises that class again).
TEST_F(XlaGpuHandler, ErrorsReachXlaWithTheirClass) {
  void* x = device_from(rank_values(0, 3));
  void* out = device_empty(3);
  const std::string err = call_handler(stream_.handle(), {token(), f32(x, 3)}, {token(), f32(out, 3)},
                                       call_of(OpKind::kBcast, runtime().size() + 5));
  EXPECT_NE(err.find("shardkit.InvalidArgument"), std::string::npos) << err;
  EXPECT_NE(err.find("root"), std::string::npos) << err;
}

// A compiled program and an eager call of one rank launch on NCCL in program order, whatever their threads do: the
// eager call runs the process's launch fence first, which the JAX layer makes wait for the programs dispatched
// before (jax.effects_barrier; here, the stand-in XLA thread's call), and the program's own operations never run it
// (it would wait for itself). The two run on different NCCL communicators of one device (the JAX layer's duplicate
// and the caller's). Rank 0's program starts late and the other ranks' eager calls come late: without the fence the
// ranks launch the two communicators' allreduces in different orders, which the simulated NCCL refuses (real NCCL
// may hang); with the fence run inside the program, the fence times out below.
TEST_F(XlaGpuHandler, EagerCallsLaunchAfterTheCompiledProgramsDispatchedBefore) {
  const int r = runtime().rank(), n = runtime().size();
  static const std::shared_ptr<Communicator> eager = Communicator::world({.name = "eager"});
  const std::size_t len = 257;
  void* x = device_from(rank_values(r, len));
  void* out = device_empty(len);
  stream_.synchronize();
  const auto s = static_cast<std::int64_t>(len);
  Array mine = Array::from_values<float>(rank_values(r, len)).to(Device::cuda(dev_));
  eager->allreduce(mine, ReduceOp::kSum).token.wait();  // its NCCL communicator made (creation waits for all ranks)
  ASSERT_EQ(call_handler(stream_.handle(), {token(), f32(x, s)}, {token(), f32(out, s)}, call_of(OpKind::kAllreduce)),
            "");  // and the program's
  std::promise<std::string> program;
  std::shared_future<std::string> finished = program.get_future().share();
  std::thread xla([&] {  // the program JAX dispatched: one shardkit allreduce on XLA's thread
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    program.set_value(call_handler(stream_.handle(), {token(), f32(x, s)}, {token(), f32(out, s)},
                                   call_of(OpKind::kAllreduce)));
  });
  bool fence_ran = false;
  set_nccl_launch_fence([&] {
    fence_ran = true;
    if (finished.wait_for(std::chrono::seconds(20)) != std::future_status::ready)
      ADD_FAILURE() << "the fence waited for the program it runs in";
  });
  if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Result sum = eager->allreduce(mine, ReduceOp::kSum);
  const std::vector<float> eager_sum = sum.value.to_vector<float>();
  set_nccl_launch_fence({});
  xla.join();
  EXPECT_EQ(finished.get(), "");
  EXPECT_TRUE(fence_ran);
  std::vector<float> want(len, 0.0f);
  for (int q = 0; q < n; ++q) {
    const std::vector<float> v = rank_values(q, len);
    for (std::size_t i = 0; i < len; ++i) want[i] += v[i];
  }
  EXPECT_EQ(read_after(out, len), want);
  EXPECT_EQ(eager_sum, want);
}

}  // namespace
}  // namespace shardkit::testing
