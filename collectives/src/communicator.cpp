// The Communicator front end: argument validation (before anything is sent), checked mode, contiguous staging of
// strided buffers, backend choice by buffer location, token bookkeeping, and the value forms on top of the buffer
// forms. Backends (mpi/, nccl/) only move data.

#include "shardkit/collectives/communicator.hpp"

#include <mpi.h>

#include <numeric>
#include <optional>

#include "backend.hpp"
#include "checked.hpp"
#include "mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit {
namespace detail {

struct CommunicatorImpl {
  CommOptions options;
  // The communicator operations run on: a duplicate or split shardkit owns, or (from_mpi_borrowed) the caller's.
  MpiComm owned;
  MpiCommHandle data = 0;
  // A private duplicate for checked-mode signatures, the MPI backend's own traffic and NCCL bootstrap: created on
  // first need (collective over the ranks), so that wrapping a caller's communicator costs nothing up front.
  MpiComm control_comm;
  std::unique_ptr<Backend> mpi;
  std::unique_ptr<Backend> nccl;
  std::shared_ptr<AbortState> abort = std::make_shared<AbortState>();
  int rank = 0;
  int size = 1;
  int device = -1;          // the GPU this rank would run NCCL on (-1: none)
  bool nccl_decided = false;  // whether the ranks have agreed on using NCCL yet
  std::uint64_t seq = 0;
  int tag_ub = 32767;
  // The last operation of each backend: switching backend waits for the other one (rule 3 across backends).
  Token last_mpi, last_nccl;

  MpiCommHandle control() {
    if (control_comm.is_null()) create_control();
    return control_comm.handle();
  }

  // The private duplicate, made with MPI_Comm_idup so that a rank that never arrives (the first collective it
  // skipped) ends in a TimeoutError rather than a hang.
  void create_control() {
    MPI_Comm dup = MPI_COMM_NULL;
    std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
    SHARDKIT_MPI_CHECK(MPI_Comm_idup(to_mpi<MPI_Comm>(data), &dup, req.data()));
    const Clock::time_point deadline =
        options.timeout.count() > 0 ? Clock::now() + options.timeout : Clock::time_point::max();
    if (!wait_all(req, nullptr, deadline)) {
      abort->aborted = true;
      abort->reason = "a rank did not arrive to set up communicator '" + options.name + "'";
      request_abort_at_exit(abort->reason);
      throw TimeoutError(concat("TimeoutError: setting up communicator '", options.name,
                                "' (its first collective) did not complete within ", options.timeout.count() / 1000.0,
                                " s: a rank skipped this collective, is stuck, or was lost. The communicator is "
                                "aborted; the job will end at exit."));
    }
    control_comm = MpiComm::adopt(::shardkit::from_mpi(dup));
  }

  // Agrees with the other ranks on NCCL (collective over the communicator): used only when every rank has a GPU,
  // NCCL is built and the backend is not forced to MPI.
  void decide_nccl() {
    if (nccl_decided) return;
    nccl_decided = true;
    const int want = nccl_built() && device >= 0 && options.backend != BackendKind::kMpi ? 1 : 0;
    int all = 0;
    SHARDKIT_MPI_CHECK(MPI_Allreduce(&want, &all, 1, MPI_INT, MPI_MIN, to_mpi<MPI_Comm>(control())));
    if (all) {
      nccl = make_nccl_backend(control(), device, abort);
    } else if (options.backend == BackendKind::kNccl) {
      throw BackendError("NCCL", 0,
                         concat("SHARDKIT_BACKEND=nccl but not every rank can use NCCL (", nccl_built() ? "" : "not built; ",
                                device < 0 ? "this rank has no GPU" : "another rank has no GPU", ")"));
    }
  }

  void ensure_usable() const {
    if (abort->aborted)
      throw BackendError("shardkit", 0,
                         concat("communicator '", options.name, "' was aborted (", abort->reason,
                                "); create a new one after the failure is resolved"));
  }

