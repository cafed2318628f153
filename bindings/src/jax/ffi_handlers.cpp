// XLA FFI handlers: shardkit's operations inside compiled JAX programs. One handler body serves every operation: the
// operation's code and arguments arrive as attributes, the communicator as a handle into the registry (jax_layer.hpp),
// and the body runs the operation table's value form (value_shape / bind_value / Communicator::run) on XLA's buffers,
// wrapped as borrowed Arrays. Operands: (ordering token, x[, sendbuf]); results: (token[, result]). The token is the
// one JAX threads through ordered effects, so XLA runs the calls in program order and never drops one.
//
// XLA:CPU (shardkit_collective_cpu) reads the results when the handler returns: the handler waits for the operation.
// XLA:GPU (shardkit_collective_cuda, CUDA builds) passes the stream its program runs on: the operation starts after
// the work already on that stream (an event recorded there is its `after` token), and the stream's later work waits
// for it on the device (the token's order_stream). The host never synchronises, and NCCL runs on the communicator's
// own stream as for any other device operation. Both mark their thread as a compiled program's (CompiledProgramScope):
// the eager calls' NCCL launch fence, which waits for compiled programs, is not run there.

#include <mpi.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jax_comms.hpp"
#include "shardkit/collectives/call_site.hpp"
#include "shardkit/collectives/launch_fence.hpp"
#include "shardkit/config.hpp"
#include "shardkit/core/cuda.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace shardkit::py {
namespace {

DType dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return DType::kBool;
    case ffi::DataType::S8: return DType::kInt8;
    case ffi::DataType::S16: return DType::kInt16;
    case ffi::DataType::S32: return DType::kInt32;
    case ffi::DataType::S64: return DType::kInt64;
    case ffi::DataType::U8: return DType::kUInt8;
    case ffi::DataType::U16: return DType::kUInt16;
    case ffi::DataType::U32: return DType::kUInt32;
    case ffi::DataType::U64: return DType::kUInt64;
    case ffi::DataType::F16: return DType::kFloat16;
    case ffi::DataType::BF16: return DType::kBFloat16;
    case ffi::DataType::F32: return DType::kFloat32;
    case ffi::DataType::F64: return DType::kFloat64;
    case ffi::DataType::C64: return DType::kComplex64;
    case ffi::DataType::C128: return DType::kComplex128;
    default: break;
  }
  throw InvalidArgument(shardkit::detail::concat("XLA element type ", static_cast<int>(t), " has no shardkit dtype"));
}

// An XLA buffer as a borrowed Array: XLA owns the memory for the duration of the call. An instruction gets buffers
// of the same shapes every time it runs, so each thread keeps its last few views per operand position (a program with
// several collectives, or a loop over two shapes, alternates between them) and points a matching one at the new
// memory (building one allocates its shape and strides); a miss replaces the views in turn.
Array& wrap(ffi::AnyBuffer b, Device device, bool read_only, std::size_t slot) {
  constexpr std::size_t kViews = 4;
  struct Position {
    std::array<std::optional<Array>, kViews> views;
    std::size_t next = 0;  // the view a miss replaces
  };
  thread_local std::array<Position, 3> positions;
  Position& p = positions[slot];
  auto dims = b.dimensions();
  const DType dtype = dtype_of(b.element_type());
  for (std::optional<Array>& v : p.views) {
    if (v && v->dtype() == dtype && v->device() == device && v->read_only() == read_only &&
        std::equal(dims.begin(), dims.end(), v->shape().begin(), v->shape().end())) {
      v->retarget(b.untyped_data());
      return *v;
    }
  }
  std::optional<Array>& v = p.views[p.next];
  p.next = (p.next + 1) % kViews;
  return v.emplace(
      Array::borrow(b.untyped_data(), Shape(dims.begin(), dims.end()), dtype, device, nullptr, {}, read_only));
}

