// The one pipeline every operation runs through: validate (before anything is sent) → route to a backend → checked
// mode → order after the caller's token → make strided buffers contiguous → run on the backend → token bookkeeping.
// What differs between operations comes from the operation table (op_table.cpp); the value forms allocate their
// results by the table's value rule and run the same pipeline.

#include <mpi.h>

#include <atomic>
#include <cctype>
#include <memory>
#include <numeric>
#include <utility>

#include "checked.hpp"
#include "communicator_impl.hpp"
#include "op_table.hpp"
#include "transport.hpp"
#include "shardkit/collectives/launch_fence.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit {
namespace detail {
namespace {

// A receive buffer as the backend wants it: the caller's array if contiguous, else a contiguous temporary copied
// back once the operation completes; none when the operation writes nothing on this rank. Holds a pointer on the fast
// path (copying an Array allocates), and the rare temporary on the heap: an std::optional would be cleared per call.
class Out {
 public:
  explicit Out(Array* user) : user_(user) {
    if (user && !user->is_contiguous())
      temp_ = std::make_unique<Array>(Array::empty(user->shape(), user->dtype(), user->device()));
  }
  // For operations in place: the temporary starts with the caller's data.
  void with_contents() {
    if (temp_) temp_->copy_from(*user_);
  }
  Array* buf() { return temp_ ? temp_.get() : user_; }
  Token finish(Token t) {
    if (!user_) return t;
    if (temp_) {
      Array src = *temp_, dst = *user_;
      t = then(std::move(t), [src, dst]() mutable { dst.copy_from(src); });
    }
    if (t.waitable()) user_->set_ready(t.waitable());
    return t;
  }

 private:
  Array* user_;
  std::unique_ptr<Array> temp_;
};

// The contiguous form a backend needs of an input (nullptr: none): the input itself, or a packed copy that lives as
// long as this.
class In {
 public:
  explicit In(const Array* a) : ref_(a) {
    if (a && !a->is_contiguous()) {
      temp_ = std::make_unique<Array>(a->contiguous());
      ref_ = temp_.get();
    }
  }
  const Array* get() const { return ref_; }

