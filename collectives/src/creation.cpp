#include "creation.hpp"

#include <mpi.h>

#include <atomic>
#include <memory>

#include "checked.hpp"
#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {

void agree_to_create(MpiCommHandle over, const char* what, const std::string& name, std::uint64_t seq,
                     const CommOptions& o, AbortState& abort) {
  const OpContext ctx = OpContext::for_step(OpKind::kBarrier, what, name, o.timeout, seq);
  agree_within_operation(over, ctx, nullptr, o.check, abort);
}

void agree_within_operation(MpiCommHandle over, const OpContext& ctx, const char* what, bool check,
                            AbortState& abort) {
  if (check) {
    Signature s;
    s.seq = ctx.seq;
    s.op = kCreationOp;
    check_signatures(over, s, ctx, abort);
    return;
  }
  if (!ctx.has_deadline()) return;  // no deadline: the blocking calls that follow wait as long as it takes
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  SHARDKIT_MPI_CHECK(MPI_Ibarrier(to_mpi<MPI_Comm>(over), req.data()));
  if (!wait_all(req, nullptr, ctx.deadline))
    raise_unfinished(ctx, abort,
                     what ? concat("not every rank arrived at ", what) : std::string("not every rank arrived"));
}

MpiComm dup_within_timeout(MpiCommHandle parent, const char* what, const std::string& name, const CommOptions& o,
                           AbortState& abort) {
  const OpContext ctx = OpContext::for_step(OpKind::kBarrier, what, name, o.timeout);
  // MPI writes the new handle when the duplicate completes: never into this frame, which a timeout leaves.
  auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  SHARDKIT_MPI_CHECK(MPI_Comm_idup(to_mpi<MPI_Comm>(parent), dup.get(), req.data()));
  wait_or_raise(req, dup, ctx, abort, "a rank did not arrive (skipped it, is stuck, or was lost)");
  return MpiComm::adopt(::shardkit::from_mpi(*dup));
}

namespace {
std::atomic<std::int64_t> g_next_identity{0};  // no communicator of this process has an identity from here on
}  // namespace

std::int64_t agree_on_identity(MpiCommHandle over, const char* what, const std::string& name, const CommOptions& o,
                               AbortState& abort) {
  const OpContext ctx = OpContext::for_step(OpKind::kAllreduce, what, name, o.timeout);
  // Each rank offers a number no other communicator of its process has (reserved: two threads may make communicators
  // at once) with its world rank beside it; the largest pair is the identity. Two communicators of the same ranks get
  // different pairs: a pair is offered once by its rank.
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  struct Exchange {
    std::int64_t mine, agreed = 0;
  };
  auto x = std::make_shared<Exchange>(Exchange{g_next_identity.fetch_add(1) << 20 | world_rank});
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  SHARDKIT_MPI_CHECK(MPI_Iallreduce(&x->mine, &x->agreed, 1, MPI_INT64_T, MPI_MAX, to_mpi<MPI_Comm>(over), req.data()));
  wait_or_raise(req, x, ctx, abort, "not every rank arrived");
  // Past it for every later communicator of this process (another thread may have moved the counter further).
  const std::int64_t past = (x->agreed >> 20) + 1;
  std::int64_t next = g_next_identity.load();
  while (next < past && !g_next_identity.compare_exchange_weak(next, past)) {
  }
  return x->agreed;
}

}  // namespace shardkit::detail