// The arguments of one call: one int64 array attribute "call" in this order (shardkit/jax/_ops.py writes it). One
// attribute, not one per argument: XLA decodes attributes by name at every call, a string comparison each.
// `status`: the address of the caller's MPI_Status (an mpi4py Status, as mpi4jax passes it), filled when a receive
// completes inside the compiled program; 0 for none. `peers`: OpArgs::peers.
struct Attrs {
  std::int64_t op, comm, reduce, root, dest, source, send_tag, recv_tag, status, site, peers;
};
constexpr std::size_t kCallFields = 11;

Attrs read_call(ffi::Span<const std::int64_t> call) {
  if (call.size() != kCallFields)
    throw InvalidArgument(shardkit::detail::concat("shardkit's XLA handler: attribute 'call' has ", call.size(),
                                                   " values, expected ", kCallFields));
  return {call[0], call[1], call[2], call[3], call[4], call[5], call[6], call[7], call[8], call[9], call[10]};
}

// Writes what a receive matched into the caller's MPI_Status: source, tag, and the count as bytes (so that
// Status.Get_count(datatype) divides it by the datatype's size, as after an MPI receive).
void fill_mpi_status(std::int64_t address, const RecvStatus& st, DType dtype) {
  auto* out = reinterpret_cast<MPI_Status*>(static_cast<std::uintptr_t>(address));
  out->MPI_SOURCE = st.source;
  out->MPI_TAG = st.tag;
  out->MPI_ERROR = MPI_SUCCESS;
  MPI_Status_set_elements_x(out, MPI_BYTE, static_cast<MPI_Count>(st.count) * static_cast<MPI_Count>(dtype_size(dtype)));
}

// Runs the value form of `a.op` on XLA's buffers. Returns the operation's token. `stream`: XLA's stream for device
// buffers (nullptr on the host): the operation follows XLA's work on it, and the copies it needs are ordered on it.
// `status`: filled once the returned token completes, when the call asks for it (at.status).
Token run_value_on(const Attrs& at, ffi::RemainingArgs args, ffi::RemainingRets rets, Device device, RecvStatus* status,
                   StreamHandle stream = nullptr) {
  const auto op = static_cast<OpKind>(at.op);
  Communicator& c = jax_comm(at.comm, op);
  current_call_site() = call_site_of(at.site);  // where the traced call was written (flight recorder)
  OpArgs a{.reduce = static_cast<ReduceOp>(at.reduce), .root = static_cast<int>(at.root),
           .dest = static_cast<int>(at.dest), .source = static_cast<int>(at.source),
           .send_tag = static_cast<int>(at.send_tag), .recv_tag = static_cast<int>(at.recv_tag),
           .peers = static_cast<Peers>(at.peers)};
  if (at.status) a.status = status;
  auto arg = [&](std::size_t i) -> Array& {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (b.has_error()) throw InvalidArgument(shardkit::detail::concat(op_name(op), ": operand ", i, " is not an array"));
    return wrap(*b, device, true, i - 1);
  };
  // What the operation follows: on a device, the work XLA has put on its stream so far (an event recorded there); on
  // the host nothing, XLA:CPU calling the handler once its operands are ready.
  auto after = [&] { return stream ? Token::from_stream(stream, device.index) : Token(); };
  if (op == OpKind::kBarrier) return c.run(op, a, after());
  Array& x = arg(1);
  if (op == OpKind::kSend) {
    a.send = &x;
    return c.run(op, a, after());
  }
  if (op == OpKind::kSendrecv) a.send = &arg(2);
  auto r = rets.get<ffi::AnyBuffer>(1);
  if (r.has_error()) throw InvalidArgument(shardkit::detail::concat(op_name(op), ": no result buffer"));
  Array& out = wrap(**r, device, false, 2);
  const bool same = value_is_input(op, c.rank(), a.root);
  if (stream && value_rule(op) == ValueRule::kRootCopy && c.rank() == a.root) {
    // The root's result starts as its input (bcast). bind_value copies it at once, which on a device may read x
    // before XLA's stream has written it: here the copy is the next step on XLA's stream, before `after`.
    cuda::memcpy_async(out.data(), x.data(), static_cast<std::size_t>(x.nbytes()), stream);
    a.recv = &out;
    a.send = &out;
  } else {
    bind_value(op, x, out, a, c.rank());
  }
  Token t = c.run(op, a, after());
  if (same) {  // the value form returns x itself here; XLA's result buffer must hold it
    if (stream) {
      t.order_stream(stream);
      cuda::memcpy_async(out.data(), x.data(), static_cast<std::size_t>(x.nbytes()), stream);
    } else {
      t.wait();
      out.copy_from(x);
    }
  }
  return t;
}

