// The simulated NCCL's operations (communicators: nccl_comm.cpp): every communication is an MPI operation on the
// communicator's private MPI communicator, issued by the worker of the stream it was enqueued on, so it is ordered with
// the kernels and copies of that stream exactly as an NCCL kernel is. Reductions gather the inputs and reduce them in
// rank order. Grouped sends and receives of one stream progress together, as one fused NCCL kernel does. A rank sends
// to itself only within a group that receives from itself as much too (NCCL: "Trying to send to self without a
// matching recv", an invalid usage that ends the communicator).

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nccl_internal.hpp"
#include "reduce.hpp"
#include "sim_internal.hpp"

using namespace shardkit::sim;

bool shardkit::sim::wait_all(ncclComm_t c, std::vector<MPI_Request>& reqs) {
  for (long spin = 0;; ++spin) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (c->aborted) return false;
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

namespace {

// ---- enqueueing -------------------------------------------------------------------------------------------------
struct P2P {
  ncclComm_t comm;
  bool send;
  void* buf;
  int bytes;
  int peer;
};
using OpFn = std::function<bool(ncclComm_t)>;
struct Coll {
  ncclComm_t comm;
  const char* call;
  OpFn fn;
};
struct Group {
  int depth = 0;
  std::vector<std::pair<std::shared_ptr<Stream>, Coll>> colls;
  std::vector<std::pair<std::shared_ptr<Stream>, P2P>> p2p;
  std::vector<ncclComm_t> comms;  // the communicators the group enqueues on (in progress after ncclGroupEnd)
};
thread_local Group group;

// A call on a non-blocking communicator still enqueueing the previous one: NCCL requires polling
// ncclCommGetAsyncError until it is no longer ncclInProgress first.
void check_settled(ncclComm_t c, const char* call) {
  if (!c->blocking && c->enqueue_polls > 0)
    fatal(std::string(call) + " on a non-blocking NCCL communicator whose previous call is still in progress (poll "
                              "ncclCommGetAsyncError until it is not ncclInProgress)");
}

// What an enqueueing call returns: on a non-blocking communicator, ncclInProgress for a while.
ncclResult_t enqueued(ncclComm_t c) {
  if (group.depth > 0) {
    group.comms.push_back(c);
    return ncclSuccess;
  }
  if (c->blocking) return ncclSuccess;
  c->enqueue_polls = enqueue_polls();
  return ncclInProgress;
}

// Buffers must be memory of the communicator's device (NCCL: an illegal address or invalid argument).
ncclResult_t check_buffers(ncclComm_t c, const char* call, std::initializer_list<const void*> bufs) {
  for (const void* b : bufs) {
    Region r;
    if (!find_region(b, &r) || r.kind == MemKind::kPinned)
      return nccl_error(ncclInvalidArgument, std::string(call) + ": a buffer that is not device memory");
    if (r.kind == MemKind::kDevice && r.device != c->device)
      return nccl_error(ncclInvalidArgument, std::string(call) + ": a buffer of device " + std::to_string(r.device) +
                                                 " on a communicator of device " + std::to_string(c->device));
  }
  return ncclSuccess;
}

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

// A collective as its stream's worker runs it: the launch-order check first (a launch that moves nothing is no
// kernel: not counted, not checked), then the operation.
std::function<void()> launch(const Coll& op, const LaunchSnapshot& snap) {
  if (!op.fn) return wrap(op.comm, [](ncclComm_t) { return true; });
  order_count(op.comm);
  return wrap(op.comm, [snap, op](ncclComm_t cc) { return order_check_all(cc, op.call, snap) && op.fn(cc); });
}

ncclResult_t submit(ncclComm_t c, cudaStream_t s, const char* call, std::initializer_list<const void*> bufs, OpFn fn,
                    bool empty = false) {
  check_open(c, call);
  check_settled(c, call);
  if (empty) fn = nullptr;  // nothing to move (the count is the same on every rank)
  auto st = stream_of(s);
  if (st->device() != c->device)
    return nccl_error(ncclInvalidArgument, std::string(call) + ": stream of device " + std::to_string(st->device()) +
                                          " on a communicator of device " + std::to_string(c->device));
  if (!empty)
    if (const ncclResult_t r = check_buffers(c, call, bufs); r != ncclSuccess) return r;
  if (group.depth > 0)
    group.colls.emplace_back(st, Coll{c, call, std::move(fn)});
  else
    st->enqueue(launch(Coll{c, call, std::move(fn)}, order_snapshot(c)));
  return enqueued(c);
}

bool bytes_ok(std::size_t count, ncclDataType_t t, int* bytes) {
  const std::size_t b = count * nccl_type_size(t);
  if (nccl_type_size(t) == 0 || b > static_cast<std::size_t>(INT32_MAX)) return false;
  *bytes = static_cast<int>(b);
  return true;
}

// Sends and receives of one stream, progressing together as one fused NCCL kernel does. Each send carries the
// launch-order snapshot of its communicator ahead of its data; each receive compares it with its own.
void enqueue_p2p(const std::shared_ptr<Stream>& st, std::vector<P2P> ops) {
  std::vector<LaunchSnapshot> snaps;
  for (const P2P& op : ops) snaps.push_back(order_snapshot(op.comm));
  for (const P2P& op : ops) order_count(op.comm, op.peer, op.send);
  ncclComm_t first = ops.front().comm;
  st->enqueue(wrap(first, [ops = std::move(ops), snaps = std::move(snaps)](ncclComm_t cc) {
    const std::size_t n = ops.size();
    std::vector<MPI_Request> r(2 * n, MPI_REQUEST_NULL);
    for (std::size_t i = 0; i < n; ++i)
      if (ops[i].send) order_send(ops[i].comm, ops[i].peer, snaps[i], &r[n + i]);
    for (std::size_t i = 0; i < n; ++i)
      if (!ops[i].send && !order_check_from(ops[i].comm, "ncclRecv", ops[i].peer, snaps[i])) return false;
    for (std::size_t i = 0; i < n; ++i)
      if (!ops[i].send) MPI_Irecv(rw(ops[i].buf), ops[i].bytes, MPI_BYTE, ops[i].peer, 0, ops[i].comm->data, &r[i]);
    for (std::size_t i = 0; i < n; ++i)
      if (ops[i].send) MPI_Isend(rw(ops[i].buf), ops[i].bytes, MPI_BYTE, ops[i].peer, 0, ops[i].comm->data, &r[i]);
    return wait_all(cc, r);
  }));
}

// A communicator's sends to itself and receives from itself in one launch (a group, or one call) must pair up, the
// k-th send with the k-th receive, of the same size. Else the invalid usage, which also ends the communicator.
ncclResult_t check_self_pairs(const std::vector<P2P>& ops) {
  std::vector<ncclComm_t> comms;
  for (const P2P& op : ops)
    if (op.peer == op.comm->rank && std::find(comms.begin(), comms.end(), op.comm) == comms.end())
      comms.push_back(op.comm);
  for (ncclComm_t c : comms) {
    std::vector<int> sends, recvs;
    for (const P2P& op : ops)
      if (op.comm == c && op.peer == c->rank) (op.send ? sends : recvs).push_back(op.bytes);
    std::string why;
    if (sends.size() > recvs.size()) why = "Trying to send to self without a matching recv";
    if (sends.size() < recvs.size()) why = "Trying to recv from self without a matching send";
    for (std::size_t i = 0; why.empty() && i < sends.size(); ++i)
      if (sends[i] != recvs[i])
        why = "Trying to send " + std::to_string(sends[i]) + " bytes to self but receive " + std::to_string(recvs[i]);
    if (!why.empty()) {
      c->async_error = ncclInvalidUsage;
      return nccl_error(ncclInvalidUsage, why);
    }
  }
  return ncclSuccess;
}

ncclResult_t p2p(const void* buf, std::size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s,
                 bool send, const char* call) {
  check_open(c, call);
  check_settled(c, call);
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes)) return nccl_error(ncclInvalidArgument, std::string(call) + ": bad type or count");
  if (peer < 0 || peer >= c->size) return nccl_error(ncclInvalidArgument, std::string(call) + ": peer out of range");
  auto st = stream_of(s);
  if (st->device() != c->device) return nccl_error(ncclInvalidArgument, std::string(call) + ": stream of another device");
  if (bytes > 0)
    if (const ncclResult_t r = check_buffers(c, call, {buf}); r != ncclSuccess) return r;
  P2P op{c, send, const_cast<void*>(buf), bytes, peer};
  if (group.depth > 0) {
    group.p2p.emplace_back(st, op);
    return enqueued(c);
  }
  if (peer == c->rank) return check_self_pairs({op});  // alone, a send to self or a receive from self is unpaired
  enqueue_p2p(st, {op});
  return enqueued(c);
}

}  // namespace