  Backend& select(std::initializer_list<const Array*> buffers) {
    bool device_memory = false;
    for (const Array* a : buffers)
      if (a && a->numel() > 0) device_memory = device_memory || a->device().is_device_memory();
    if ((device_memory || options.backend == BackendKind::kNccl) && !nccl_decided) decide_nccl();
    Backend* b = mpi.get();
    if (options.backend == BackendKind::kNccl) {
      SHARDKIT_CHECK(nccl != nullptr, "SHARDKIT_BACKEND=nccl but communicator '", options.name,
                     "' has no NCCL communicator (no GPU bound, or NCCL not built)");
      for (const Array* a : buffers)
        SHARDKIT_CHECK(!a || a->numel() == 0 || a->device().is_device_memory(),
                       "the NCCL backend needs GPU buffers, got ", a->device());
      b = nccl.get();
    } else if (options.backend == BackendKind::kAuto && device_memory && nccl) {
      b = nccl.get();
    }
    // Operations on one communicator run in call order, also across backends.
    Token& other = b == mpi.get() ? last_nccl : last_mpi;
    if (other.waitable()) {
      other.wait();
      other = Token();
    }
    return *b;
  }

  OpContext context(OpKind op, const Token& after, bool collective) {
    OpContext ctx;
    ctx.op = op;
    ctx.seq = collective ? seq++ : seq;
    ctx.comm_name = &options.name;
    ctx.after = &after;
    ctx.timeout = options.timeout;
    ctx.deadline = options.timeout.count() > 0 ? Clock::now() + options.timeout : Clock::time_point::max();
    ctx.async = options.async;
    return ctx;
  }

  // Checked mode (collectives), then the `after` token: a host wait for MPI; NCCL orders its stream on it itself.
  void start(const OpContext& ctx, const Backend& b, Signature sig) {
    if (options.check) {
      sig.seq = ctx.seq;
      sig.op = static_cast<std::uint32_t>(ctx.op);
      sig.backend = static_cast<std::int32_t>(b.kind());
      check_signatures(control(), sig, ctx, *abort);
    }
    start(ctx, b);
  }
  void start(const OpContext& ctx, const Backend& b) {
    if (b.kind() == BackendKind::kMpi && ctx.after) ctx.after->wait();
  }

  Token done(const Backend& b, Token t) {
    Token& last = b.kind() == BackendKind::kNccl ? last_nccl : last_mpi;
    if (t.waitable() || last.waitable()) last = t;  // a complete token replaces a complete one: nothing to do
    return t;
  }

  void check_root(int root, const char* op) const {
    SHARDKIT_CHECK(root >= 0 && root < size, op, ": root ", root, " out of range for communicator '", options.name,
                   "' of size ", size);
  }
  void check_peer(int peer, const char* op, const char* what, bool any_allowed) const {
    SHARDKIT_CHECK((any_allowed && peer == kAnySource) || (peer >= 0 && peer < size), op, ": ", what, " ", peer,
                   " out of range for communicator '", options.name, "' of size ", size);
  }
  void check_tag(int tag, const char* op, bool any_allowed) const {
    SHARDKIT_CHECK((any_allowed && tag == kAnyTag) || (tag >= 0 && tag <= tag_ub), op, ": tag ", tag,
                   " out of range [0, ", tag_ub, "]");
  }
};

namespace {

void check_same_dtype(const Array& a, const Array& b, const char* op) {
  SHARDKIT_CHECK(a.dtype() == b.dtype(), op, ": send dtype ", a.dtype(), " differs from receive dtype ", b.dtype());
}
void check_writable(const Array& a, const char* op) {
  SHARDKIT_CHECK(!a.read_only(), op, ": the receive buffer is read-only");
}
void check_reduce(ReduceOp op, DType dtype, const char* name) {
  SHARDKIT_CHECK(reduce_op_supports(op, dtype), name, ": reduction '", reduce_op_name(op),
                 "' is not defined for dtype ", dtype);
}
void check_counts(std::span<const std::int64_t> counts, int size, const char* op, const char* what) {
  SHARDKIT_CHECK_EQ(static_cast<int>(counts.size()), size, op, ": ", what, " needs one entry per rank");
  for (std::size_t i = 0; i < counts.size(); ++i)
    SHARDKIT_CHECK_GE(counts[i], 0, op, ": negative ", what, " entry for rank ", i);
}
std::vector<std::int64_t> displacements(std::span<const std::int64_t> counts) {
  std::vector<std::int64_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}
std::int64_t total(std::span<const std::int64_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
}

// A receive buffer as the backend wants it: the caller's array if contiguous, else a contiguous temporary copied
// back once the operation completes. Holds a reference on the fast path (copying an Array allocates).
class Out {
 public:
  explicit Out(Array& user) : user_(user) {
    if (!user.is_contiguous()) temp_.emplace(Array::empty(user.shape(), user.dtype(), user.device()));
  }
  // For in-place operations: the temporary starts with the caller's data.
  Out& with_contents() {
    if (temp_) temp_->copy_from(user_);
    return *this;
  }
  Array& buf() { return temp_ ? *temp_ : user_; }
  Token finish(Token t) {
    if (temp_) {
      Array src = *temp_, dst = user_;
      t = then(std::move(t), [src, dst]() mutable { dst.copy_from(src); });
    }
    if (t.waitable()) user_.set_ready(t.waitable());
    return t;
  }

