// A Communicator's life: construction over a duplicate, a split or a caller's MPI communicator, the control
// communicator (collective, made on first need), its transports (transport.hpp: made with it, split with its parent,
// or decided on first need), and its accessors. Operations run through the pipeline in pipeline.cpp.

#include "shardkit/collectives/communicator.hpp"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "communicator_impl.hpp"
#include "creation.hpp"
#include "op_table.hpp"
#include "shardkit/core/error.hpp"
#include "transport.hpp"
#include "watchdog.hpp"

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

void CommunicatorImpl::make_transports(bool collectively) {
  const auto all = transports();
  slots.resize(all.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]->make_with_communicator && (collectively || all[i]->always))
      all[i]->make_with_communicator(*this, slots[i]);
}

bool CommunicatorImpl::some_rank_has_gpu() {
  if (!gpu_known) {
    int has_gpu = device >= 0 ? 1 : 0;
    SHARDKIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &has_gpu, 1, MPI_INT, MPI_MAX, to_mpi<MPI_Comm>(control())));
    learn_gpu(has_gpu != 0);
  }
  return gpu_somewhere;
}

const TransportSlot* CommunicatorImpl::slot_of(BackendKind kind) const noexcept {
  const std::size_t i = transport_index(kind);
  return i < slots.size() ? &slots[i] : nullptr;
}

void CommunicatorImpl::ensure_usable() const {
  if (abort->aborted)
    throw BackendError("shardkit", 0,
                       concat("communicator '", options.name, "' was aborted (", abort->reason,
                              "); create a new one after the failure is resolved"));
}

namespace {

// A communicator over `data`: owned (a duplicate or split made for it) or borrowed from the caller; its transports are
// made by the caller (make_transports, or a split's). `abort`: shared with backends made before it (a split's), or new.
std::unique_ptr<CommunicatorImpl> build(MpiComm owned, MpiCommHandle borrowed, CommOptions options, int device,
                                        std::shared_ptr<AbortState> abort = nullptr) {
  auto m = std::make_unique<CommunicatorImpl>();
  m->options = std::move(options);
  if (abort) m->abort = std::move(abort);
  m->owned = std::move(owned);
  m->data = m->owned.is_null() ? borrowed : m->owned.handle();
  MPI_Comm c = to_mpi<MPI_Comm>(m->data);
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &m->rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &m->size));
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
    m->recorder = FlightRecorder::make(m->options.name, m->rank, m->size, std::move(world), m->options.trace_buffer);
  }
  if (!m->owned.is_null()) m->control();  // owned communicators are made collectively anyway: set up now
  return m;
}

// The transports in use, for SHARDKIT_VERBOSE: "mpi+nccl", in the registry's order (the fallback first).
std::string made_transports(const CommunicatorImpl& m) {
  std::string s;
  const auto all = transports();
  for (std::size_t i = 0; i < m.slots.size(); ++i)
    if (m.slots[i].backend) s += concat(s.empty() ? "" : "+", all[i]->name);
  return s;
}

void announce(const CommunicatorImpl& m) {
  if (m.options.verbose && m.rank == 0)
    std::fprintf(stderr, "shardkit: communicator '%s': %d ranks, backends %s\n", m.options.name.c_str(), m.size,
                 made_transports(m).c_str());
}

// The GPU a job's rank computes on (-1: none, or no job known).
int gpu_of(const JobInfo* job) {
  if (!job || job->device.kind != DeviceKind::kCUDA) return -1;
  return job->device.index;
}

int runtime_device() { return gpu_of(JobInfo::current()); }

}  // namespace
}  // namespace detail

// ---- construction ---------------------------------------------------------------------------------------------------

