#pragma once

// The operation table: one entry per OpKind that the Communicator's pipeline (communicator.cpp), checked mode and the
// value forms read. An entry holds everything that differs between operations; the pipeline holds what they share.

#include <cstdint>

#include "checked.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::detail {

/// What an operation does with an array of OpArgs on a given rank.
enum class Role : std::uint8_t {
  kNone,        ///< not used
  kIn,          ///< read on every rank
  kOut,         ///< written on every rank
  kRootIn,      ///< read on the root only
  kRootOut,     ///< written on the root only
  kNonRootOut,  ///< written off the root only (bcast)
};

/// True when `role` uses its array on `rank`.
constexpr bool active(Role role, int rank, int root) noexcept {
  switch (role) {
    case Role::kNone: return false;
    case Role::kRootIn:
    case Role::kRootOut: return rank == root;
    case Role::kNonRootOut: return rank != root;
    default: return true;
  }
}

/// The ranks an operation runs on, for validation.
struct CommShape {
  int rank = 0;
  int size = 1;
  int tag_ub = 32767;
  const std::string* name = nullptr;
};

struct OpSpec {
  OpKind kind;
  const char* name;
  Role send;
  Role recv;
  /// Takes part in sequence numbers and checked mode (every rank calls it); point-to-point operations do not.
  bool collective;
  /// Takes a reduction, checked against the dtype.
  bool reduces;
  /// Takes a root.
  bool rooted;
  /// Point-to-point peers: dest (send, sendrecv) and source (recv, sendrecv).
  bool has_dest;
  bool has_source;
  ValueRule value;
  /// The size relations between the active arrays (and counts) on this rank. @throws InvalidArgument.
  void (*check_sizes)(const OpArgs& a, const CommShape& c, bool send_active, bool recv_active);
  /// What checked mode compares (dtype, count, extra); seq, op, root, reduction and backend are filled generically.
  Signature (*signature)(const OpArgs& a);
};

/// The entry of `op`.
const OpSpec& op_spec(OpKind op) noexcept;

/// bind_value's part that touches no data: points `a.send` / `a.recv` at `x` and `out` as the value rule says (for
/// kRootCopy, bind_value also copies x into out on the root). Communicator::check_value binds shape-only arrays with it.
void bind_value_buffers(OpKind op, const Array& x, Array& out, OpArgs& a, int rank) noexcept;

/// Validates `a` for `spec` on this rank: roots, peers, tags, reductions, dtypes, sizes, writable outputs.
/// @throws InvalidArgument naming the operation and the offending values.
void validate(const OpSpec& spec, const OpArgs& a, const CommShape& c);

}  // namespace shardkit::detail