 private:
  Array& user_;
  std::optional<Array> temp_;
};

// The contiguous form a backend needs of an input: the input itself, or a packed copy that lives as long as this.
class In {
 public:
  explicit In(const Array& a) {
    if (!a.is_contiguous()) temp_.emplace(a.contiguous());
    ref_ = temp_ ? &*temp_ : &a;
  }
  operator const Array&() const { return *ref_; }  // NOLINT(google-explicit-constructor): used as an argument

 private:
  const Array* ref_;
  std::optional<Array> temp_;
};

inline In in(const Array& a) { return In(a); }

Signature sig(DType dtype, std::int64_t count, int root = -1, int reduce = -1, std::uint64_t extra = 0) {
  Signature s;
  s.dtype = static_cast<std::int32_t>(dtype);
  s.count = count;
  s.root = root;
  s.reduce = reduce;
  s.extra = extra;
  return s;
}

// A communicator over `data`: owned (a duplicate or split made for it) or borrowed from the caller. With
// `eager_nccl`, the NCCL decision (and bootstrap) happens now, so later point-to-point operations on GPU buffers
// never have to bootstrap NCCL between two ranks only.
std::unique_ptr<CommunicatorImpl> build(MpiComm owned, MpiCommHandle borrowed, CommOptions options, int device,
                                        bool eager_nccl) {
  auto m = std::make_unique<CommunicatorImpl>();
  m->options = std::move(options);
  m->owned = std::move(owned);
  m->data = m->owned.is_null() ? borrowed : m->owned.handle();
  MPI_Comm c = to_mpi<MPI_Comm>(m->data);
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &m->rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &m->size));
  CommunicatorImpl* raw = m.get();
  m->mpi = make_mpi_backend(m->data, [raw] { return raw->control(); }, m->abort);
  {
    void* value = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(c, MPI_TAG_UB, &value, &flag);
    if (flag && value) m->tag_ub = *static_cast<int*>(value);
  }
  m->device = device;
  if (!m->owned.is_null()) m->control();  // owned communicators are made collectively anyway: set up now
  if (eager_nccl && device >= 0) m->decide_nccl();
  if (Config::get().verbose && m->rank == 0)
    std::fprintf(stderr, "shardkit: communicator '%s': %d ranks, backends mpi%s\n", m->options.name.c_str(), m->size,
                 m->nccl ? "+nccl" : "");
  return m;
}

int runtime_device() {
  const Runtime* rt = Runtime::current();
  if (!rt || rt->device().kind != DeviceKind::kCUDA) return -1;
  return rt->device().index;
}

}  // namespace
}  // namespace detail

using detail::OpKind;

// ---- construction ----------------------------------------------------------------------------------------------------

