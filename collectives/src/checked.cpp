#include "checked.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "flight_recorder.hpp"
#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "transport.hpp"

namespace shardkit::detail {

namespace {
// Each rank that finds the disagreement writes its flight records before raising (the analyzer reads them).
[[noreturn]] void raise_mismatch(std::string what) {
  fail_current_operation();
  dump_flight_records("MismatchError: " + what);
  throw MismatchError(std::move(what));
}
}  // namespace
namespace {

constexpr int kSignatureTag = 7002;
constexpr int kCountsTag = 7003;

// "0-2, 5" for a list of ranks.
std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) os << ", ";
    os << ranks[i];
    if (j > i) os << (j == i + 1 ? ", " : "-") << ranks[j];
    i = j + 1;
  }
  return os.str();
}

std::string field_text(const char* field, std::int64_t v) {
  const std::string f = field;
  // A hash is any 64-bit pattern (compared as a signed number): never "(none)".
  if (f == "counts (hash)") return std::to_string(static_cast<std::uint64_t>(v));
  if (v < 0) return "(none)";
  if (f == "operation") return v == kCreationOp ? "communicator creation" : op_name(static_cast<OpKind>(v));
  if (f == "dtype") return std::string(dtype_name(static_cast<DType>(v)));
  if (f == "reduction") return reduce_op_name(static_cast<ReduceOp>(v));
  if (f == "backend") return transport_name(static_cast<BackendKind>(v));
  return std::to_string(v);
}

// Sends `mine` to every other rank and receives theirs, within the deadline. Returns false on timeout, leaving in
// `missing` the ranks whose message did not arrive.
template <typename T>
bool exchange_all(MPI_Comm c, int tag, const T* mine_per_peer, std::size_t stride, std::vector<T>& all,
                  const OpContext& ctx, std::vector<int>& missing) {
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size));
  all.assign(static_cast<std::size_t>(size), T{});
  all[rank] = mine_per_peer[stride * static_cast<std::size_t>(rank)];
  std::vector<MPI_Request> recvs, sends;
  std::vector<int> peers;
  // Owned here so that sends left in flight by a timeout never read freed memory (leaked in that case).
  auto outgoing = std::make_unique<std::vector<T>>(mine_per_peer, mine_per_peer + stride * static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    MPI_Request q;
    SHARDKIT_MPI_CHECK(MPI_Irecv(&all[p], sizeof(T), MPI_BYTE, p, tag, c, &q));
    recvs.push_back(q);
    peers.push_back(p);
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    MPI_Request q;
    SHARDKIT_MPI_CHECK(MPI_Isend(&(*outgoing)[stride * static_cast<std::size_t>(p)], sizeof(T), MPI_BYTE, p, tag,
                                 c, &q));
    sends.push_back(q);
  }
  if (!wait_all(recvs, nullptr, ctx.deadline)) {
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      int done = 0;
      if (recvs[i] != MPI_REQUEST_NULL) MPI_Test(&recvs[i], &done, MPI_STATUS_IGNORE);
      if (recvs[i] != MPI_REQUEST_NULL && !done) missing.push_back(peers[i]);
    }
    cancel_receives(recvs);
    outgoing.release();  // sends left in flight: the communicator is aborted and the job ends at exit
    return false;
  }
  // Our sends complete once their receivers arrived, which they have (they sent to us) or will shortly.
  if (!wait_all(sends, nullptr, ctx.deadline)) {
    outgoing.release();
    return false;
  }
  return true;
}

}  // namespace