extern "C" {

ncclResult_t ncclGroupStart() {
  ++group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group.depth == 0) return nccl_error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group.depth > 0) return ncclSuccess;
  std::vector<P2P> all;
  for (const auto& [st, op] : group.p2p) all.push_back(op);
  if (const ncclResult_t r = check_self_pairs(all); r != ncclSuccess) {  // nothing of the group is launched
    group.colls.clear();
    group.p2p.clear();
    group.comms.clear();
    return r;
  }
  // What every grouped operation follows is what was launched before the group: the group launches as one.
  std::vector<LaunchSnapshot> snaps;
  for (auto& [st, op] : group.colls) snaps.push_back(order_snapshot(op.comm));
  for (std::size_t i = 0; i < group.colls.size(); ++i)
    group.colls[i].first->enqueue(launch(group.colls[i].second, snaps[i]));
  group.colls.clear();
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
    enqueue_p2p(st, std::move(ops));
  }
  ncclResult_t result = ncclSuccess;
  for (ncclComm_t c : group.comms)
    if (enqueued(c) == ncclInProgress) result = ncclInProgress;
  group.comms.clear();
  return result;
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
  if (!bytes_ok(count, t, &bytes)) return nccl_error(ncclInvalidArgument, "ncclBroadcast: bad type or count");
  return submit(c, s, "ncclBroadcast", {recv}, [=](ncclComm_t cc) {
    if (cc->rank == root && send != recv) std::memmove(rw(recv), rw(send), static_cast<std::size_t>(bytes));
    std::vector<MPI_Request> r(1);
    MPI_Ibcast(rw(recv), bytes, MPI_BYTE, root, cc->data, &r[0]);
    return wait_all(cc, r);
  }, bytes == 0);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes)) return nccl_error(ncclInvalidArgument, "ncclAllGather: bad type or count");
  return submit(c, s, "ncclAllGather", {send, recv}, [=](ncclComm_t cc) {
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
  if (!bytes_ok(count, t, &bytes) || !valid_op(op)) return nccl_error(ncclInvalidArgument, "ncclAllReduce: bad arguments");
  return submit(c, s, "ncclAllReduce", {send, recv},
                [=](ncclComm_t cc) { return gather_reduce(cc, send, recv, count, t, op, bytes); }, bytes == 0);
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(count, t, &bytes) || !valid_op(op)) return nccl_error(ncclInvalidArgument, "ncclReduce: bad arguments");
  return submit(c, s, "ncclReduce", {send}, [=](ncclComm_t cc) {
    return gather_reduce(cc, send, cc->rank == root ? recv : nullptr, count, t, op, bytes);
  }, bytes == 0);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s) {
  int bytes = 0;
  if (!bytes_ok(recvcount, t, &bytes) || !valid_op(op))
    return nccl_error(ncclInvalidArgument, "ncclReduceScatter: bad arguments");
  return submit(c, s, "ncclReduceScatter", {send, recv}, [=](ncclComm_t cc) {
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
