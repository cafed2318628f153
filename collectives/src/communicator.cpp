// A Communicator's life: construction over a duplicate, a split or a caller's MPI communicator, the control
// communicator and the NCCL decision (both collective, made on first need), and its accessors. Operations run
// through the pipeline in pipeline.cpp.

#include "shardkit/collectives/communicator.hpp"

#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "communicator_impl.hpp"
#include "creation.hpp"
#include "backends/shm/hierarchy.hpp"
#include "watchdog.hpp"
#include "backends/mpi/mpi_request.hpp"
#include "op_table.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit {
namespace detail {

MpiCommHandle CommunicatorImpl::control() {
  if (control_comm.is_null()) create_control();
  return control_comm.handle();
}

// The private duplicate, made under the timeout so that a rank that never arrives (the first collective it skipped)
// ends in a TimeoutError rather than a hang; and with it the communicator's identity, which every member agrees on.
void CommunicatorImpl::create_control() {
  const char* step = "set-up (its first collective)";
  control_comm = dup_within_timeout(data, step, options.name, options, *abort);
  id = agree_on_identity(control_comm.handle(), step, options.name, options, *abort);
  recorder->set_id(id);
}

namespace {

// True on every rank alike when two ranks of `comm` use one GPU of one host. NCCL refuses such a communicator
// (ncclCommInitRank: "Duplicate GPU detected"), so ranks sharing a GPU agree to stay on MPI instead.
bool gpu_shared(MPI_Comm comm, int device) {
  struct Where {
    char host[64];
    int device;
  };
  Where me{};
  gethostname(me.host, sizeof me.host - 1);
  me.device = device;
  int size = 0;
  SHARDKIT_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<Where> all(static_cast<std::size_t>(size));
  SHARDKIT_MPI_CHECK(MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, comm));
  for (int i = 0; i < size; ++i)
    for (int j = 0; j < i; ++j)
      if (all[i].device >= 0 && all[i].device == all[j].device && std::strcmp(all[i].host, all[j].host) == 0)
        return true;
  return false;
}

}  // namespace

void CommunicatorImpl::decide_nccl() {
  if (nccl_decided) return;
  nccl_decided = true;
  // {whether this rank wants NCCL, minus whether it has a GPU}: the minimum says whether all want it and whether any
  // has a GPU (for the shm decision, decide_shm).
  const bool wants = nccl_built() && device >= 0 && options.backend != BackendKind::kMpi;
  struct Exchange {
    int mine[2], least[2];
  };
  // On the heap: MPI may still write it after a timeout has left this frame.
  auto x = std::make_shared<Exchange>(Exchange{{wants ? 1 : 0, device >= 0 ? -1 : 0}, {0, 0}});
  MPI_Comm c = to_mpi<MPI_Comm>(control());
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  SHARDKIT_MPI_CHECK(MPI_Iallreduce(x->mine, x->least, 2, MPI_INT, MPI_MIN, c, req.data()));
  const OpContext ctx = OpContext::for_step(OpKind::kAllreduce, "the NCCL decision", options.name, options.timeout);
  wait_or_raise(req, x, ctx, *abort, "not every rank arrived");
  const int all = x->least[0];
  gpu_somewhere = x->least[1] < 0;
  // Every rank has arrived: the exchange of hosts and devices below cannot wait for a missing one.
  const bool shared = all && gpu_shared(c, device);
  if (all && !shared) {
    nccl = make_nccl_backend(control(), device, abort, options.timeout);
  } else {
    nccl_refusal = shared            ? "ranks share a GPU, which NCCL refuses"
                   : !nccl_built()   ? "not built"
                   : device < 0      ? "this rank has no GPU"
                                     : "another rank has no GPU";
  }
}

void CommunicatorImpl::decide_shm(const OpContext& op) {
  if (shm_decided) return;
  shm_decided = true;
  if (options.backend == BackendKind::kAuto && gpu_somewhere) {
    // Decided without communication (every rank knows it from the NCCL decision): the default route keeps jobs with
    // GPUs on MPI and NCCL. Where only some ranks have one, their staged device buffers and the others' host buffers
    // would take different backends in one operation (and only the host ranks would come to the set-up).
    shm_refusal =
        "a rank has a GPU (the default route keeps such jobs on MPI and NCCL; SHARDKIT_BACKEND=shm forces it)";
    return;
  }
  // The set-up makes blocking MPI calls: agree first, under the operation's deadline, that every rank has come. It is
  // part of the operation that asked for it (a timeout names that operation) and takes no sequence number of its own.
  agree_within_operation(control(), op, "the shared-memory set-up", options.check, *abort);
  shm = make_hier_backend(control(), abort, options.max_message_elements, &shm_hierarchical, &shm_refusal);
  if (!shm_hierarchical) shm = make_shm_backend(control(), abort, &shm_refusal);
  if (Config::get().verbose && rank == 0)
    std::fprintf(stderr, "shardkit: communicator '%s': shm %s%s\n", options.name.c_str(),
                 !shm ? "refused: " : shm_hierarchical ? "in use, hierarchical (its ranks span nodes)" : "in use",
                 shm ? "" : shm_refusal.c_str());
}

