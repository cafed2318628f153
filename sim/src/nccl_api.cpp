// The NCCL calls shardkit makes, on the simulated GPU: every communication is an MPI operation on a private
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

#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "reduce.hpp"
#include "sim_internal.hpp"

using namespace shardkit::sim;

struct ncclComm {
  MPI_Comm data = MPI_COMM_NULL;  // operations (issued by stream workers)
  MPI_Comm ctrl = MPI_COMM_NULL;  // splits (issued by the calling thread)
  int rank = 0, size = 1, device = 0;
  std::atomic<bool> aborted{false};
  std::atomic<bool> dead{false};
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<int> pending{0};
  bool blocking = true;                 // created with ncclConfig_t::blocking != 0 (or no config)
  std::atomic<bool> finalized{false};  // ncclCommFinalize called: no more operations
};

namespace {

thread_local std::string last_error;

ncclResult_t error(ncclResult_t r, std::string what) {
  last_error = std::move(what);
  return r;
}

void check_live(ncclComm_t c, const char* call) {
  if (!c) fatal(std::string(call) + " on a null NCCL communicator");
  if (c->dead)
    fatal(std::string(call) + " on an NCCL communicator after ncclCommAbort or ncclCommDestroy (abort once, then never "
                              "touch the handle)");
}

// Waits for MPI requests on a worker; gives up (false) when the communicator is aborted, as an aborted NCCL kernel does.
bool wait_all(ncclComm_t c, std::vector<MPI_Request>& reqs) {
  for (long spin = 0;; ++spin) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (c->aborted) return false;
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

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
        return error(ncclInvalidUsage, "Duplicate GPU detected : rank " + std::to_string(i) + " and rank " +
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

ncclComm_t make_comm(MPI_Comm data, int device) {
  ncclComm_t c = new_comm();
  c->data = data;
  MPI_Comm_dup(data, &c->ctrl);
  MPI_Comm_rank(data, &c->rank);
  MPI_Comm_size(data, &c->size);
  c->device = device;
  return c;
}

struct IdLayout {
  std::uint64_t magic;
  int world_rank;
  std::uint32_t counter;
};
constexpr std::uint64_t kMagic = 0x5348524453494d31ULL;  // "SHRDSIM1"

// ---- enqueueing -------------------------------------------------------------------------------------------------
struct P2P {
  ncclComm_t comm;
  bool send;
  void* buf;
  int bytes;
  int peer;
};
struct Group {
  int depth = 0;
  std::vector<std::pair<std::shared_ptr<Stream>, std::function<void()>>> colls;
  std::vector<std::pair<std::shared_ptr<Stream>, P2P>> p2p;
};
thread_local Group group;

using OpFn = std::function<bool(ncclComm_t)>;

std::function<void()> wrap(ncclComm_t c, OpFn fn) {
  c->pending++;
  return [c, fn = std::move(fn)] {
    if (!c->aborted && !fn(c) && !c->aborted) c->async_error = ncclSystemError;
    c->pending--;
  };
}

void check_open(ncclComm_t c, const char* call) {
  check_live(c, call);
  if (c->finalized) fatal(std::string(call) + " on an NCCL communicator after ncclCommFinalize");
}

ncclResult_t submit(ncclComm_t c, cudaStream_t s, const char* call, OpFn fn, bool empty = false) {
  check_open(c, call);
  if (empty) fn = [](ncclComm_t) { return true; };  // nothing to move (the count is the same on every rank)
  auto st = stream_of(s);
  if (st->device() != c->device)
    return error(ncclInvalidArgument, std::string(call) + ": stream of device " + std::to_string(st->device()) +
                                          " on a communicator of device " + std::to_string(c->device));
  if (group.depth > 0)
    group.colls.emplace_back(st, wrap(c, std::move(fn)));
  else
    st->enqueue(wrap(c, std::move(fn)));
  return ncclSuccess;
}

bool bytes_ok(std::size_t count, ncclDataType_t t, int* bytes) {
  const std::size_t b = count * nccl_type_size(t);
  if (nccl_type_size(t) == 0 || b > static_cast<std::size_t>(INT32_MAX)) return false;
  *bytes = static_cast<int>(b);
  return true;
}

ncclResult_t p2p(const void* buf, std::size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s,
                 bool send, const char* call) {
  check_open(c, call);
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes)) return error(ncclInvalidArgument, std::string(call) + ": bad type or count");
  if (peer < 0 || peer >= c->size) return error(ncclInvalidArgument, std::string(call) + ": peer out of range");
  auto st = stream_of(s);
  if (st->device() != c->device) return error(ncclInvalidArgument, std::string(call) + ": stream of another device");
  P2P op{c, send, const_cast<void*>(buf), bytes, peer};
  if (group.depth > 0) {
    group.p2p.emplace_back(st, op);
    return ncclSuccess;
  }
  st->enqueue(wrap(c, [op](ncclComm_t cc) {
    std::vector<MPI_Request> r(1);
    if (op.send)
      MPI_Isend(rw(op.buf), op.bytes, MPI_BYTE, op.peer, 0, cc->data, &r[0]);
    else
      MPI_Irecv(rw(op.buf), op.bytes, MPI_BYTE, op.peer, 0, cc->data, &r[0]);
    return wait_all(cc, r);
  }));
  return ncclSuccess;
}

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
    return init_rank(comm, nranks, id, rank, device);
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
    return error(ncclSystemError, "the simulated NCCL issues MPI calls from stream workers: it needs MPI_THREAD_MULTIPLE");
  IdLayout l;
  std::memcpy(&l, id.internal, sizeof l);
  if (l.magic != kMagic || nranks < 1 || rank < 0 || rank >= nranks)
    return error(ncclInvalidArgument, "ncclCommInitRank: bad unique id, rank or size");
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
  *comm = make_comm(data, device);
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  check_live(comm, "ncclCommSplit");
  *newcomm = nullptr;
  MPI_Comm data = MPI_COMM_NULL;
  MPI_Comm_split(comm->ctrl, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &data);
  if (data == MPI_COMM_NULL) return ncclSuccess;
  if (const ncclResult_t r = check_distinct_devices(data, comm->device); r != ncclSuccess) {
    MPI_Comm_free(&data);
    return r;
  }
  *newcomm = make_comm(data, comm->device);
  (*newcomm)->blocking = !config || config->blocking != 0;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  check_live(comm, "ncclCommFinalize");
  if (comm->finalized.exchange(true)) return error(ncclInvalidArgument, "ncclCommFinalize called twice");
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
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  check_live(comm, "ncclCommGetAsyncError");
  *async = static_cast<ncclResult_t>(comm->async_error.load());
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

ncclResult_t ncclGroupStart() {
  ++group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group.depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group.depth > 0) return ncclSuccess;
  for (auto& [st, fn] : group.colls) st->enqueue(std::move(fn));
  group.colls.clear();
  // The grouped sends and receives of one stream progress together, as one fused NCCL kernel does.
  while (!group.p2p.empty()) {
    auto st = group.p2p.front().first;
    std::vector<P2P> ops;
    for (auto it = group.p2p.begin(); it != group.p2p.end();) {
      if (it->first == st) {
        ops.push_back(it->second);
        it = group.p2p.erase(it);
      } else {
        ++it;
      }
    }
    ncclComm_t c = ops.front().comm;
    st->enqueue(wrap(c, [ops](ncclComm_t cc) {
      std::vector<MPI_Request> r(ops.size());
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (!ops[i].send) MPI_Irecv(rw(ops[i].buf), ops[i].bytes, MPI_BYTE, ops[i].peer, 0, ops[i].comm->data, &r[i]);
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (ops[i].send) MPI_Isend(rw(ops[i].buf), ops[i].bytes, MPI_BYTE, ops[i].peer, 0, ops[i].comm->data, &r[i]);
      return wait_all(cc, r);
    }));
  }
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  return p2p(buf, count, t, peer, c, s, true, "ncclSend");
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  return p2p(buf, count, t, peer, c, s, false, "ncclRecv");
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes)) return error(ncclInvalidArgument, "ncclBroadcast: bad type or count");
  return submit(c, s, "ncclBroadcast", [=](ncclComm_t cc) {
    if (cc->rank == root && send != recv) std::memmove(rw(recv), rw(send), static_cast<std::size_t>(bytes));
    std::vector<MPI_Request> r(1);
    MPI_Ibcast(rw(recv), bytes, MPI_BYTE, root, cc->data, &r[0]);
    return wait_all(cc, r);
  }, bytes == 0);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes)) return error(ncclInvalidArgument, "ncclAllGather: bad type or count");
  return submit(c, s, "ncclAllGather", [=](ncclComm_t cc) {
    std::vector<char> in(rw(send) ? static_cast<const char*>(rw(send)) : nullptr,
                         rw(send) ? static_cast<const char*>(rw(send)) + bytes : nullptr);
    std::vector<MPI_Request> r(1);
    MPI_Iallgather(in.data(), bytes, MPI_BYTE, rw(recv), bytes, MPI_BYTE, cc->data, &r[0]);
    return wait_all(cc, r);
  }, bytes == 0);
}