Communicator::Communicator(std::unique_ptr<detail::CommunicatorImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::shared_ptr<Communicator> Communicator::world(const JobInfo& job, CommOptions options,
                                                 std::string_view first_op) {
  // The job's world duplicate (the Runtime's) is shardkit's own: in checked mode the ranks first agree on it, which
  // names the ranks that do not arrive. Every rank makes its world communicators in the same order (the sequence
  // number).
  static std::uint64_t creations = 0;
  // Messages read "<step> of communicator 'world'": "creation of ...", or "allreduce, the first collective of ...".
  const std::string step = first_op.empty() ? "creation" : detail::concat(first_op, ", the first collective");
  detail::AbortState abort;
  detail::agree_to_create(job.world, step.c_str(), options.name, creations++, options, abort);
  MpiComm dup = detail::dup_within_timeout(job.world, step.c_str(), options.name, options, abort);
  auto impl = detail::build(std::move(dup), 0, std::move(options), detail::gpu_of(&job));
  impl->make_transports(true);
  detail::announce(*impl);
  detail::start_watchdog(impl->control(), impl->options.name, impl->options, *impl->abort);
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::world(CommOptions options) {
  const JobInfo* job = JobInfo::current();
  SHARDKIT_CHECK(job != nullptr, "no shardkit Runtime: create one (shardkit::Runtime rt(&argc, &argv);)");
  return world(*job, std::move(options));
}

std::shared_ptr<Communicator> Communicator::from_mpi(MpiCommHandle comm, CommOptions options) {
  SHARDKIT_CHECK(comm != ::shardkit::from_mpi(MPI_COMM_NULL), "from_mpi: MPI_COMM_NULL");
  detail::AbortState abort;
  MpiComm dup = detail::dup_within_timeout(comm, "creation", options.name, options, abort);
  auto impl = detail::build(std::move(dup), 0, std::move(options), detail::runtime_device());
  impl->make_transports(true);
  detail::announce(*impl);
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::wrap_mpi(MpiCommHandle comm, CommOptions options) {
  SHARDKIT_CHECK(comm != ::shardkit::from_mpi(MPI_COMM_NULL), "wrap_mpi: MPI_COMM_NULL");
  auto impl = detail::build(MpiComm(), comm, std::move(options), detail::runtime_device());
  impl->make_transports(false);
  detail::announce(*impl);
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  auto& m = *impl_;
  m.ensure_usable();
  CommOptions opts = m.options;
  opts.name = name.empty() ? detail::concat(m.options.name, "/split(", color, ")") : std::move(name);
  // MPI_Comm_split has no nonblocking form: agree first (under the timeout) that every rank is here.
  detail::agree_to_create(m.control(), "a split", m.options.name, m.seq++, m.options, *m.abort);
  MpiComm sub = MpiComm::split(m.data, color, key);
  // Transports that split with their parent (collective over it, so before a part without this rank returns) pass
  // their slots on; the part makes the others itself (every rank of the part is here).
  auto abort = std::make_shared<detail::AbortState>();
  const auto all = detail::transports();
  std::vector<detail::TransportSlot> parts(all.size());
  const detail::TransportSlot undecided;  // the parent's, for a transport registered after it was made
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]->split) all[i]->split(m, i < m.slots.size() ? m.slots[i] : undecided, color, key, abort, parts[i]);
  if (color < 0) return nullptr;
  auto impl = detail::build(std::move(sub), 0, std::move(opts), m.device, std::move(abort));
  impl->gpu_known = m.gpu_known;
  impl->gpu_somewhere = m.gpu_somewhere;
  impl->slots.resize(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i]->split) {
      impl->slots[i] = std::move(parts[i]);
    } else if (all[i]->make_with_communicator) {
      all[i]->make_with_communicator(*impl, impl->slots[i]);
    }
  }
  detail::announce(*impl);
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
bool Communicator::has_nccl() const noexcept {
  const detail::TransportSlot* nccl = impl_->slot_of(BackendKind::kNccl);
  return nccl && nccl->backend != nullptr;
}
bool Communicator::aborted() const noexcept { return impl_->abort->aborted; }
std::uint64_t Communicator::sequence() const noexcept { return impl_->seq; }
MpiCommHandle Communicator::mpi_handle() const noexcept { return impl_->data; }
bool Communicator::wraps_caller() const noexcept { return impl_->owned.is_null(); }

}  // namespace shardkit