 private:
  const Array* ref_;
  std::unique_ptr<Array> temp_;
};

// One rule for "in place": the caller passed the same elements as input and output.
bool same_buffer(const Array& a, const Array& b) {
  return a.data() == b.data() && a.shape() == b.shape() && a.strides() == b.strides();
}

Placement placement_of(const Array* send, const Array* recv) {
  int host = 0, device = 0;
  for (const Array* a : {send, recv}) {
    if (!a) continue;
    (a->device().is_device_memory() ? device : host)++;
  }
  if (device && host) return Placement::kMixed;
  return device ? Placement::kDevice : host ? Placement::kHost : Placement::kNone;
}

std::vector<std::int64_t> displacements(std::span<const std::int64_t> counts) {
  std::vector<std::int64_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

Result make_result(Array value, Token token) {
  if (token.waitable()) value.set_ready(token.waitable());
  return {std::move(value), std::move(token)};
}

}  // namespace

std::size_t CommunicatorImpl::choose(const RouteRequest& req, const OpContext& ctx) {
  const bool all_come = req.all_ranks_come();  // only such an operation may start a decision (collective)
  return route(req, slots, options.name, [&](std::size_t i) {
    const Transport& t = *transports()[i];
    if (t.before_routing) t.before_routing(req);
    TransportSlot& slot = slots[i];
    if (!slot.decided && all_come && t.may_take && t.may_take(req)) t.decide(*this, slot, ctx);
  });
}

Token CommunicatorImpl::run(OpKind op, const OpArgs& a, const Token& after) {
  const OpSpec& spec = op_spec(op);
  // One thread at a time: two threads' operations would start in a different order on each rank (a mismatch, a hang or
  // wrong data); the second is refused before it sends anything.
  if (running.load(std::memory_order_relaxed))
    throw InvalidArgument(concat(spec.name, " on communicator '", options.name, "' while another thread's operation "
                                 "runs on it: a communicator is used by one thread at a time (give each thread its "
                                 "own, Communicator::dup; compiled JAX programs dispatched from two Python threads "
                                 "run at once)"));
  running.store(true, std::memory_order_relaxed);
  struct Leave {
    std::atomic<bool>& running;
    ~Leave() { running.store(false, std::memory_order_relaxed); }
  } leave{running};
  ensure_usable();
  validate(spec, a, {rank, size, tag_ub, &options.name});
  const Array* send = active(spec.send, rank, a.root) ? a.send : nullptr;
  Array* recv = active(spec.recv, rank, a.root) ? a.recv : nullptr;

  // The operation's context (its deadline also bounds a set-up it asks for on the way).
  OpContext ctx;
  ctx.op = op;
  ctx.seq = seq;  // taken (seq advanced) once routed
  ctx.comm_name = &options.name;
  ctx.after = &after;
  ctx.timeout = options.timeout;
  ctx.deadline = deadline_after(options.timeout);
  ctx.async = options.async;

  // Route: the first transport that takes it, from their rules, the setting and where this rank's buffers live;
  // transports not decided yet are decided by the first operation every rank runs that they may take (collective).
  RouteRequest req{op, options.backend, placement_of(send, recv)};
  // Sized by an array of the same size on every rank, so that all route alike: the first, but a scatter's receive
  // buffer (its root's send buffer holds every rank's block).
  const bool by_recv = spec.send == Role::kRootIn && spec.recv == Role::kOut;
  if (const Array* sized = by_recv ? recv : send ? send : recv) {
    req.dtype = sized->dtype();
    req.bytes = static_cast<std::int64_t>(sized->nbytes());
  }
  req.reduce = a.reduce;
  req.named_peers = a.source != kAnySource && (a.dest == rank) == (a.source == rank);
  req.peers = a.peers;
  req.async = options.async;
  const std::size_t chosen = choose(req, ctx);
  const Transport& transport = *transports()[chosen];
  if (transport.on_device)
    for (const Array* x : {send, static_cast<const Array*>(recv)})
      if (x && x->device().kind == DeviceKind::kCUDA && x->device().index != device) {
        std::string name = transport.name;  // as a proper name: "NCCL"
        for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        throw InvalidArgument(concat(op_name(op), ": a buffer on ", x->device(), ", but communicator '", options.name,
                                     "' runs ", name, " on cuda:", device,
                                     " (copy it there with .to(), or run this rank on that device)"));
      }
  TransportSlot& slot = slots[chosen];
  Backend& b = *slot.backend;
  const BackendKind kind = transport.kind;
  // Operations on one communicator run in call order, also across transports: another transport's pending operation
  // completes first.
  for (TransportSlot& other : slots) {
    if (&other == &slot || !other.last.waitable()) continue;
    other.last.wait();
    other.last = Token();
  }

  if (spec.collective) ++seq;

  // The flight recorder's slot: failed unless the operation returns. It records what checked mode compares (the
  // signature every rank agrees on), beside this rank's own count.
  const Array* first = send ? send : recv;
  Signature s;
  if (spec.collective) {
    s = spec.signature(a);
    s.seq = ctx.seq;
    s.op = static_cast<std::uint32_t>(op);
    s.root = spec.rooted ? a.root : -1;
    s.reduce = spec.reduces ? static_cast<std::int32_t>(a.reduce) : -1;
    s.backend = static_cast<std::int32_t>(kind);
  }
  OpRecord what;
  what.op = op;
  what.seq = spec.collective ? static_cast<std::int64_t>(ctx.seq) : -1;
  what.dtype = first ? first->dtype() : DType::kUInt8;
  what.count = first ? first->numel() : -1;
  what.peer = spec.rooted                                      ? a.root
              : op == OpKind::kRecv                            ? a.source
              : op == OpKind::kSend || op == OpKind::kSendrecv ? a.dest
                                                               : -1;
  what.source = op == OpKind::kSendrecv ? a.source : -1;
  what.reduce = s.reduce;
  what.agreed_count = s.count;
  what.agreed_extra = s.extra;
  what.backend = kind;
  what.stream_ordered = transport.stream_ordered;
  struct Recorded {
    FlightRecorder* r;
    Recording op;
    ~Recorded() { r->fail(op); }
  } rec{recorder.get(), recorder->start(what)};
  const InOperation inside(recorder.get(), &rec.op);  // a timeout or mismatch raised below is recorded before its dump
  if (spec.collective && options.check) {
    check_signatures(control(), s, ctx, *abort);
    if (op == OpKind::kAlltoallv) check_alltoallv_counts(control(), a.send_counts, a.recv_counts, ctx, *abort);
  }
  // Contiguous buffers; in place when the caller passed one array as both.
  const bool in_place = send && recv && same_buffer(*send, *recv);
  // The caller's token: a host wait, but for a stream-ordered transport, which orders its stream on it itself; packing
  // a strided input (or an in-place buffer's contents) reads it now, so that must wait for the token too.
  const bool packs = in_place ? !recv->is_contiguous() : send && !send->is_contiguous();
  if (!transport.stream_ordered || packs) after.wait();
  Out out(recv);
  if (in_place) out.with_contents();
  const In in(in_place ? nullptr : send);
  BackendCall call{op, in_place ? out.buf() : in.get(), out.buf(), &a};
  std::vector<std::int64_t> sd, rd;  // stay empty (no allocation) but for the v-operations
  if (op == OpKind::kAllgatherv || op == OpKind::kAlltoallv) {
    // The caller's send displacements when given (alltoallv), else the counts packed in rank order.
    if (a.send_displs.empty()) sd = displacements(a.send_counts);
    rd = displacements(a.recv_counts);
    call.send_displs = a.send_displs.empty() ? std::span<const std::int64_t>(sd) : a.send_displs;
    call.recv_displs = rd;
  }
  Token t = b.run(call, ctx);
  // A pending token records its completion in the ring (and the trace) where it happens; dropped, a pending MPI
  // operation completes (pending_token).
  t = FlightRecorder::observe(rec.op, std::move(t), !transport.stream_ordered);
  t = out.finish(std::move(t));
  if (t.waitable() || slot.last.waitable()) slot.last = t;  // a complete token replacing a complete one: nothing to do
  recorder->finish(rec.op);
  return t;
}

}  // namespace detail

Token Communicator::run(OpKind op, const OpArgs& args, const Token& after) { return impl_->run(op, args, after); }

// The root of a rooted operation's value form, checked before value_shape reads it.
void Communicator::check_value_root(OpKind op, int root) const {
  if (detail::op_spec(op).rooted)
    SHARDKIT_CHECK(root >= 0 && root < size(), op_name(op), ": root ", root, " out of range for communicator '", name(),
                   "' of size ", size());
}

Result Communicator::run_value(OpKind op, const Array& x, OpArgs a, const Token& after) {
  const ValueRule rule = value_rule(op);
  const int r = rank(), n = size();
  if (rule == ValueRule::kConcat) {
    // Every rank's length first, then the data.
    Array len = Array::from_values<std::int64_t>({x.numel()});
    Array all = Array::empty({n}, DType::kInt64);
    Token t = allgather(len, all, after);
    const std::vector<std::int64_t> counts = all.to_vector<std::int64_t>();
    Array out = Array::empty({std::accumulate(counts.begin(), counts.end(), std::int64_t{0})}, x.dtype(), x.device());
    Array flat = (x.is_contiguous() ? x : x.contiguous()).reshape({x.numel()});
    t = run(OpKind::kAllgatherv, {.send = &flat, .recv = &out, .recv_counts = counts}, t);
    return detail::make_result(out, t);
  }
  SHARDKIT_CHECK(rule != ValueRule::kNone, op_name(op), " has no value form; use the buffer form");
  check_value_root(op, a.root);
  if (value_is_input(op, r, a.root)) {
    a.send = &x;
    return detail::make_result(x, run(op, a, after));
  }
  Array out = Array::empty(value_shape(op, x.shape(), r, n, a.root), x.dtype(), x.device());
  bind_value(op, x, out, a, r);
  return detail::make_result(out, run(op, a, after));
}

void Communicator::check_value(OpKind op, const Array& x, OpArgs a) const {
  const detail::OpSpec& spec = detail::op_spec(op);
  const auto& m = *impl_;
  Array out;
  if (value_rule(op) == ValueRule::kNone) {
    if (spec.send != detail::Role::kNone) a.send = &x;
  } else {
    // As run_value binds, on a result of its shape only: validate() reads shapes, dtypes and flags, never data.
    check_value_root(op, a.root);
    if (!value_is_input(op, m.rank, a.root))
      out = Array::shape_only(value_shape(op, x.shape(), m.rank, m.size, a.root), x.dtype(), x.device());
    detail::bind_value_buffers(op, x, out, a, m.rank);
  }
  detail::validate(spec, a, {m.rank, m.size, m.tag_ub, &m.options.name});
}

BackendKind Communicator::backend_for(OpKind op, Device device) const {
  const auto& m = *impl_;
  const detail::OpSpec& spec = detail::op_spec(op);
  detail::Placement where = device.is_device_memory() ? detail::Placement::kDevice : detail::Placement::kHost;
  if (spec.send == detail::Role::kNone && spec.recv == detail::Role::kNone) where = detail::Placement::kNone;
  detail::RouteRequest req{op, m.options.backend, where};
  req.async = m.options.async;
  // The slots as they stand; before its decision, a transport that may be assumed made is, for collectives (the first
  // that may take it decides; point-to-point operations wait for that decision).
  const auto all = detail::transports();
  std::vector<detail::TransportSlot> slots(m.slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    slots[i].view = m.slots[i].view;
    slots[i].refusal = m.slots[i].refusal;
    if (!m.slots[i].decided && all[i]->assumed_before_decision && spec.collective) slots[i].view = {true, false, 0};
  }
  return all[detail::route(req, slots, m.options.name)]->kind;
}

}  // namespace shardkit