void CommunicatorImpl::make_shm_now() {
  if (options.async || (options.backend != BackendKind::kAuto && options.backend != BackendKind::kShm)) return;
  decide_shm(OpContext::for_step(OpKind::kBarrier, "the shared-memory set-up", options.name, options.timeout));
  if (shm && !shm_hierarchical && !nccl_decided) {
    // Whether some rank has a GPU, which the NCCL decision has not said yet (point-to-point operations stay off shm
    // then). Every rank made the backend with this one: none is missing from this exchange.
    int has_gpu = device >= 0 ? 1 : 0;
    SHARDKIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &has_gpu, 1, MPI_INT, MPI_MAX, to_mpi<MPI_Comm>(control())));
    gpu_somewhere = has_gpu != 0;
  }
  p2p_shm = shm != nullptr && !shm_hierarchical && !gpu_somewhere;
}

void CommunicatorImpl::require_nccl(OpKind op) const {
  if (nccl_usable_for(op)) return;
  throw BackendError("NCCL", 0,
                     concat("SHARDKIT_BACKEND=nccl but ", op_name(op), " on communicator '", options.name,
                            "' cannot use NCCL (",
                            !nccl_refusal.empty() ? nccl_refusal
                            : nccl                ? "point-to-point on a communicator that agreed on NCCL only after "
                                                    "it was made"
                                                  : "the ranks have not agreed on NCCL",
                            ")"));
}

bool CommunicatorImpl::nccl_usable_for(OpKind op) const {
  return nccl != nullptr && (op_spec(op).collective || nccl_for_p2p);
}

void CommunicatorImpl::describe_shm(RouteRequest& r) const {
  r.p2p_shm = p2p_shm;
  r.shm_hierarchical = shm_hierarchical;
  r.shm_crowded = shm && shm->crowded();
}

void CommunicatorImpl::ensure_usable() const {
  if (abort->aborted)
    throw BackendError("shardkit", 0,
                       concat("communicator '", options.name, "' was aborted (", abort->reason,
                              "); create a new one after the failure is resolved"));
}

namespace {

// A communicator over `data`: owned (a duplicate or split made for it) or borrowed from the caller. With
// `eager_nccl`, the NCCL decision (and bootstrap) happens now, on every rank of a build with NCCL, with or without a
// GPU (a rank without one says no; skipping the decision there would leave the others waiting for it), so that
// point-to-point operations on GPU buffers may use NCCL without bootstrapping it between two ranks only; and the shm
// backend is made now (make_shm_now), so that point-to-point operations may use it from the first.
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
  m->mpi = make_mpi_backend(m->data, [raw] { return raw->control(); }, m->abort, m->options.max_message_elements);
  {
    // MPI_TAG_UB is one of the attributes MPI caches on MPI_COMM_WORLD: a duplicate need not carry it (the JAX layer's
    // duplicate read 32767 where its original read 2^31 - 1), and the bound is the same for every communicator.
    void* value = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
    if (flag && value) m->tag_ub = *static_cast<int*>(value);
  }
  m->device = device;
  {
    // The flight recorder names the members by world rank, so that the analyzer can match communicators across ranks.
    std::vector<int> mine(static_cast<std::size_t>(m->size)), world(mine.size(), -1);
    for (int i = 0; i < m->size; ++i) mine[i] = i;
    MPI_Group g, w;
    SHARDKIT_MPI_CHECK(MPI_Comm_group(c, &g));
    SHARDKIT_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &w));
    SHARDKIT_MPI_CHECK(MPI_Group_translate_ranks(g, m->size, mine.data(), w, world.data()));
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    m->recorder = FlightRecorder::make(m->options.name, m->rank, m->size, std::move(world), Config::get().trace_buffer);
  }
  if (!m->owned.is_null()) m->control();  // owned communicators are made collectively anyway: set up now
  if (eager_nccl && nccl_built()) {
    m->decide_nccl();
    m->nccl_for_p2p = true;
  }
  if (eager_nccl) m->make_shm_now();
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

