// The operation table: for every operation its name, buffer roles, validation, checked-mode signature and value rule.
// Which backends implement an operation is declared by the backends themselves (mpi_supports, nccl_supports) and
// read by the router (transport.hpp) and the transports' rules (src/backends/*/).

#include "op_table.hpp"

#include <numeric>

#include "shardkit/core/error.hpp"

namespace shardkit {
namespace detail {
namespace {

std::int64_t total(std::span<const std::int64_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
}

void check_counts(std::span<const std::int64_t> counts, int size, const char* op, const char* what) {
  SHARDKIT_CHECK_EQ(static_cast<int>(counts.size()), size, op, ": ", what, " needs one entry per rank");
  for (std::size_t i = 0; i < counts.size(); ++i)
    SHARDKIT_CHECK_GE(counts[i], 0, op, ": negative ", what, " entry for rank ", i);
}

Signature sig(DType dtype, std::int64_t count, std::uint64_t extra = 0) {
  Signature s;
  s.dtype = static_cast<std::int32_t>(dtype);
  s.count = count;
  s.extra = extra;
  return s;
}

// ---- size rules ---------------------------------------------------------------------------------------------------

void no_sizes(const OpArgs&, const CommShape&, bool, bool) {}

void same_sizes(const OpArgs& a, const CommShape& c, bool send_active, bool recv_active) {
  if (send_active && recv_active)
    SHARDKIT_CHECK_EQ(a.send->numel(), a.recv->numel(), "send and receive sizes differ on rank ", c.rank);
}

void gathered_sizes(const OpArgs& a, const CommShape& c, bool, bool recv_active) {
  if (recv_active)
    SHARDKIT_CHECK_EQ(a.recv->numel(), a.send->numel() * c.size, "the receive buffer must hold size * ",
                      a.send->numel(), " elements");
}

void scattered_sizes(const OpArgs& a, const CommShape& c, bool send_active, bool) {
  if (send_active)
    SHARDKIT_CHECK_EQ(a.send->numel(), a.recv->numel() * c.size, "the send buffer must hold size * ",
                      a.recv->numel(), " elements");
}

void alltoall_sizes(const OpArgs& a, const CommShape& c, bool, bool) {
  SHARDKIT_CHECK_EQ(a.send->numel(), a.recv->numel(), "send and receive sizes differ");
  SHARDKIT_CHECK(a.send->numel() % c.size == 0, a.send->numel(), " elements do not split into ", c.size,
                 " equal blocks");
}

void allgatherv_sizes(const OpArgs& a, const CommShape& c, bool, bool) {
  check_counts(a.recv_counts, c.size, "allgatherv", "counts");
  SHARDKIT_CHECK_EQ(a.send->numel(), a.recv_counts[c.rank], "this rank's send size differs from its count");
  SHARDKIT_CHECK_EQ(a.recv->numel(), total(a.recv_counts), "the receive buffer must hold the sum of counts");
}

void alltoallv_sizes(const OpArgs& a, const CommShape& c, bool, bool) {
  check_counts(a.send_counts, c.size, "alltoallv", "send_counts");
  check_counts(a.recv_counts, c.size, "alltoallv", "recv_counts");
  if (!a.send_displs.empty()) {
    check_counts(a.send_displs, c.size, "alltoallv", "send_displs");
    for (int j = 0; j < c.size; ++j)
      SHARDKIT_CHECK_LE(a.send_displs[j] + a.send_counts[j], a.send->numel(), "the elements for rank ", j,
                        " lie outside the send buffer");
  } else {
    SHARDKIT_CHECK_EQ(a.send->numel(), total(a.send_counts), "send size differs from the sum of send_counts");
  }
  SHARDKIT_CHECK_EQ(a.recv->numel(), total(a.recv_counts), "receive size differs from the sum of recv_counts");
}

// ---- signatures ---------------------------------------------------------------------------------------------------

Signature send_sig(const OpArgs& a) { return sig(a.send->dtype(), a.send->numel()); }
Signature recv_sig(const OpArgs& a) { return sig(a.recv->dtype(), a.recv->numel()); }
// bcast: the buffer is `send` on the root and `recv` elsewhere (the same array when called in place).
Signature buffer_sig(const OpArgs& a) {
  const Array* b = a.send ? a.send : a.recv;
  return sig(b->dtype(), b->numel());
}
Signature no_sig(const OpArgs&) { return Signature{}; }
Signature allgatherv_sig(const OpArgs& a) {
  return sig(a.send->dtype(), a.recv->numel(), hash_counts(a.recv_counts));
}
// The per-pair counts are compared separately (check_alltoallv_counts): they differ between ranks by design.
Signature alltoallv_sig(const OpArgs& a) { return sig(a.send->dtype(), -1); }

using R = Role;
using V = ValueRule;

// Columns: kind, name, send role, recv role, collective, reduces, rooted, has dest, has source, value rule,
// size rule, signature.
constexpr OpSpec kTable[kOpCount] = {
    {OpKind::kAllreduce, "allreduce", R::kIn, R::kOut, true, true, false, false, false, V::kSameShape, same_sizes,
     send_sig},
    {OpKind::kReduce, "reduce", R::kIn, R::kRootOut, true, true, true, false, false, V::kRootSame, same_sizes,
     send_sig},
    {OpKind::kBcast, "bcast", R::kRootIn, R::kNonRootOut, true, false, true, false, false, V::kRootCopy, no_sizes,
     buffer_sig},
    {OpKind::kAllgather, "allgather", R::kIn, R::kOut, true, false, false, false, false, V::kStacked, gathered_sizes,
     send_sig},
    {OpKind::kGather, "gather", R::kIn, R::kRootOut, true, false, true, false, false, V::kRootStacked,
     gathered_sizes, send_sig},
    {OpKind::kScatter, "scatter", R::kRootIn, R::kOut, true, false, true, false, false, V::kScatter, scattered_sizes,
     recv_sig},
    {OpKind::kReduceScatter, "reduce_scatter", R::kIn, R::kOut, true, true, false, false, false, V::kDropLeading,
     scattered_sizes, recv_sig},
    {OpKind::kAlltoall, "alltoall", R::kIn, R::kOut, true, false, false, false, false, V::kSameShape,
     alltoall_sizes, send_sig},
    {OpKind::kSend, "send", R::kIn, R::kNone, false, false, false, true, false, V::kNone, no_sizes, no_sig},
    {OpKind::kRecv, "recv", R::kNone, R::kOut, false, false, false, false, true, V::kLike, no_sizes, no_sig},
    {OpKind::kSendrecv, "sendrecv", R::kIn, R::kOut, false, false, false, true, true, V::kLike, no_sizes, no_sig},
    {OpKind::kBarrier, "barrier", R::kNone, R::kNone, true, false, false, false, false, V::kNone, no_sizes, no_sig},
    {OpKind::kScan, "scan", R::kIn, R::kOut, true, true, false, false, false, V::kSameShape, same_sizes, send_sig},
    {OpKind::kAllgatherv, "allgatherv", R::kIn, R::kOut, true, false, false, false, false, V::kConcat,
     allgatherv_sizes, allgatherv_sig},
    {OpKind::kAlltoallv, "alltoallv", R::kIn, R::kOut, true, false, false, false, false, V::kNone, alltoallv_sizes,
     alltoallv_sig},
};

constexpr bool table_in_order() {
  for (int i = 0; i < kOpCount; ++i)
    if (static_cast<int>(kTable[i].kind) != i) return false;
  return true;
}
static_assert(table_in_order(), "kTable must list the operations in OpKind order");

void check_peer(int peer, const CommShape& c, const char* what, bool any_allowed) {
  SHARDKIT_CHECK((any_allowed && peer == kAnySource) || (peer >= 0 && peer < c.size), what, " ", peer,
                 " out of range for communicator '", *c.name, "' of size ", c.size);
}

void check_tag(int tag, const CommShape& c, bool any_allowed) {
  SHARDKIT_CHECK((any_allowed && tag == kAnyTag) || (tag >= 0 && tag <= c.tag_ub), "tag ", tag, " out of range [0, ",
                 c.tag_ub, "]");
}

void check_array(const Array* a, const char* op, const char* what) {
  SHARDKIT_CHECK(a != nullptr, op, ": the ", what, " array is missing");
}

}  // namespace

const OpSpec& op_spec(OpKind op) noexcept { return kTable[static_cast<int>(op)]; }

void validate(const OpSpec& s, const OpArgs& a, const CommShape& c) {
  try {
    if (s.rooted)
      SHARDKIT_CHECK(a.root >= 0 && a.root < c.size, "root ", a.root, " out of range for communicator '", *c.name,
                     "' of size ", c.size);
    if (s.has_dest) {
      check_peer(a.dest, c, "destination", false);
      check_tag(a.send_tag, c, false);
    }
    if (s.has_source) {
      check_peer(a.source, c, "source", true);
      check_tag(a.recv_tag, c, true);
    }
    const bool send_active = active(s.send, c.rank, a.root), recv_active = active(s.recv, c.rank, a.root);
    // bcast reads `send` on the root and writes `recv` elsewhere: both are the one buffer, so a caller passes both.
    if (s.send != Role::kNone && (send_active || s.kind == OpKind::kBcast)) check_array(a.send, s.name, "send");
    if (s.recv != Role::kNone && (recv_active || s.recv == Role::kOut || s.kind == OpKind::kBcast))
      check_array(a.recv, s.name, "receive");
    if (send_active && recv_active)
      SHARDKIT_CHECK(a.send->dtype() == a.recv->dtype(), "send dtype ", a.send->dtype(), " differs from receive dtype ",
                     a.recv->dtype());
    if (recv_active) SHARDKIT_CHECK(!a.recv->read_only(), "the receive buffer is read-only");
    if (s.reduces) {
      const DType d = a.send->dtype();
      SHARDKIT_CHECK(reduce_op_supports(a.reduce, d), "reduction '", reduce_op_name(a.reduce),
                     "' is not defined for dtype ", d);
    }
    s.check_sizes(a, c, send_active, recv_active);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(concat(s.name, ": ", e.what()));
  }
}

}  // namespace detail

const char* op_name(OpKind op) noexcept { return detail::op_spec(op).name; }

OpKind op_from_name(std::string_view name) {
  for (const detail::OpSpec& s : detail::kTable)
    if (name == s.name) return s.kind;
  throw InvalidArgument(detail::concat("unknown operation '", name, "'"));
}

ValueRule value_rule(OpKind op) noexcept { return detail::op_spec(op).value; }

const char* value_rule_name(ValueRule rule) noexcept {
  switch (rule) {
    case ValueRule::kNone: return "none";
    case ValueRule::kSameShape: return "same_shape";
    case ValueRule::kStacked: return "stacked";
    case ValueRule::kRootStacked: return "root_stacked";
    case ValueRule::kRootSame: return "root_same";
    case ValueRule::kDropLeading: return "drop_leading";
    case ValueRule::kScatter: return "scatter";
    case ValueRule::kRootCopy: return "root_copy";
    case ValueRule::kLike: return "like";
    case ValueRule::kConcat: return "concat";
  }
  return "?";
}

bool value_splits_leading(OpKind op, int rank, int root) noexcept {
  const ValueRule v = value_rule(op);
  return op == OpKind::kAlltoall || v == ValueRule::kDropLeading || (v == ValueRule::kScatter && rank == root);
}

bool value_stacks(OpKind op, int rank, int root) noexcept {
  const ValueRule v = value_rule(op);
  return v == ValueRule::kStacked || (v == ValueRule::kRootStacked && rank == root);
}

OpTraits op_traits(OpKind op) noexcept {
  const detail::OpSpec& s = detail::op_spec(op);
  return {s.collective, s.reduces, s.rooted, s.has_dest, s.has_source};
}

bool value_is_input(OpKind op, int rank, int root) noexcept {
  const ValueRule v = value_rule(op);
  return (v == ValueRule::kRootSame || v == ValueRule::kRootStacked) && rank != root;
}

namespace detail {

void bind_value_buffers(OpKind op, const Array& x, Array& out, OpArgs& a, int rank) noexcept {
  const ValueRule rule = value_rule(op);
  if (value_is_input(op, rank, a.root)) {
    a.send = &x;
    return;
  }
  a.recv = &out;
  if (rule == ValueRule::kRootCopy)
    a.send = &out;
  else if (rule != ValueRule::kLike)
    a.send = &x;
}

}  // namespace detail

void bind_value(OpKind op, const Array& x, Array& out, OpArgs& a, int rank) {
  detail::bind_value_buffers(op, x, out, a, rank);
  if (value_rule(op) == ValueRule::kRootCopy && rank == a.root) out.copy_from(x);
}

Shape value_shape(OpKind op, const Shape& x, int rank, int size, int root) {
  const char* name = op_name(op);
  auto leading = [&] {
    SHARDKIT_CHECK(!x.empty() && x[0] == size, name, ": the input must have shape (", size, ", ...), got ",
                   shape_to_string(x));
  };
  const ValueRule rule = value_rule(op);
  if (rule == ValueRule::kNone || rule == ValueRule::kConcat)
    throw InvalidArgument(detail::concat(name, " has no value form with a shape known in advance"));
  if (value_splits_leading(op, rank, root)) {
    leading();
    // alltoall keeps the blocks' axis (one block to and from each rank); the others keep this rank's block
    return op == OpKind::kAlltoall ? x : Shape(x.begin() + 1, x.end());
  }
  if (value_stacks(op, rank, root)) {
    Shape out{size};
    out.insert(out.end(), x.begin(), x.end());
    return out;
  }
  return x;
}

}  // namespace shardkit
