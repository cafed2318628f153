#include "backends/shm/hierarchy.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <vector>

#include "backends/mpi/mpi_call.hpp"
#include "backends/mpi/mpi_request.hpp"
#include "backends/mpi/mpi_types.hpp"
#include "shardkit/core/error.hpp"
#include "backends/shm/shm_backend.hpp"
#include "backends/mpi/mpi_backend.hpp"
#include "backends/shm/shm_transport.hpp"

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
    bool in_order = false;       // members[k] == k: node by node is rank order

    int nodes() const noexcept { return static_cast<int>(first.size()) - 1; }
    int ranks_on(int j) const noexcept { return first[j + 1] - first[j]; }

    // Fills members and first from node_of and local_of.
    void order_by_node() {
      const int n_nodes = 1 + *std::max_element(node_of.begin(), node_of.end());
      first.assign(n_nodes + 1, 0);
      for (int j : node_of) ++first[j + 1];
      for (int j = 0; j < n_nodes; ++j) first[j + 1] += first[j];
      members.assign(node_of.size(), 0);
      in_order = true;
      for (int r = 0; r < static_cast<int>(node_of.size()); ++r) {
        const int k = first[node_of[r]] + local_of[r];
        members[k] = r;
        in_order = in_order && k == r;
      }
    }
  };

  HierBackend(MpiComm node, MpiComm leaders, std::unique_ptr<Backend> shm, std::unique_ptr<Backend> on_node,
              std::unique_ptr<Backend> across, Layout layout, std::shared_ptr<AbortState> abort,
              std::int64_t max_count)
      : node_comm_(std::move(node)),
        leader_comm_(std::move(leaders)),
        shm_(std::move(shm)),
        on_node_(std::move(on_node)),
        across_(std::move(across)),
        at_(std::move(layout)),
        abort_(std::move(abort)),
        max_count_(max_count) {}

  BackendKind kind() const noexcept override { return BackendKind::kShm; }
  std::uint32_t route_traits() const noexcept override { return kShmHierarchical; }

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
      case OpKind::kAllgather: allgather(c, ctx); break;
      case OpKind::kReduceScatter: reduce_scatter(c, ctx); break;
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

  // Blocks in communicator rank order (a node's ranks need not be contiguous in it): the node's blocks on every rank
  // of the node (the shm backend has no gather), every node's on the leaders (MPI allgatherv, node by node), put in
  // rank order by each leader, handed out by an shm bcast.
  void allgather(const BackendCall& c, const OpContext& ctx) {
    const Array& send = *c.send;
    Array& out = *c.recv;
    const std::int64_t n = send.numel();
    OpArgs a = *c.args;
    a.root = 0;
    Array node_blocks = Array::empty({at_.ranks_on(at_.node) * n}, send.dtype());
    on_shm(OpKind::kAllgather, &send, &node_blocks, a, ctx);
    if (leader()) {
      Array scratch;
      if (!at_.in_order) scratch = Array::empty(out.shape(), out.dtype());
      Array& by_node = at_.in_order ? out : scratch;
      std::vector<std::int64_t> counts, displs;
      for (int j = 0; j < at_.nodes(); ++j) {
        counts.push_back(at_.ranks_on(j) * n);
        displs.push_back(at_.first[j] * n);
      }
      a.recv_counts = counts;
      BackendCall step{OpKind::kAllgatherv, &node_blocks, &by_node, &a};
      step.recv_displs = displs;
      across_->run(step, ctx).wait();
      if (!at_.in_order) permute(by_node, out, send.nbytes(), /*to_rank_order=*/true);
    }
    on_shm(OpKind::kBcast, nullptr, &out, a, ctx);
  }

  // Block r of the result goes to rank r: the whole input reduced on each node's leader (shm), its blocks put node by
  // node, reduced across the leaders with each node's part scattered to its leader (MPI), handed out on the node by an
  // shm bcast of that part, of which each rank keeps its own block.
  void reduce_scatter(const BackendCall& c, const OpContext& ctx) {
    const Array& send = *c.send;
    Array& out = *c.recv;
    const std::int64_t n = out.numel();
    const std::size_t block = out.nbytes();
    OpArgs a = *c.args;
    a.root = 0;
    Array partial, node_part = Array::empty({at_.ranks_on(at_.node) * n}, out.dtype());
    if (leader()) partial = Array::empty({send.numel()}, send.dtype());
    on_shm(OpKind::kReduce, &send, leader() ? &partial : nullptr, a, ctx);
    if (leader()) {
      Array by_node = partial;
      if (!at_.in_order) {
        by_node = Array::empty({send.numel()}, send.dtype());
        permute(partial, by_node, block, /*to_rank_order=*/false);
      }
      reduce_scatter_across(by_node, node_part, n, a, ctx);
    }
    on_shm(OpKind::kBcast, nullptr, &node_part, a, ctx);
    if (block != 0)
      std::memcpy(out.data(), static_cast<const char*>(node_part.data()) + at_.local_of[at_.rank] * block, block);
  }

  // Among the leaders: node j gets the reduction of part j of `by_node` (its ranks' blocks, `n` elements each).
  void reduce_scatter_across(const Array& by_node, Array& node_part, std::int64_t n, const OpArgs& a,
                             const OpContext& ctx) {
    // The counts in an Array: a call left in flight by a timeout keeps them with its buffers (PendingOp::abandon).
    Array counts = Array::empty({at_.nodes()}, DType::kInt32);
    auto* count = static_cast<int*>(counts.data());
    bool fits = true;
    for (int j = 0; j < at_.nodes(); ++j) {
      fits = fits && at_.ranks_on(j) * n <= max_count_;
      count[j] = static_cast<int>(std::min<std::int64_t>(at_.ranks_on(j) * n, max_count_));
    }
    if (fits) {
      const MPI_Datatype t = mpi_datatype(by_node.dtype());
      const MPI_Op o = mpi_op(a.reduce, by_node.dtype());
      PendingOp p;
      const bool nb = ctx.has_deadline();  // polled against it (shm operations never return pending)
      if (nb) p.keep_alive = {by_node, node_part, counts};
      call_mpi<MPI_Reduce_scatter, MPI_Ireduce_scatter>(p, nb, static_cast<const void*>(by_node.data()),
                                                        node_part.data(), static_cast<const int*>(count), t, o,
                                                        to_mpi<MPI_Comm>(leader_comm_.handle()));
      if (nb) complete(p, ctx, *abort_);
      return;
    }
    // A part past one MPI call's count: each a reduction rooted at its node's leader (chunked by the MPI backend).
    OpArgs r = a;
    for (int j = 0; j < at_.nodes(); ++j) {
      const Array part = by_node.slice(0, at_.first[j] * n, at_.first[j + 1] * n);
      r.root = j;
      on(*across_, OpKind::kReduce, &part, j == at_.node ? &node_part : nullptr, r, ctx);
    }
  }

  // Blocks of `block` bytes between node by node (block k: rank members[k]'s) and rank order, either way.
  void permute(const Array& from, Array& to, std::size_t block, bool to_rank_order) const {
    if (block == 0) return;
    const auto* src = static_cast<const char*>(from.data());
    auto* dst = static_cast<char*>(to.data());
    for (std::size_t k = 0; k < at_.members.size(); ++k) {
      const std::size_t r = static_cast<std::size_t>(at_.members[k]);
      if (to_rank_order)
        std::memcpy(dst + r * block, src + k * block, block);
      else
        std::memcpy(dst + k * block, src + r * block, block);
    }
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
  std::int64_t max_count_;  // the most elements of one MPI call
};

std::function<MpiCommHandle()> itself(MpiCommHandle c) {
  return [c] { return c; };
}

}  // namespace

bool hier_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept {
  switch (op) {
    case OpKind::kAllreduce:
    case OpKind::kReduce:
    case OpKind::kReduceScatter: return reduce_op_supports(reduce, dtype);
    case OpKind::kBcast:
    case OpKind::kAllgather:
    case OpKind::kBarrier: return true;
    default: return false;
  }
}

std::unique_ptr<Backend> make_hier_backend(MpiCommHandle comm, std::shared_ptr<AbortState> abort_state,
                                           const CommOptions& options, bool* spans_nodes, std::string* why) {
  const std::int64_t max_count = options.max_message_elements;
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
  std::unique_ptr<Backend> shm = make_shm_backend(
      node.handle(), abort_state, why, std::vector<int>(on_this_node, on_this_node + node.size()), nullptr, options);
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
                                       std::move(across), std::move(at), std::move(abort_state), max_count);
}

}  // namespace shardkit::detail
