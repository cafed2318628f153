// The NCCL calls shardkit makes, on the simulated GPU (this file: communicators; nccl_ops.cpp: operations): every communication is an MPI operation on a private
// communicator, issued by the worker of the stream it was enqueued on, so it is ordered with the kernels and copies
// of that stream exactly as an NCCL kernel is. Reductions gather the inputs and reduce them in rank order.
// Bootstrap: the unique id names the world rank that made it; the other ranks report to it over MPI_COMM_WORLD on a
// reserved tag (the role of NCCL's own socket bootstrap), then MPI_Comm_create_group makes the communicator.
// Misuse that real NCCL answers with a crash or a hang is fatal here: any call on a communicator after
// ncclCommAbort or ncclCommDestroy, and two ranks of one communicator on the same GPU of one host.
// Creation with a non-blocking config (ncclConfig_t::blocking = 0) bootstraps on a thread and reports ncclInProgress
// through ncclCommGetAsyncError until done; so does ncclCommFinalize on such a communicator until every operation
// issued on it has completed (ncclCommDestroy without it waits for them, as NCCL's does). SHARDKIT_SIM_NCCL_INIT_STALL_RANK=<world rank> makes that rank's bootstrap
// never start (a lost peer, a blocked network), so that creation without a deadline hangs as it would on a cluster.
// On a non-blocking communicator every enqueueing call returns ncclInProgress, and the next call before
// ncclCommGetAsyncError stops reporting it is fatal, as NCCL requires (SHARDKIT_SIM_NCCL_ENQUEUE_STALL=1: it never
// stops, so that a wait without a deadline hangs). Buffers must be memory of the communicator's device. Ranks that share two
// communicators must launch their operations in the same order (nccl_order.cpp).

#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl_internal.hpp"
#include "sim_internal.hpp"

namespace shardkit::sim {
namespace {

thread_local std::string last_error;

}  // namespace

ncclResult_t nccl_error(ncclResult_t r, std::string what) {
  last_error = std::move(what);
  return r;
}

void check_live(ncclComm_t c, const char* call) {
  if (!c) fatal(std::string(call) + " on a null NCCL communicator");
  if (c->dead)
    fatal(std::string(call) + " on an NCCL communicator after ncclCommAbort or ncclCommDestroy (abort once, then never "
                              "touch the handle)");
}

int enqueue_polls() {
  static const int polls = [] {
    const char* v = std::getenv("SHARDKIT_SIM_NCCL_ENQUEUE_STALL");
    return v && std::atoi(v) != 0 ? std::numeric_limits<int>::max() : 3;
  }();
  return polls;
}

}  // namespace shardkit::sim

using namespace shardkit::sim;

namespace {

// ---- host and device identity (duplicate-GPU detection) -----------------------------------------------------------
struct Identity {
  char host[64];
  int device;
};
Identity identity(int device) {
  Identity id{};
  gethostname(id.host, sizeof id.host - 1);
  id.device = device;
  return id;
}

// Collective over `comm`: fails, on every rank alike, when two ranks use one GPU of one host (NCCL: "Duplicate GPU").
ncclResult_t check_distinct_devices(MPI_Comm comm, int device) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<Identity> all(static_cast<std::size_t>(size));
  Identity me = identity(device);
  MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, comm);
  for (int i = 0; i < size; ++i)
    for (int j = 0; j < i; ++j)
      if (all[i].device == all[j].device && std::strcmp(all[i].host, all[j].host) == 0)
        return nccl_error(ncclInvalidUsage, "Duplicate GPU detected : rank " + std::to_string(i) + " and rank " +
                                           std::to_string(j) + " both on CUDA device " + std::to_string(all[i].device) +
                                           " of host " + all[i].host);
  return ncclSuccess;
}

// Every communicator ever made: never freed, so that a stale handle stays recognisable as dead (and reachable, so
// LeakSanitizer does not count it).
ncclComm_t new_comm() {
  static std::mutex mu;
  static auto* all = new std::vector<ncclComm_t>();
  std::lock_guard lock(mu);
  all->push_back(new ncclComm());
  return all->back();
}

