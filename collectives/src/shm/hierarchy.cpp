#include "shm/hierarchy.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <functional>
#include <vector>

#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

class HierBackend final : public Backend {
 public:
  struct Layout {
    int rank = 0;
    int node = 0;                // this rank's node: its leader's rank among the leaders
    std::vector<int> node_of;    // per communicator rank
    std::vector<int> local_of;   // per communicator rank: its rank on its node (0: the leader)
    std::vector<int> members;    // the communicator's ranks node by node, each node's in its local order
    std::vector<int> first;      // per node, and one past the last: where its ranks start in `members`

    // Fills members and first from node_of and local_of.
    void order_by_node() {
      const int n_nodes = 1 + *std::max_element(node_of.begin(), node_of.end());
      first.assign(n_nodes + 1, 0);
      for (int j : node_of) ++first[j + 1];
      for (int j = 0; j < n_nodes; ++j) first[j + 1] += first[j];
      members.assign(node_of.size(), 0);
      for (int r = 0; r < static_cast<int>(node_of.size()); ++r) members[first[node_of[r]] + local_of[r]] = r;
    }
  };

  HierBackend(MpiComm node, MpiComm leaders, std::unique_ptr<Backend> shm, std::unique_ptr<Backend> on_node,
              std::unique_ptr<Backend> across, Layout layout, std::shared_ptr<AbortState> abort)
      : node_comm_(std::move(node)),
        leader_comm_(std::move(leaders)),
        shm_(std::move(shm)),
        on_node_(std::move(on_node)),
        across_(std::move(across)),
        at_(std::move(layout)),
        abort_(std::move(abort)) {}

  BackendKind kind() const noexcept override { return BackendKind::kShm; }

  void abort() noexcept override {
    abort_->aborted = true;
    for (Backend* b : {shm_.get(), on_node_.get(), across_.get()})
      if (b) b->abort();
  }

  Token run(const BackendCall& c, const OpContext& ctx) override {
    switch (c.op) {
      case OpKind::kAllreduce: allreduce(c, ctx); break;
      case OpKind::kReduce: reduce(c, ctx); break;
      case OpKind::kBcast: bcast(c, ctx); break;
      case OpKind::kBarrier: barrier(c, ctx); break;
      default: SHARDKIT_ASSERT(false, "the hierarchical shm backend does not implement ", op_name(c.op));
    }
    return Token();
  }

 private:
  bool leader() const noexcept { return at_.local_of[at_.rank] == 0; }

  void allreduce(const BackendCall& c, const OpContext& ctx) {
    Array& out = *c.recv;
    OpArgs a = *c.args;
    a.root = 0;
    on_shm(OpKind::kReduce, c.send, leader() ? &out : nullptr, a, ctx);
    if (leader()) on(*across_, OpKind::kAllreduce, &out, &out, a, ctx);
    on_shm(OpKind::kBcast, nullptr, &out, a, ctx);
  }

  void reduce(const BackendCall& c, const OpContext& ctx) {
    const int root = c.args->root, root_node = at_.node_of[root], root_local = at_.local_of[root];
    const bool me_root = at_.rank == root;
    OpArgs a = *c.args;
    a.root = 0;
    // This node's partial result, on its leader: the root's own buffer where the root leads.
    Array scratch;
    Array* partial = nullptr;
    if (leader()) {
      if (me_root) {
        partial = c.recv;
      } else {
        scratch = Array::empty(c.send->shape(), c.send->dtype());
        partial = &scratch;
      }
    }
    on_shm(OpKind::kReduce, c.send, partial, a, ctx);
    if (leader()) {
      a.root = root_node;
      on(*across_, OpKind::kReduce, partial, at_.node == root_node ? partial : nullptr, a, ctx);
    }
    if (root_local == 0 || at_.node != root_node) return;
    if (leader()) {
      a.dest = root_local;
      a.send_tag = 0;
      on(*on_node_, OpKind::kSend, partial, nullptr, a, ctx);
    } else if (me_root) {
      a.source = 0;
      a.recv_tag = 0;
      a.status = nullptr;
      on(*on_node_, OpKind::kRecv, nullptr, c.recv, a, ctx);
    }
  }

  void bcast(const BackendCall& c, const OpContext& ctx) {
    Array* buf = c.send ? const_cast<Array*>(c.send) : c.recv;
    const int root = c.args->root, root_node = at_.node_of[root], root_local = at_.local_of[root];
    OpArgs a = *c.args;
    const bool on_root_node = at_.node == root_node;
    if (on_root_node && root_local != 0) {  // first to the root's leader (and its whole node)
      a.root = root_local;
      on_shm(OpKind::kBcast, nullptr, buf, a, ctx);
    }
    if (leader()) {
      a.root = root_node;
      on(*across_, OpKind::kBcast, nullptr, buf, a, ctx);
    }
    if (!on_root_node || root_local == 0) {
      a.root = 0;
      on_shm(OpKind::kBcast, nullptr, buf, a, ctx);
    }
  }

