// The loopback transport (loopback_transport.hpp): a backend that copies, a descriptor, nothing else.

#include "loopback/loopback_transport.hpp"

#include <cstring>
#include <string_view>

#include "communicator_impl.hpp"

namespace shardkit::testing {
namespace {

std::atomic<std::int64_t> g_operations{0};

// With one rank, every collective it takes leaves the input in the output: a copy where they are two arrays.
class LoopbackBackend final : public detail::Backend {
 public:
  BackendKind kind() const noexcept override { return kLoopbackKind; }
  Token run(const detail::BackendCall& call, const detail::OpContext&) override {
    g_operations.fetch_add(1);
    if (call.send && call.recv && !call.in_place() && call.send->nbytes() != 0)
      std::memcpy(call.recv->data(), call.send->data(), call.send->nbytes());
    return Token();
  }
  void abort() noexcept override {}
};

bool takes(const detail::RouteRequest& r, const detail::TransportView& v) noexcept {
  if (!v.made || (r.placement != detail::Placement::kHost && r.placement != detail::Placement::kNone)) return false;
  switch (r.op) {
    case OpKind::kAllreduce:
    case OpKind::kReduce:
    case OpKind::kBcast:
    case OpKind::kAllgather:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kReduceScatter:
    case OpKind::kAlltoall:
    case OpKind::kScan:
    case OpKind::kBarrier: return true;
    default: return false;
  }
}

void make_with_communicator(detail::CommunicatorImpl& c, detail::TransportSlot& slot) {
  slot.decided = true;
  if (c.size != 1 || !std::string_view(c.options.name).starts_with("loopback:")) {
    slot.refusal = "not a communicator of one rank named loopback:...";
    return;
  }
  slot.backend = std::make_unique<LoopbackBackend>();
  slot.view.made = true;
}

}  // namespace

const detail::Transport& loopback_transport() noexcept {
  static const detail::Transport t{.kind = kLoopbackKind,
                                   .name = "loopback",
                                   .priority = 40,  // asked first: for its communicators nothing is cheaper
                                   .takes = takes,
                                   .make_with_communicator = make_with_communicator,
                                   .always = true};  // not collective: it asks nothing of other ranks
  return t;
}

std::int64_t loopback_operations() noexcept { return g_operations.load(); }

}  // namespace shardkit::testing