ncclComm_t make_comm(MPI_Comm data, int device, std::uint64_t uid) {
  ncclComm_t c = new_comm();
  c->data = data;
  MPI_Comm_dup(data, &c->ctrl);
  MPI_Comm_rank(data, &c->rank);
  MPI_Comm_size(data, &c->size);
  c->device = device;
  c->uid = uid;
  // The members' world ranks, for the launch-order check.
  MPI_Group g, world;
  MPI_Comm_group(data, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> mine(static_cast<std::size_t>(c->size));
  for (int i = 0; i < c->size; ++i) mine[i] = i;
  c->world.resize(mine.size());
  MPI_Group_translate_ranks(g, c->size, mine.data(), world, c->world.data());
  MPI_Group_free(&g);
  MPI_Group_free(&world);
  return c;
}

// A child's id, the same on every member that asks for this color in this split of `parent`.
std::uint64_t split_uid(ncclComm_t parent, int color) {
  std::uint64_t z = parent->uid ^ (static_cast<std::uint64_t>(++parent->splits) << 40) ^
                    static_cast<std::uint64_t>(static_cast<std::uint32_t>(color));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;  // splitmix64's finaliser
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct IdLayout {
  std::uint64_t magic;
  int world_rank;
  std::uint32_t counter;
};
constexpr std::uint64_t kMagic = 0x5348524453494d31ULL;  // "SHRDSIM1"

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<std::uint32_t> counter{0};
  std::memset(id, 0, sizeof *id);
  IdLayout l{kMagic, 0, counter.fetch_add(1)};
  MPI_Comm_rank(MPI_COMM_WORLD, &l.world_rank);
  std::memcpy(id->internal, &l, sizeof l);
  return ncclSuccess;
}

namespace {
ncclResult_t init_rank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, int device);

bool stalled_here() {
  const char* v = std::getenv("SHARDKIT_SIM_NCCL_INIT_STALL_RANK");
  if (!v || !*v) return false;
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  return std::atoi(v) == me;
}
}  // namespace

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  const int device = current_device();
  if (!config || config->blocking != 0) {
    if (stalled_here())
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // a blocking creation cannot give up
    const ncclResult_t r = init_rank(comm, nranks, id, rank, device);
    if (r == ncclSuccess) order_join(*comm);
    return r;
  }
  // Non-blocking: the handle exists at once, in progress until the bootstrap thread finishes.
  ncclComm_t c = new_comm();
  c->device = device;
  c->blocking = false;
  c->async_error = ncclInProgress;
  *comm = c;
  std::thread([c, nranks, id, rank, device] {
    if (stalled_here()) {
      while (!c->aborted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    ncclComm_t made = nullptr;
    const ncclResult_t r = init_rank(&made, nranks, id, rank, device);
    if (r == ncclSuccess) {
      c->data = made->data;
      c->ctrl = made->ctrl;
      c->rank = made->rank;
      c->size = made->size;
      c->uid = made->uid;
      c->world = made->world;
      order_join(c);
    }
    c->async_error = r;
  }).detach();
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

namespace {
ncclResult_t init_rank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, int device) {
  *comm = nullptr;
  int level = 0;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE)
    return nccl_error(ncclSystemError, "the simulated NCCL issues MPI calls from stream workers: it needs MPI_THREAD_MULTIPLE");
  IdLayout l;
  std::memcpy(&l, id.internal, sizeof l);
  if (l.magic != kMagic || nranks < 1 || rank < 0 || rank >= nranks)
    return nccl_error(ncclInvalidArgument, "ncclCommInitRank: bad unique id, rank or size");
  MPI_Comm data = MPI_COMM_NULL;
  if (nranks == 1) {
    MPI_Comm_dup(MPI_COMM_SELF, &data);
  } else {
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    const int tag = (flag ? *ub : 32767) - 1 - static_cast<int>(l.counter % 1024);
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    std::vector<int> world_ranks(static_cast<std::size_t>(nranks), -1);
    if (me == l.world_rank) {
      world_ranks[rank] = me;
      for (int i = 1; i < nranks; ++i) {
        int msg[2];
        MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        world_ranks[msg[0]] = msg[1];
      }
      for (int r = 0; r < nranks; ++r)
        if (world_ranks[r] != me) MPI_Send(world_ranks.data(), nranks, MPI_INT, world_ranks[r], tag, MPI_COMM_WORLD);
    } else {
      int msg[2] = {rank, me};
      MPI_Send(msg, 2, MPI_INT, l.world_rank, tag, MPI_COMM_WORLD);
      MPI_Recv(world_ranks.data(), nranks, MPI_INT, l.world_rank, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Group world_group, g;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, world_ranks.data(), &g);
    MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &data);
    MPI_Group_free(&g);
    MPI_Group_free(&world_group);
  }
  if (const ncclResult_t r = check_distinct_devices(data, device); r != ncclSuccess) {
    MPI_Comm_free(&data);
    return r;
  }
  *comm = make_comm(data, device, (static_cast<std::uint64_t>(l.world_rank) << 32) | l.counter);
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  check_live(comm, "ncclCommSplit");
  *newcomm = nullptr;
  const std::uint64_t uid = split_uid(comm, color);  // every member counts the split, also one left out of it
  MPI_Comm data = MPI_COMM_NULL;
  MPI_Comm_split(comm->ctrl, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &data);
  if (data == MPI_COMM_NULL) return ncclSuccess;
  if (const ncclResult_t r = check_distinct_devices(data, comm->device); r != ncclSuccess) {
    MPI_Comm_free(&data);
    return r;
  }
  *newcomm = make_comm(data, comm->device, uid);
  (*newcomm)->blocking = !config || config->blocking != 0;
  order_join(*newcomm);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  check_live(comm, "ncclCommFinalize");
  if (comm->finalized.exchange(true)) return nccl_error(ncclInvalidArgument, "ncclCommFinalize called twice");
  const auto quiet = [comm] {
    while (comm->pending > 0 && !comm->aborted) std::this_thread::sleep_for(std::chrono::microseconds(50));
  };
  if (comm->blocking) {
    quiet();
    return ncclSuccess;
  }
  comm->async_error = ncclInProgress;
  std::thread([comm, quiet] {  // communicators are never freed (new_comm): the thread may outlive the handle
    quiet();
    int expected = ncclInProgress;
    comm->async_error.compare_exchange_strong(expected, ncclSuccess);
  }).detach();
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  check_live(comm, "ncclCommDestroy");
  if (comm->finalized && comm->async_error == ncclInProgress)
    fatal("ncclCommDestroy before ncclCommFinalize completed (poll ncclCommGetAsyncError until ncclSuccess)");
  comm->dead = true;
  order_leave(comm);
  // Operations already enqueued still complete (they may need the peers), then the MPI side is released.
  while (comm->pending > 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm->data != MPI_COMM_NULL) {  // real NCCL does not depend on MPI: legal after MPI_Finalize
    MPI_Comm_free(&comm->data);
    MPI_Comm_free(&comm->ctrl);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  check_live(comm, "ncclCommAbort");  // also aborts a creation still in progress
  comm->aborted = true;  // workers waiting on this communicator give up
  comm->dead = true;
  order_leave(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  check_live(comm, "ncclCommGetAsyncError");
  *async = static_cast<ncclResult_t>(comm->async_error.load());
  if (*async == ncclSuccess && comm->enqueue_polls > 0) {
    if (comm->enqueue_polls != std::numeric_limits<int>::max()) --comm->enqueue_polls;  // max: stalled for good
    *async = ncclInProgress;
  }
  return ncclSuccess;
}
namespace {
// Calls other than ncclCommGetAsyncError and ncclCommAbort need a created communicator (as NCCL requires).
void check_created(ncclComm_t c, const char* call) {
  check_live(c, call);
  if (c->async_error == ncclInProgress)
    fatal(std::string(call) + " on an NCCL communicator whose non-blocking creation is still in progress");
}
}  // namespace

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  check_created(comm, "ncclCommUserRank");
  *rank = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  check_created(comm, "ncclCommCount");
  *count = comm->size;
  return ncclSuccess;
}

}  // extern "C"