ffi::Error to_ffi_error(const std::exception& e) {
  // The message keeps the shardkit exception's class (core's error table names it), which shardkit.jax._ops raises
  // again as that class.
  const auto* error = dynamic_cast<const shardkit::Error*>(&e);
  const char* kind = error ? error_code_name(error->code()) : "Error";
  return ffi::Error(ffi::ErrorCode::kInternal, shardkit::detail::concat("shardkit.", kind, ": ", e.what()));
}

// The dtype of the received value (the result buffer) for a status's count.
DType result_dtype(ffi::RemainingRets& rets) {
  auto r = rets.get<ffi::AnyBuffer>(1);
  return r.has_error() ? DType::kUInt8 : dtype_of((*r)->element_type());
}

ffi::Error collective_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Span<const std::int64_t> call) {
  CompiledProgramScope compiled;
  try {
    const Attrs at = read_call(call);
    RecvStatus status;
    Token t = run_value_on(at, args, rets, Device::cpu(), &status);
    t.wait();  // XLA:CPU reads the results when the handler returns
    if (at.status) fill_mpi_status(at.status, status, result_dtype(rets));
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return to_ffi_error(e);
  }
}

#if SHARDKIT_HAVE_CUDA
ffi::Error collective_cuda(StreamHandle stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                           ffi::Span<const std::int64_t> call) {
  CompiledProgramScope compiled;  // the eager calls' NCCL launch fence waits for this program: not run here
  try {
    const Attrs at = read_call(call);
    // The device of the program's buffers (barrier has none: the calling thread's, which XLA sets).
    int index = -1;
    if (auto x = args.get<ffi::AnyBuffer>(1); !x.has_error()) index = cuda::pointer_info(x->untyped_data()).device;
    if (index < 0) index = cuda::current_device();
    RecvStatus status;
    Token t = run_value_on(at, args, rets, Device::cuda(index), &status, stream);
    if (at.status) {  // the host needs the receive done to say what it matched
      t.wait();
      fill_mpi_status(at.status, status, result_dtype(rets));
    }
    t.order_stream(stream);  // XLA's later work on the stream waits for the operation, on the device
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return to_ffi_error(e);
  }
}
#endif

// Both handlers' operands and attribute (what shardkit/jax/_ops.py passes), after each one's context arguments.
template <typename Binding>
auto collective_signature(Binding b) {
  return std::move(b).RemainingArgs().RemainingRets().template Attr<ffi::Span<const std::int64_t>>("call");
}

}  // namespace

#if SHARDKIT_HAVE_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(shardkit_collective_cuda, collective_cuda,
                              collective_signature(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<StreamHandle>>()));
#endif

XLA_FFI_DEFINE_HANDLER_SYMBOL(shardkit_collective_cpu, collective_cpu, collective_signature(ffi::Ffi::Bind()));

std::vector<std::pair<std::string, void*>> jax_ffi_handlers() {
  std::vector<std::pair<std::string, void*>> h = {
      {"shardkit_collective_cpu", reinterpret_cast<void*>(&shardkit_collective_cpu)}};
#if SHARDKIT_HAVE_CUDA
  h.emplace_back("shardkit_collective_cuda", reinterpret_cast<void*>(&shardkit_collective_cuda));
#endif
  return h;
}

}  // namespace shardkit::py