Communicator::Communicator(std::unique_ptr<detail::CommunicatorImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::shared_ptr<Communicator> Communicator::world(const Runtime& runtime, CommOptions options) {
  const int device = runtime.device().kind == DeviceKind::kCUDA ? runtime.device().index : -1;
  return std::shared_ptr<Communicator>(
      new Communicator(detail::build(MpiComm::dup(runtime.world()), 0, std::move(options), device, true)));
}

std::shared_ptr<Communicator> Communicator::world(CommOptions options) {
  return world(Runtime::instance(), std::move(options));
}

std::shared_ptr<Communicator> Communicator::from_mpi(MpiCommHandle comm, CommOptions options) {
  SHARDKIT_CHECK(comm != ::shardkit::from_mpi(MPI_COMM_NULL), "from_mpi: MPI_COMM_NULL");
  return std::shared_ptr<Communicator>(
      new Communicator(detail::build(MpiComm::dup(comm), 0, std::move(options), detail::runtime_device(), true)));
}

std::shared_ptr<Communicator> Communicator::wrap_mpi(MpiCommHandle comm, CommOptions options) {
  SHARDKIT_CHECK(comm != ::shardkit::from_mpi(MPI_COMM_NULL), "wrap_mpi: MPI_COMM_NULL");
  return std::shared_ptr<Communicator>(
      new Communicator(detail::build(MpiComm(), comm, std::move(options), detail::runtime_device(), false)));
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  auto& m = *impl_;
  m.ensure_usable();
  MpiComm sub = MpiComm::split(m.data, color, key);
  CommOptions opts = m.options;
  opts.name = name.empty() ? detail::concat(m.options.name, "/split(", color, ")") : std::move(name);
  if (m.nccl) {
    // NCCL splits its own communicator (collective over the parent); the MPI side comes from the MPI split.
    auto abort = std::make_shared<detail::AbortState>();
    std::unique_ptr<detail::Backend> nccl = detail::split_nccl_backend(*m.nccl, color, key, abort);
    if (color < 0) return nullptr;
    auto impl = detail::build(std::move(sub), 0, std::move(opts), m.device, false);
    impl->abort = abort;
    impl->mpi = detail::make_mpi_backend(impl->data, [raw = impl.get()] { return raw->control(); }, abort);
    impl->nccl = std::move(nccl);
    impl->nccl_decided = true;
    return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
  }
  if (color < 0) return nullptr;
  // The parent already agreed not to use NCCL; so do its parts.
  auto impl = detail::build(std::move(sub), 0, std::move(opts), m.device, false);
  impl->nccl_decided = m.nccl_decided;
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::dup(std::string name) {
  auto& m = *impl_;
  m.ensure_usable();
  return split(0, m.rank, name.empty() ? m.options.name + "/dup" : std::move(name));
}

int Communicator::rank() const noexcept { return impl_->rank; }
int Communicator::size() const noexcept { return impl_->size; }
const std::string& Communicator::name() const noexcept { return impl_->options.name; }
const CommOptions& Communicator::options() const noexcept { return impl_->options; }
bool Communicator::has_nccl() const noexcept { return impl_->nccl != nullptr; }
bool Communicator::aborted() const noexcept { return impl_->abort->aborted; }
std::uint64_t Communicator::sequence() const noexcept { return impl_->seq; }
MpiCommHandle Communicator::mpi_handle() const noexcept { return impl_->data; }

BackendKind Communicator::backend_for(Device device) const {
  const auto& m = *impl_;
  if (m.options.backend == BackendKind::kNccl) return BackendKind::kNccl;
  if (m.options.backend == BackendKind::kAuto && device.is_device_memory() && m.nccl) return BackendKind::kNccl;
  return BackendKind::kMpi;
}

// ---- buffer form -------------------------------------------------------------------------------------------------------

Token Communicator::allreduce(const Array& send, Array& recv, ReduceOp op, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  if (send.data() == recv.data() && send.numel() > 0 && send.shape() == recv.shape() &&
      send.strides() == recv.strides())
    return allreduce_inplace(recv, op, after);
  detail::check_same_dtype(send, recv, "allreduce");
  SHARDKIT_CHECK_EQ(send.numel(), recv.numel(), "allreduce: send and receive sizes differ");
  detail::check_writable(recv, "allreduce");
  detail::check_reduce(op, send.dtype(), "allreduce");
  detail::Backend& b = m.select({&send, &recv});
  auto ctx = m.context(OpKind::kAllreduce, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), send.numel(), -1, static_cast<int>(op)));
  detail::Out out(recv);
  return m.done(b, out.finish(b.allreduce(detail::in(send), out.buf(), op, ctx)));
}

