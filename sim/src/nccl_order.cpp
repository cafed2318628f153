// Launch order across the NCCL communicators of one device. NCCL kernels wait for their peers, and kernels of two
// communicators are not guaranteed to run side by side on one GPU, so where two ranks share two communicators, each
// must launch their operations in the same order (NCCL's "Using multiple NCCL communicators concurrently"; XLA's
// thread and the Python thread of one process are the usual way to break it). The simulated GPU runs each stream on
// its own worker and would never hang on such a program; instead, every launch records what this rank had launched
// on the other communicators of its device, and when the operation runs the ranks compare: collectives must follow
// the same number of collectives of every communicator both ranks belong to, a receive the same number of
// exchanges between the two ranks. A difference is fatal, as the hang it stands for.

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl_internal.hpp"
#include "sim_internal.hpp"

namespace shardkit::sim {
namespace {

constexpr int kOrderTag = 1;  // the snapshot a send carries (the data uses tag 0)

struct Entry {
  ncclComm_t comm = nullptr;
  std::int64_t colls = 0;                  // collectives launched
  std::vector<std::int64_t> sends, recvs;  // point-to-point launched, by peer (the communicator's rank)
};

std::mutex mu;
// device -> communicator uid -> what was launched on it. Never freed (workers may outlive static destruction).
auto& table() {
  static auto* t = new std::map<int, std::map<std::uint64_t, Entry>>();
  return *t;
}

struct Counts {
  std::int64_t colls = 0;
  std::map<int, std::pair<std::int64_t, std::int64_t>> with;  // world rank -> (sends to, receives from)
};
// A snapshot: per communicator, uid, collectives, pair count, then (world rank, sends, receives) per pair.
std::map<std::uint64_t, Counts> decode(const LaunchSnapshot& s) {
  std::map<std::uint64_t, Counts> out;
  for (std::size_t i = 0; i + 3 <= s.size();) {
    Counts& c = out[static_cast<std::uint64_t>(s[i])];
    c.colls = s[i + 1];
    const auto pairs = static_cast<std::size_t>(s[i + 2]);
    i += 3;
    for (std::size_t p = 0; p < pairs && i + 3 <= s.size(); ++p, i += 3) c.with[static_cast<int>(s[i])] = {s[i + 1], s[i + 2]};
  }
  return out;
}

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
  return b;
}

// Fatal where `me` and `peer` (world ranks) launched the operations of a communicator they share in different orders
// relative to this operation of `c`.
void compare(ncclComm_t c, const char* call, int me, const LaunchSnapshot& mine, int peer, const LaunchSnapshot& theirs) {
  const auto a = decode(mine), b = decode(theirs);
  for (const auto& [uid, x] : a) {
    auto it = b.find(uid);
    if (it == b.end()) continue;  // not a communicator of both
    const Counts& y = it->second;
    std::string what;
    std::int64_t n = 0, m = 0;
    auto pair_of = [](const Counts& k, int w) {
      auto p = k.with.find(w);
      return p == k.with.end() ? std::pair<std::int64_t, std::int64_t>{0, 0} : p->second;
    };
    const auto [xs, xr] = pair_of(x, peer);
    const auto [ys, yr] = pair_of(y, me);
    if (x.colls != y.colls) {
      what = "collectives", n = x.colls, m = y.colls;
    } else if (xs != yr) {
      what = "point-to-point transfers from rank " + std::to_string(me) + " to rank " + std::to_string(peer), n = xs, m = yr;
    } else if (xr != ys) {
      what = "point-to-point transfers from rank " + std::to_string(peer) + " to rank " + std::to_string(me), n = xr, m = ys;
    } else {
      continue;
    }
    fatal(std::string(call) + " on NCCL communicator " + hex(c->uid) + ": world ranks " + std::to_string(me) + " and " +
          std::to_string(peer) + " launched the operations of two communicators they share in different orders: " +
          "before this one, rank " + std::to_string(me) + " had launched " + std::to_string(n) + " and rank " +
          std::to_string(peer) + " " + std::to_string(m) + " " + what + " on communicator " + hex(uid) +
          " (device " + std::to_string(c->device) + "). NCCL kernels wait for their peers and kernels of two "
          "communicators need not run side by side: real NCCL may hang here (launch the operations of communicators "
          "that share ranks in the same order on every rank)");
  }
}

}  // namespace

