#pragma once

// Transports as plug-ins. Each transport (src/backends/<name>/) registers one descriptor (Transport) in the registry
// (transport.cpp); a communicator holds one slot per registered transport (TransportSlot: its backend and its decision
// record), and routing and creation loop over the registry. Nothing outside a transport's folder names it: what
// differs between transports is in their descriptors.
//
// A transport comes to a communicator one of three ways: always (MPI, the fallback, made with every communicator);
// with the communicator, where it is made collectively (make_with_communicator: every rank is there, so point-to-point
// operations may use it from the first); or decided by the first operation every rank runs that it may take
// (decide, collective, under that operation's deadline).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::detail {

struct CommunicatorImpl;

/// Where the arrays an operation uses on this rank live.
enum class Placement {
  kNone,    ///< no arrays (barrier)
  kHost,    ///< all in host memory
  kDevice,  ///< all in GPU memory (device or managed), whatever their size
  kMixed,   ///< some of each
};

/// What the router knows of one operation on this rank: the same on every rank for the operations a decision may be
/// started by.
struct RouteRequest {
  OpKind op;
  BackendKind setting;  ///< CommOptions::backend
  Placement placement;
  DType dtype = DType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  /// Bytes of the operation's first array on this rank, a scatter's receive buffer (the same on every rank for the
  /// collectives).
  std::int64_t bytes = 0;
  /// A sendrecv's peers are both named (no wildcard source), and both this rank or neither.
  bool named_peers = true;
  /// And what the peers run (OpArgs::peers).
  Peers peers = Peers::kUnknown;
  /// The communicator returns pending tokens (CommOptions::async).
  bool async = false;

  bool point_to_point() const noexcept { return op == OpKind::kSend || op == OpKind::kRecv || op == OpKind::kSendrecv; }
  /// Whether every rank of the communicator runs this operation at once (a collective, or a sendrecv every rank runs):
  /// only such an operation may start a transport's decision, which is collective.
  bool all_ranks_come() const noexcept;
};

/// What routing reads of a transport on one communicator.
struct TransportView {
  bool made = false;  ///< agreed on and made: it can run operations
  bool p2p = false;   ///< it carries point-to-point operations (decided so when the communicator was made)
  /// Facts its own rules read, in its own terms (the shm transport: hierarchical, crowded); 0 for most.
  std::uint32_t traits = 0;
};

/// One transport's backend and decision record on one communicator.
struct TransportSlot {
  std::unique_ptr<Backend> backend;
  TransportView view;
  bool decided = false;  ///< the ranks agreed (made, or refused with `refusal`)
  std::string refusal;   ///< why the ranks have none, for messages
  Token last;            ///< its last operation: an operation on another transport waits for it first
};

/// A transport's descriptor. Functions left null are not part of its life.
struct Transport {
  BackendKind kind;  ///< what it records its operations as (OpRecord::backend), and the setting that forces it
  const char* name;
  /// Routing asks transports in falling priority (as Open MPI's components); the fallback (MPI) has the lowest.
  int priority = 0;
  /// Operations complete in the order they were issued, on the device: a pending one is the device's (no host thread
  /// waits for it), and one seen complete completes those before it (the flight recorder reads it).
  bool stream_ordered = false;
  /// It runs on this rank's GPU: buffers on another device are an error.
  bool on_device = false;
  /// Whether it would take `r` where `view` stands (made or not). Pure: the routing tests call it.
  bool (*takes)(const RouteRequest& r, const TransportView& view) = nullptr;
  /// Before its decision: whether some backend it could make would take `r` (the decision is then started, by an
  /// operation every rank runs). Pure. Null: never decided by an operation.
  bool (*may_take)(const RouteRequest& r) = nullptr;
  /// backend_for's answer before the decision: whether the decision may be assumed to make it.
  bool assumed_before_decision = false;
  /// Runs before the router asks it about `r` (and before its decision), once the transports before it declined.
  void (*before_routing)(const RouteRequest& r) = nullptr;
  /// When `r`'s setting names this transport and it does not take `r`: raises where that is an error (else the
  /// operation falls back to the next transport). `refusal`: the slot's.
  void (*refuse)(const RouteRequest& r, const TransportView& view, const std::string& refusal,
                 const std::string& comm) = nullptr;
  /// The decision: makes the backend or records why not (slot.refusal). Collective over the communicator's ranks,
  /// a step of operation `op` (under its deadline). Sets slot.decided and slot.view.
  void (*decide)(CommunicatorImpl& c, TransportSlot& slot, const OpContext& op) = nullptr;
  /// Made with the communicator (every rank is there): point-to-point operations may use it then.
  void (*make_with_communicator)(CommunicatorImpl& c, TransportSlot& slot) = nullptr;
  /// make_with_communicator is not collective and runs for every communicator, made collectively or not (MPI).
  bool always = false;
  /// A split: the part's slot from the parent's (collective over the parent; for color < 0 the part's slot is not
  /// used). Null: the part makes its own (make_with_communicator).
  void (*split)(const CommunicatorImpl& parent, const TransportSlot& from, int color, int key,
                std::shared_ptr<AbortState> abort, TransportSlot& to) = nullptr;
};

/// Every transport registered, each at a place that never changes (a communicator's slots are indexed alike).
std::span<const Transport* const> transports() noexcept;
/// Their places in the order routing asks them: falling priority, the fallback (MPI, which takes every operation) last.
std::span<const std::size_t> routing_order() noexcept;
/// The transport recorded as `kind` (nullptr: none).
const Transport* transport_of(BackendKind kind) noexcept;
/// Its place in transports() (transports().size(): none).
std::size_t transport_index(BackendKind kind) noexcept;
/// Its name ("mpi", "nccl", "shm", or the setting's name for a kind no transport has: "auto").
const char* transport_name(BackendKind kind) noexcept;
/// Adds `t` (tests: a transport of their own), asked by its priority. Communicators made before know nothing of it; one
/// made after has a slot for it. Not while another thread makes or uses a communicator.
void register_transport(const Transport& t);

/// @throws Error (internal): no transport took `r` (the last must take every operation).
[[noreturn]] void raise_untaken(const RouteRequest& r);

/// The transport that runs `r` (its index in transports()): the first that takes it, where the slots stand (one per
/// transport, in order); where `r`'s setting names a transport that does not take it, that transport may refuse first
/// (refuse()). `prepare(i)` runs before transport i is asked: the pipeline's runs its before_routing hook and starts
/// its decision there.
/// @throws what refuse() raises (InvalidArgument naming the operation and setting; BackendError).
template <typename Slots, typename Prepare>
std::size_t route(const RouteRequest& r, Slots& slots, const std::string& comm, Prepare&& prepare) {
  const auto all = transports();
  for (const std::size_t k : routing_order()) {
    if (k >= static_cast<std::size_t>(slots.size())) continue;  // registered after the communicator was made
    const Transport& t = *all[k];
    prepare(k);
    if (t.takes(r, slots[k].view)) return k;
    if (t.refuse && r.setting == t.kind) t.refuse(r, slots[k].view, slots[k].refusal, comm);
  }
  raise_untaken(r);
}
/// The same where nothing is decided on the way (the routing tests, Communicator::backend_for).
inline std::size_t route(const RouteRequest& r, std::span<const TransportSlot> slots, const std::string& comm) {
  return route(r, slots, comm, [](std::size_t) {});
}

}  // namespace shardkit::detail