Token Communicator::allreduce_inplace(Array& buf, ReduceOp op, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::check_writable(buf, "allreduce");
  detail::check_reduce(op, buf.dtype(), "allreduce");
  detail::Backend& b = m.select({&buf});
  auto ctx = m.context(OpKind::kAllreduce, after, true);
  m.start(ctx, b, detail::sig(buf.dtype(), buf.numel(), -1, static_cast<int>(op)));
  detail::Out out(buf);
  out.with_contents();
  return m.done(b, out.finish(b.allreduce(out.buf(), out.buf(), op, ctx)));
}

Token Communicator::reduce(const Array& send, Array& recv, ReduceOp op, int root, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  m.check_root(root, "reduce");
  detail::check_reduce(op, send.dtype(), "reduce");
  const bool is_root = m.rank == root;
  if (is_root) {
    detail::check_same_dtype(send, recv, "reduce");
    SHARDKIT_CHECK_EQ(send.numel(), recv.numel(), "reduce: send and receive sizes differ on the root");
    detail::check_writable(recv, "reduce");
  }
  detail::Backend& b = m.select({&send, is_root ? &recv : nullptr});
  auto ctx = m.context(OpKind::kReduce, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), send.numel(), root, static_cast<int>(op)));
  if (!is_root) {
    Array dummy;
    return m.done(b, b.reduce(detail::in(send), dummy, op, root, ctx));
  }
  const bool in_place = send.data() == recv.data() && send.strides() == recv.strides();
  detail::Out out(recv);
  if (in_place) out.with_contents();
  Array s = in_place ? out.buf() : detail::in(send);
  return m.done(b, out.finish(b.reduce(s, out.buf(), op, root, ctx)));
}

Token Communicator::bcast_inplace(Array& buf, int root, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  m.check_root(root, "bcast");
  if (m.rank != root) detail::check_writable(buf, "bcast");
  detail::Backend& b = m.select({&buf});
  auto ctx = m.context(OpKind::kBcast, after, true);
  m.start(ctx, b, detail::sig(buf.dtype(), buf.numel(), root));
  detail::Out out(buf);
  if (m.rank == root) out.with_contents();
  return m.done(b, out.finish(b.bcast(out.buf(), root, ctx)));
}

Token Communicator::allgather(const Array& send, Array& recv, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::check_same_dtype(send, recv, "allgather");
  SHARDKIT_CHECK_EQ(recv.numel(), send.numel() * m.size, "allgather: the receive buffer must hold size * ",
                    send.numel(), " elements");
  detail::check_writable(recv, "allgather");
  detail::Backend& b = m.select({&send, &recv});
  auto ctx = m.context(OpKind::kAllgather, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), send.numel()));
  detail::Out out(recv);
  return m.done(b, out.finish(b.allgather(detail::in(send), out.buf(), ctx)));
}

Token Communicator::gather(const Array& send, Array& recv, int root, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  m.check_root(root, "gather");
  const bool is_root = m.rank == root;
  if (is_root) {
    detail::check_same_dtype(send, recv, "gather");
    SHARDKIT_CHECK_EQ(recv.numel(), send.numel() * m.size, "gather: the root's receive buffer must hold size * ",
                      send.numel(), " elements");
    detail::check_writable(recv, "gather");
  }
  detail::Backend& b = m.select({&send, is_root ? &recv : nullptr});
  auto ctx = m.context(OpKind::kGather, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), send.numel(), root));
  if (!is_root) {
    Array dummy;
    return m.done(b, b.gather(detail::in(send), dummy, root, ctx));
  }
  detail::Out out(recv);
  return m.done(b, out.finish(b.gather(detail::in(send), out.buf(), root, ctx)));
}