void order_join(ncclComm_t c) {
  if (c->size < 2) return;
  std::lock_guard lock(mu);
  Entry& e = table()[c->device][c->uid];
  e.comm = c;
  e.sends.assign(static_cast<std::size_t>(c->size), 0);
  e.recvs.assign(static_cast<std::size_t>(c->size), 0);
}

void order_leave(ncclComm_t c) {
  std::lock_guard lock(mu);
  auto& dev = table()[c->device];
  if (auto it = dev.find(c->uid); it != dev.end() && it->second.comm == c) dev.erase(it);
}

LaunchSnapshot order_snapshot(ncclComm_t c) {
  LaunchSnapshot s;
  if (c->size < 2) return s;
  std::lock_guard lock(mu);
  for (const auto& [uid, e] : table()[c->device]) {
    if (e.comm == c) continue;
    s.push_back(static_cast<std::int64_t>(uid));
    s.push_back(e.colls);
    const std::size_t at = s.size();
    s.push_back(0);
    for (std::size_t p = 0; p < e.sends.size(); ++p)
      if (e.sends[p] || e.recvs[p]) {
        s.insert(s.end(), {e.comm->world[p], e.sends[p], e.recvs[p]});
        ++s[at];
      }
  }
  return s;
}

void order_count(ncclComm_t c, int peer, bool send) {
  if (c->size < 2) return;
  std::lock_guard lock(mu);
  auto& dev = table()[c->device];
  auto it = dev.find(c->uid);
  if (it == dev.end()) return;
  if (peer < 0)
    ++it->second.colls;
  else
    ++(send ? it->second.sends : it->second.recvs)[static_cast<std::size_t>(peer)];
}

bool order_check_all(ncclComm_t c, const char* call, const LaunchSnapshot& mine) {
  if (c->size < 2) return true;
  const int n = c->size;
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n), 0);
  std::vector<MPI_Request> r(1);
  MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, c->data, &r[0]);
  if (!wait_all(c, r)) return false;
  for (int i = 1; i < n; ++i) displs[i] = displs[i - 1] + lens[i - 1];
  std::vector<std::int64_t> all(static_cast<std::size_t>(displs[n - 1] + lens[n - 1]));
  MPI_Iallgatherv(mine.data(), len, MPI_INT64_T, all.data(), lens.data(), displs.data(), MPI_INT64_T, c->data, &r[0]);
  if (!wait_all(c, r)) return false;
  for (int i = 0; i < n; ++i)
    if (i != c->rank)
      compare(c, call, c->world[c->rank], mine, c->world[i],
              LaunchSnapshot(all.begin() + displs[i], all.begin() + displs[i] + lens[i]));
  return true;
}

void order_send(ncclComm_t c, int peer, const LaunchSnapshot& mine, MPI_Request* req) {
  MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, peer, kOrderTag, c->data, req);
}

bool order_check_from(ncclComm_t c, const char* call, int peer, const LaunchSnapshot& mine) {
  for (long spin = 0;; ++spin) {
    int found = 0;
    MPI_Message msg;
    MPI_Status st;
    MPI_Improbe(peer, kOrderTag, c->data, &found, &msg, &st);
    if (found) {
      int len = 0;
      MPI_Get_count(&st, MPI_INT64_T, &len);
      LaunchSnapshot theirs(static_cast<std::size_t>(len));
      MPI_Mrecv(theirs.data(), len, MPI_INT64_T, &msg, MPI_STATUS_IGNORE);
      compare(c, call, c->world[c->rank], mine, c->world[peer], theirs);
      return true;
    }
    if (c->aborted) return false;
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace shardkit::sim