namespace {
// All ranks' `count`-element inputs, in rank order, reduced into out (on the worker).
bool gather_reduce(ncclComm_t cc, const void* send, void* out, std::size_t count, ncclDataType_t t, ncclRedOp_t op,
                   int bytes) {
  std::vector<char> all(static_cast<std::size_t>(bytes) * cc->size);
  std::vector<char> in(static_cast<const char*>(rw(send)), static_cast<const char*>(rw(send)) + bytes);
  std::vector<MPI_Request> r(1);
  MPI_Iallgather(in.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, cc->data, &r[0]);
  if (!wait_all(cc, r)) return false;
  std::vector<char> acc(all.begin(), all.begin() + bytes);
  for (int i = 1; i < cc->size; ++i) reduce_into(acc.data(), all.data() + static_cast<std::size_t>(i) * bytes, count, t, op);
  if (op == ncclAvg) divide(acc.data(), count, t, cc->size);
  if (out) std::memcpy(rw(out), acc.data(), acc.size());
  return true;
}
bool valid_op(ncclRedOp_t op) { return op == ncclSum || op == ncclProd || op == ncclMin || op == ncclMax || op == ncclAvg; }
}  // namespace

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes) || !valid_op(op)) return error(ncclInvalidArgument, "ncclAllReduce: bad arguments");
  return submit(c, s, "ncclAllReduce",
                [=](ncclComm_t cc) { return gather_reduce(cc, send, recv, count, t, op, bytes); }, bytes == 0);
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes) || !valid_op(op)) return error(ncclInvalidArgument, "ncclReduce: bad arguments");
  return submit(c, s, "ncclReduce", [=](ncclComm_t cc) {
    return gather_reduce(cc, send, cc->rank == root ? recv : nullptr, count, t, op, bytes);
  }, bytes == 0);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(recvcount, t, &bytes) || !valid_op(op))
    return error(ncclInvalidArgument, "ncclReduceScatter: bad arguments");
  return submit(c, s, "ncclReduceScatter", [=](ncclComm_t cc) {
    const std::size_t b = static_cast<std::size_t>(bytes), n = static_cast<std::size_t>(cc->size);
    std::vector<char> in(static_cast<const char*>(rw(send)), static_cast<const char*>(rw(send)) + b * n), parts(b * n);
    std::vector<MPI_Request> r(1);
    MPI_Ialltoall(in.data(), bytes, MPI_BYTE, parts.data(), bytes, MPI_BYTE, cc->data, &r[0]);
    if (!wait_all(cc, r)) return false;
    for (std::size_t i = 1; i < n; ++i) reduce_into(parts.data(), parts.data() + i * b, recvcount, t, op);
    if (op == ncclAvg) divide(parts.data(), recvcount, t, cc->size);
    std::memcpy(rw(recv), parts.data(), b);
    return true;
  }, bytes == 0);
}

}  // extern "C"