Token Communicator::scatter(const Array& send, Array& recv, int root, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  m.check_root(root, "scatter");
  const bool is_root = m.rank == root;
  detail::check_writable(recv, "scatter");
  if (is_root) {
    detail::check_same_dtype(send, recv, "scatter");
    SHARDKIT_CHECK_EQ(send.numel(), recv.numel() * m.size, "scatter: the root's send buffer must hold size * ",
                      recv.numel(), " elements");
  }
  detail::Backend& b = m.select({is_root ? &send : nullptr, &recv});
  auto ctx = m.context(OpKind::kScatter, after, true);
  m.start(ctx, b, detail::sig(recv.dtype(), recv.numel(), root));
  detail::Out out(recv);
  Array s = is_root ? detail::in(send) : Array();
  return m.done(b, out.finish(b.scatter(s, out.buf(), root, ctx)));
}

Token Communicator::reduce_scatter(const Array& send, Array& recv, ReduceOp op, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::check_same_dtype(send, recv, "reduce_scatter");
  SHARDKIT_CHECK_EQ(send.numel(), recv.numel() * m.size, "reduce_scatter: the send buffer must hold size * ",
                    recv.numel(), " elements");
  detail::check_writable(recv, "reduce_scatter");
  detail::check_reduce(op, send.dtype(), "reduce_scatter");
  detail::Backend& b = m.select({&send, &recv});
  auto ctx = m.context(OpKind::kReduceScatter, after, true);
  m.start(ctx, b, detail::sig(recv.dtype(), recv.numel(), -1, static_cast<int>(op)));
  detail::Out out(recv);
  return m.done(b, out.finish(b.reduce_scatter(detail::in(send), out.buf(), op, ctx)));
}

Token Communicator::alltoall(const Array& send, Array& recv, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::check_same_dtype(send, recv, "alltoall");
  SHARDKIT_CHECK_EQ(send.numel(), recv.numel(), "alltoall: send and receive sizes differ");
  SHARDKIT_CHECK(send.numel() % m.size == 0, "alltoall: ", send.numel(), " elements do not split into ", m.size,
                 " equal blocks");
  detail::check_writable(recv, "alltoall");
  detail::Backend& b = m.select({&send, &recv});
  auto ctx = m.context(OpKind::kAlltoall, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), send.numel()));
  detail::Out out(recv);
  return m.done(b, out.finish(b.alltoall(detail::in(send), out.buf(), ctx)));
}

Token Communicator::send(const Array& buf, int dest, int tag, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  m.check_peer(dest, "send", "destination", false);
  m.check_tag(tag, "send", false);
  detail::Backend& b = m.select({&buf});
  auto ctx = m.context(OpKind::kSend, after, false);
  m.start(ctx, b);
  return m.done(b, b.send(detail::in(buf), dest, tag, ctx));
}

Token Communicator::recv_into(Array& buf, int source, int tag, RecvStatus* status, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  m.check_peer(source, "recv", "source", true);
  m.check_tag(tag, "recv", true);
  detail::check_writable(buf, "recv");
  detail::Backend& b = m.select({&buf});
  auto ctx = m.context(OpKind::kRecv, after, false);
  m.start(ctx, b);
  detail::Out out(buf);
  return m.done(b, out.finish(b.recv(out.buf(), source, tag, status, ctx)));
}

Token Communicator::sendrecv_into(const Array& send, int dest, Array& recv, int source, int send_tag, int recv_tag,
                                  RecvStatus* status, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  m.check_peer(dest, "sendrecv", "destination", false);
  m.check_peer(source, "sendrecv", "source", true);
  m.check_tag(send_tag, "sendrecv", false);
  m.check_tag(recv_tag, "sendrecv", true);
  detail::check_writable(recv, "sendrecv");
  detail::Backend& b = m.select({&send, &recv});
  auto ctx = m.context(OpKind::kSendrecv, after, false);
  m.start(ctx, b);
  detail::Out out(recv);
  return m.done(b, out.finish(b.sendrecv(detail::in(send), dest, send_tag, out.buf(), source, recv_tag, status, ctx)));
}

Token Communicator::barrier(const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::Backend& b = m.select({});  // no buffers: MPI
  auto ctx = m.context(OpKind::kBarrier, after, true);
  m.start(ctx, b, detail::Signature{});
  return m.done(b, b.barrier(ctx));
}

