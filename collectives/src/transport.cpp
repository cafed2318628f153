// The registry of transports and the router that loops over it (transport.hpp).

#include "transport.hpp"

#include <algorithm>
#include <vector>

#include "backends/mpi/mpi_transport.hpp"
#include "backends/nccl/nccl_transport.hpp"
#include "backends/shm/shm_transport.hpp"
#include "op_table.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

// The registry: one line per transport. A communicator makes them in this order (NCCL's decision before shm's: it
// learns whether some rank has a GPU, which shm's reads); routing asks them by priority.
// Never freed: the trace and the flight recorder's dumps name transports at exit, after static destruction began.
std::vector<const Transport*>& registry() {
  static auto* r = new std::vector<const Transport*>{
      &mpi_transport(),
      &nccl_transport(),
      &shm_transport(),
  };
  return *r;
}

// Places in the registry by falling priority (stable: equal priorities in registration order).
std::vector<std::size_t> by_priority() {
  const auto& r = registry();
  std::vector<std::size_t> order(r.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return r[a]->priority > r[b]->priority; });
  return order;
}

std::vector<std::size_t>& order() {
  static auto* o = new std::vector<std::size_t>(by_priority());  // never freed, as the registry
  return *o;
}

}  // namespace

bool RouteRequest::all_ranks_come() const noexcept {
  return op_spec(op).collective || (op == OpKind::kSendrecv && peers == Peers::kAllSendrecv);
}

std::span<const Transport* const> transports() noexcept { return registry(); }

std::span<const std::size_t> routing_order() noexcept { return order(); }

std::size_t transport_index(BackendKind kind) noexcept {
  const auto all = transports();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]->kind == kind) return i;
  return all.size();
}

const Transport* transport_of(BackendKind kind) noexcept {
  const std::size_t i = transport_index(kind);
  return i < transports().size() ? transports()[i] : nullptr;
}

const char* transport_name(BackendKind kind) noexcept {
  const Transport* t = transport_of(kind);
  return t ? t->name : backend_name(kind);
}

void register_transport(const Transport& t) {
  SHARDKIT_CHECK(transport_of(t.kind) == nullptr, "a transport recorded as ", static_cast<int>(t.kind),
                 " is registered already");
  registry().push_back(&t);
  order() = by_priority();
}

void raise_untaken(const RouteRequest& r) {
  throw Error(ErrorCode::kInternal, concat(op_name(r.op), ": no transport takes it (the last must take every one)"));
}

}  // namespace shardkit::detail