// ---- construction ---------------------------------------------------------------------------------------------------

Communicator::Communicator(std::unique_ptr<detail::CommunicatorImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::shared_ptr<Communicator> Communicator::world(const Runtime& runtime, CommOptions options,
                                                 std::string_view first_op) {
  const int device = runtime.device().kind == DeviceKind::kCUDA ? runtime.device().index : -1;
  // The Runtime's world duplicate is shardkit's own: in checked mode the ranks first agree on it, which names the
  // ranks that do not arrive. Every rank makes its world communicators in the same order (the sequence number).
  static std::uint64_t creations = 0;
  // Messages read "<step> of communicator 'world'": "creation of ...", or "allreduce, the first collective of ...".
  const std::string step = first_op.empty() ? "creation" : detail::concat(first_op, ", the first collective");
  detail::AbortState abort;
  detail::agree_to_create(runtime.world(), step.c_str(), options.name, creations++, options, abort);
  MpiComm dup = detail::dup_within_timeout(runtime.world(), step.c_str(), options.name, options, abort);
  auto impl = detail::build(std::move(dup), 0, std::move(options), device, true);
  detail::start_watchdog(impl->control(), impl->options.name, impl->options, *impl->abort);
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::world(CommOptions options) {
  return world(Runtime::instance(), std::move(options));
}

std::shared_ptr<Communicator> Communicator::from_mpi(MpiCommHandle comm, CommOptions options) {
  SHARDKIT_CHECK(comm != ::shardkit::from_mpi(MPI_COMM_NULL), "from_mpi: MPI_COMM_NULL");
  detail::AbortState abort;
  MpiComm dup = detail::dup_within_timeout(comm, "creation", options.name, options, abort);
  return std::shared_ptr<Communicator>(
      new Communicator(detail::build(std::move(dup), 0, std::move(options), detail::runtime_device(), true)));
}

std::shared_ptr<Communicator> Communicator::wrap_mpi(MpiCommHandle comm, CommOptions options) {
  SHARDKIT_CHECK(comm != ::shardkit::from_mpi(MPI_COMM_NULL), "wrap_mpi: MPI_COMM_NULL");
  return std::shared_ptr<Communicator>(
      new Communicator(detail::build(MpiComm(), comm, std::move(options), detail::runtime_device(), false)));
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  auto& m = *impl_;
  m.ensure_usable();
  CommOptions opts = m.options;
  opts.name = name.empty() ? detail::concat(m.options.name, "/split(", color, ")") : std::move(name);
  // MPI_Comm_split has no nonblocking form: agree first (under the timeout) that every rank is here.
  detail::agree_to_create(m.control(), "a split", m.options.name, m.seq++, m.options, *m.abort);
  MpiComm sub = MpiComm::split(m.data, color, key);
  if (m.nccl) {
    // NCCL splits its own communicator (collective over the parent); the MPI side comes from the MPI split.
    auto abort = std::make_shared<detail::AbortState>();
    std::unique_ptr<detail::Backend> nccl = detail::split_nccl_backend(*m.nccl, color, key, abort, m.options.timeout);
    if (color < 0) return nullptr;
    auto impl = detail::build(std::move(sub), 0, std::move(opts), m.device, false);
    impl->abort = abort;
    impl->mpi = detail::make_mpi_backend(impl->data, [raw = impl.get()] { return raw->control(); }, abort,
                                         impl->options.max_message_elements);
    impl->nccl = std::move(nccl);
    impl->nccl_decided = true;
    impl->nccl_for_p2p = true;  // decided with the split, by every rank of the parent
    return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
  }
  if (color < 0) return nullptr;
  // The parent already agreed not to use NCCL (or has not decided yet); so do its parts.
  auto impl = detail::build(std::move(sub), 0, std::move(opts), m.device, false);
  impl->nccl_decided = m.nccl_decided;
  impl->nccl_for_p2p = m.nccl_decided;  // known to every rank of the split alike
  impl->gpu_somewhere = m.gpu_somewhere;
  impl->make_shm_now();  // every rank of the split is here
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
bool Communicator::wraps_caller() const noexcept { return impl_->owned.is_null(); }

}  // namespace shardkit