Token Communicator::scan(const Array& send, Array& recv, ReduceOp op, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::check_same_dtype(send, recv, "scan");
  SHARDKIT_CHECK_EQ(send.numel(), recv.numel(), "scan: send and receive sizes differ");
  detail::check_writable(recv, "scan");
  detail::check_reduce(op, send.dtype(), "scan");
  // NCCL has no scan: GPU buffers go through the MPI backend (staged through pinned memory).
  detail::Backend& chosen = m.select({&send, &recv});
  detail::Backend& b = chosen.kind() == BackendKind::kNccl ? *m.mpi : chosen;
  if (&b != &chosen) m.last_nccl.wait();
  auto ctx = m.context(OpKind::kScan, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), send.numel(), -1, static_cast<int>(op)));
  const bool in_place = send.data() == recv.data() && send.strides() == recv.strides();
  detail::Out out(recv);
  if (in_place) out.with_contents();
  Array s = in_place ? out.buf() : detail::in(send);
  return m.done(b, out.finish(b.scan(s, out.buf(), op, ctx)));
}

Token Communicator::allgatherv(const Array& send, Array& recv, std::span<const std::int64_t> counts,
                               const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::check_counts(counts, m.size, "allgatherv", "counts");
  detail::check_same_dtype(send, recv, "allgatherv");
  SHARDKIT_CHECK_EQ(send.numel(), counts[m.rank], "allgatherv: this rank's send size differs from its count");
  SHARDKIT_CHECK_EQ(recv.numel(), detail::total(counts), "allgatherv: the receive buffer must hold the sum of counts");
  detail::check_writable(recv, "allgatherv");
  detail::Backend& b = m.select({&send, &recv});
  auto ctx = m.context(OpKind::kAllgatherv, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), recv.numel(), -1, -1, detail::hash_counts(counts)));
  const std::vector<std::int64_t> displs = detail::displacements(counts);
  detail::Out out(recv);
  return m.done(b, out.finish(b.allgatherv(detail::in(send), out.buf(), counts, displs, ctx)));
}

Token Communicator::alltoallv(const Array& send, std::span<const std::int64_t> send_counts, Array& recv,
                              std::span<const std::int64_t> recv_counts, const Token& after) {
  auto& m = *impl_;
  m.ensure_usable();
  detail::check_counts(send_counts, m.size, "alltoallv", "send_counts");
  detail::check_counts(recv_counts, m.size, "alltoallv", "recv_counts");
  detail::check_same_dtype(send, recv, "alltoallv");
  SHARDKIT_CHECK_EQ(send.numel(), detail::total(send_counts), "alltoallv: send size differs from the sum of send_counts");
  SHARDKIT_CHECK_EQ(recv.numel(), detail::total(recv_counts), "alltoallv: receive size differs from the sum of recv_counts");
  detail::check_writable(recv, "alltoallv");
  detail::Backend& b = m.select({&send, &recv});
  auto ctx = m.context(OpKind::kAlltoallv, after, true);
  m.start(ctx, b, detail::sig(send.dtype(), -1));
  if (m.options.check) detail::check_alltoallv_counts(m.control(), send_counts, recv_counts, ctx, *m.abort);
  const std::vector<std::int64_t> sd = detail::displacements(send_counts), rd = detail::displacements(recv_counts);
  detail::Out out(recv);
  return m.done(b, out.finish(b.alltoallv(detail::in(send), send_counts, sd, out.buf(), recv_counts, rd, ctx)));
}

// ---- value form --------------------------------------------------------------------------------------------------------