  // Nobody leaves before every node's leader has seen its whole node arrive.
  void barrier(const BackendCall& c, const OpContext& ctx) {
    on_shm(OpKind::kBarrier, nullptr, nullptr, *c.args, ctx);
    if (leader()) on(*across_, OpKind::kBarrier, nullptr, nullptr, *c.args, ctx);
    on_shm(OpKind::kBarrier, nullptr, nullptr, *c.args, ctx);
  }

  void on_shm(OpKind op, const Array* send, Array* recv, const OpArgs& a, const OpContext& ctx) {
    on(*shm_, op, send, recv, a, ctx);
  }

  // One step on a sub-backend, completed before the next (the steps are synchronous, as the shm backend's are).
  static void on(Backend& b, OpKind op, const Array* send, Array* recv, const OpArgs& a, const OpContext& ctx) {
    BackendCall step{op, send, recv, &a};
    b.run(step, ctx).wait();
  }

  MpiComm node_comm_, leader_comm_;  // outlive the backends over them (declared first, destroyed last)
  std::unique_ptr<Backend> shm_;      // the node's shm backend
  std::unique_ptr<Backend> on_node_;  // MPI on the node (a reduce's result to a root that does not lead its node)
  std::unique_ptr<Backend> across_;   // MPI among the leaders (leaders only)
  Layout at_;
  std::shared_ptr<AbortState> abort_;
};

std::function<MpiCommHandle()> itself(MpiCommHandle c) {
  return [c] { return c; };
}

}  // namespace

bool hier_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept {
  switch (op) {
    case OpKind::kAllreduce:
    case OpKind::kReduce: return reduce_op_supports(reduce, dtype);
    case OpKind::kBcast:
    case OpKind::kBarrier: return true;
    default: return false;
  }
}

std::unique_ptr<Backend> make_hier_backend(MpiCommHandle comm, std::shared_ptr<AbortState> abort_state,
                                           std::int64_t max_count, bool* spans_nodes, std::string* why) {
  MPI_Comm c = to_mpi<MPI_Comm>(comm);
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size));
  MPI_Comm split = MPI_COMM_NULL;
  SHARDKIT_MPI_CHECK(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &split));
  MpiComm node = MpiComm::adopt(from_mpi(split));
  int one_node = node.size() == size ? 1 : 0, all = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&one_node, &all, 1, MPI_INT, MPI_MIN, c));
  *spans_nodes = all == 0;
  if (all) return nullptr;

  // The leaders (each node's lowest rank, ordered by it) and every rank's (node, rank on its node).
  MpiComm leaders = MpiComm::split(comm, node.rank() == 0 ? 0 : -1, rank);
  HierBackend::Layout at;
  at.rank = rank;
  at.node = leaders.rank();
  SHARDKIT_MPI_CHECK(MPI_Bcast(&at.node, 1, MPI_INT, 0, to_mpi<MPI_Comm>(node.handle())));
  const std::array<int, 2> mine{at.node, node.rank()};
  std::vector<int> every(2 * static_cast<std::size_t>(size));
  SHARDKIT_MPI_CHECK(MPI_Allgather(mine.data(), 2, MPI_INT, every.data(), 2, MPI_INT, c));
  for (int r = 0; r < size; ++r) {
    at.node_of.push_back(every[2 * r]);
    at.local_of.push_back(every[2 * r + 1]);
  }
  at.order_by_node();

  // Every node's segment, or none: a node without one would leave the others waiting for its steps. Its messages name
  // the node's ranks by their ranks in `comm`.
  const auto on_this_node = at.members.begin() + at.first[at.node];
  std::unique_ptr<Backend> shm = make_shm_backend(node.handle(), abort_state, why,
                                                  std::vector<int>(on_this_node, on_this_node + node.size()));
  int made = shm ? 1 : 0, everywhere = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&made, &everywhere, 1, MPI_INT, MPI_MIN, c));
  if (!everywhere) {
    if (why && made) *why = "another node's shared-memory segment could not be made";
    return nullptr;
  }
  std::unique_ptr<Backend> on_node = make_mpi_backend(node.handle(), itself(node.handle()), abort_state, max_count);
  std::unique_ptr<Backend> across;
  if (!leaders.is_null())
    across = make_mpi_backend(leaders.handle(), itself(leaders.handle()), abort_state, max_count);
  return std::make_unique<HierBackend>(std::move(node), std::move(leaders), std::move(shm), std::move(on_node),
                                       std::move(across), std::move(at), std::move(abort_state));
}

}  // namespace shardkit::detail