std::uint64_t hash_counts(std::span<const std::int64_t> counts) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t c : counts) {
    auto v = static_cast<std::uint64_t>(c);
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

void check_signatures(MpiCommHandle control, const Signature& mine, const OpContext& ctx, AbortState& abort) {
  MPI_Comm c = to_mpi<MPI_Comm>(control);
  int size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size));
  if (size == 1) return;
  std::vector<Signature> mine_per_peer(static_cast<std::size_t>(size), mine);
  std::vector<Signature> all;
  std::vector<int> missing;
  if (!exchange_all(c, kSignatureTag, mine_per_peer.data(), 1, all, ctx, missing)) {
    raise_unfinished(ctx, abort,
                     missing.empty() ? std::string("not every rank arrived")
                                     : concat("rank(s) ", rank_list(missing),
                                              " did not arrive (skipped this collective, stuck, or lost)"));
  }

  struct Field {
    const char* name;
    std::int64_t (*get)(const Signature&);
  };
  static const Field fields[] = {
      {"operation", [](const Signature& s) { return static_cast<std::int64_t>(s.op); }},
      {"sequence number", [](const Signature& s) { return static_cast<std::int64_t>(s.seq); }},
      {"dtype", [](const Signature& s) { return static_cast<std::int64_t>(s.dtype); }},
      {"count", [](const Signature& s) { return s.count; }},
      {"root", [](const Signature& s) { return static_cast<std::int64_t>(s.root); }},
      {"reduction", [](const Signature& s) { return static_cast<std::int64_t>(s.reduce); }},
      {"backend", [](const Signature& s) { return static_cast<std::int64_t>(s.backend); }},
      {"counts (hash)", [](const Signature& s) { return static_cast<std::int64_t>(s.extra); }},
  };
  // Different operations may take different backends (the default route's shm table is per operation and size):
  // the backend is named only where the ranks agree on the operation.
  const bool ops_differ = std::any_of(all.begin(), all.end(), [&](const Signature& s) { return s.op != all[0].op; });
  std::ostringstream diff;
  int differing = 0;
  for (const Field& f : fields) {
    if (ops_differ && std::strcmp(f.name, "backend") == 0) continue;
    std::map<std::int64_t, std::vector<int>> by_value;
    for (int r = 0; r < size; ++r) by_value[f.get(all[r])].push_back(r);
    if (by_value.size() <= 1) continue;
    diff << (differing++ ? "; " : "") << f.name << ": ";
    bool first = true;
    for (const auto& [value, ranks] : by_value) {
      diff << (first ? "" : ", ") << field_text(f.name, value) << " on rank" << (ranks.size() > 1 ? "s " : " ")
           << rank_list(ranks);
      first = false;
    }
  }
  if (differing) {
    // Name the operation each rank called when they differ; otherwise the one they share.
    raise_mismatch(concat("ranks disagree on ", ctx.describe(), ": ", diff.str(),
                               ". Nothing was sent; the communicator is still usable."));
  }
}

void check_alltoallv_counts(MpiCommHandle control, std::span<const std::int64_t> send_counts,
                            std::span<const std::int64_t> recv_counts, const OpContext& ctx, AbortState& abort) {
  MPI_Comm c = to_mpi<MPI_Comm>(control);
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size));
  // What each peer will send to me, next to what I expect from it.
  std::vector<std::int64_t> incoming;
  std::vector<int> missing;
  if (!exchange_all(c, kCountsTag, send_counts.data(), 1, incoming, ctx, missing))
    raise_unfinished(ctx, abort, concat("rank(s) ", rank_list(missing), " did not arrive"));
  incoming[rank] = send_counts[rank];
  std::string local;
  for (int p = 0; p < size; ++p)
    if (incoming[p] != recv_counts[p])
      local += concat(local.empty() ? "" : "; ", "rank ", rank, " expects ", recv_counts[p], " elements from rank ", p,
                      ", which sends ", incoming[p]);
  // Everyone learns whether anyone found a disagreement (a second exchange of one flag).
  std::vector<std::int64_t> flags;
  const std::vector<std::int64_t> mine(static_cast<std::size_t>(size), local.empty() ? 0 : 1);
  missing.clear();
  if (!exchange_all(c, kCountsTag, mine.data(), 1, flags, ctx, missing))
    raise_unfinished(ctx, abort, concat("rank(s) ", rank_list(missing), " did not arrive"));
  std::vector<int> bad;
  for (int p = 0; p < size; ++p)
    if (flags[p]) bad.push_back(p);
  if (!bad.empty())
    raise_mismatch(concat("ranks disagree on the counts of ", ctx.describe(), ": rank(s) ",
                               rank_list(bad), " expect other counts than their peers send",
                               local.empty() ? "" : " (", local, local.empty() ? "" : ")",
                               ". Nothing was sent; the communicator is still usable."));
}

}  // namespace shardkit::detail