namespace {

Shape stacked(int n, const Shape& s) {
  Shape out{n};
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

Result make_result(Array value, Token token) {
  if (token.waitable()) value.set_ready(token.waitable());
  return {std::move(value), std::move(token)};
}

}  // namespace

Result Communicator::allreduce(const Array& x, ReduceOp op, const Token& after) {
  Array out = Array::empty(x.shape(), x.dtype(), x.device());
  Token t = allreduce(x, out, op, after);
  return make_result(out, t);
}

Result Communicator::reduce(const Array& x, ReduceOp op, int root, const Token& after) {
  Array out = rank() == root ? Array::empty(x.shape(), x.dtype(), x.device()) : Array();
  Token t = reduce(x, out, op, root, after);
  return make_result(rank() == root ? out : x, t);
}

Result Communicator::bcast(const Array& x, int root, const Token& after) {
  impl_->check_root(root, "bcast");
  Array out = rank() == root ? x.clone() : Array::empty(x.shape(), x.dtype(), x.device());
  Token t = bcast_inplace(out, root, after);
  return make_result(out, t);
}

Result Communicator::allgather(const Array& x, const Token& after) {
  Array out = Array::empty(stacked(size(), x.shape()), x.dtype(), x.device());
  Token t = allgather(x, out, after);
  return make_result(out, t);
}

Result Communicator::gather(const Array& x, int root, const Token& after) {
  impl_->check_root(root, "gather");
  Array out = rank() == root ? Array::empty(stacked(size(), x.shape()), x.dtype(), x.device()) : Array();
  Token t = gather(x, out, root, after);
  return make_result(rank() == root ? out : x, t);
}

Result Communicator::scatter(const Array& x, int root, const Token& after) {
  impl_->check_root(root, "scatter");
  Shape s = x.shape();
  if (rank() == root) {
    SHARDKIT_CHECK(x.ndim() >= 1 && x.dim(0) == size(), "scatter: on the root the input must have shape (",
                   size(), ", ...), got ", shape_to_string(x.shape()));
    s.erase(s.begin());
  }
  Array out = Array::empty(s, x.dtype(), x.device());
  Token t = scatter(x, out, root, after);
  return make_result(out, t);
}

Result Communicator::reduce_scatter(const Array& x, ReduceOp op, const Token& after) {
  SHARDKIT_CHECK(x.ndim() >= 1 && x.dim(0) == size(), "reduce_scatter: the input must have shape (", size(),
                 ", ...), got ", shape_to_string(x.shape()));
  Shape s(x.shape().begin() + 1, x.shape().end());
  Array out = Array::empty(s, x.dtype(), x.device());
  Token t = reduce_scatter(x, out, op, after);
  return make_result(out, t);
}

Result Communicator::alltoall(const Array& x, const Token& after) {
  SHARDKIT_CHECK(x.ndim() >= 1 && x.dim(0) == size(), "alltoall: the input's first axis must have size ", size(),
                 ", got shape ", shape_to_string(x.shape()));
  Array out = Array::empty(x.shape(), x.dtype(), x.device());
  Token t = alltoall(x, out, after);
  return make_result(out, t);
}

Result Communicator::recv(const Array& like, int source, int tag, RecvStatus* status, const Token& after) {
  Array out = Array::empty(like.shape(), like.dtype(), like.device());
  Token t = recv_into(out, source, tag, status, after);
  return make_result(out, t);
}

Result Communicator::sendrecv(const Array& send, const Array& recv_like, int source, int dest, int send_tag,
                              int recv_tag, RecvStatus* status, const Token& after) {
  Array out = Array::empty(recv_like.shape(), recv_like.dtype(), recv_like.device());
  Token t = sendrecv_into(send, dest, out, source, send_tag, recv_tag, status, after);
  return make_result(out, t);
}

Result Communicator::scan(const Array& x, ReduceOp op, const Token& after) {
  Array out = Array::empty(x.shape(), x.dtype(), x.device());
  Token t = scan(x, out, op, after);
  return make_result(out, t);
}

Result Communicator::allgatherv(const Array& x, const Token& after) {
  // Every rank's length first, then the data.
  Array n = Array::from_values<std::int64_t>({x.numel()});
  Array all_n = Array::empty({size()}, DType::kInt64);
  Token t = allgather(n, all_n, after);
  const std::vector<std::int64_t> counts = all_n.to_vector<std::int64_t>();
  Array out = Array::empty({detail::total(counts)}, x.dtype(), x.device());
  Array flat = x.is_contiguous() ? x.reshape({x.numel()}) : x.contiguous().reshape({x.numel()});
  t = allgatherv(flat, out, counts, t);
  return make_result(out, t);
}

}  // namespace shardkit
