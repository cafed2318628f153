#include "backends/shm/shm_cma.hpp"

#include <mpi.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "shardkit/core/error.hpp"

namespace shardkit::detail {

namespace {

// process_vm_readv (write false) or process_vm_writev of `bytes` between `local` here and `remote` in process `pid`.
bool cma_copy(pid_t pid, void* local, std::uintptr_t remote, std::size_t bytes, bool write) noexcept {
  auto* here = static_cast<unsigned char*>(local);
  // The kernel may copy less than asked (it stops at a fault, or at its per-call limit): go on from there.
  while (bytes > 0) {
    iovec l{here, bytes}, r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (got == 0) {
      errno = EFAULT;
      return false;
    }
    here += got;
    remote += static_cast<std::uintptr_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
  return true;
}

}  // namespace

bool cma_read(pid_t pid, void* to, const void* from, std::size_t bytes) noexcept {
  return cma_copy(pid, to, reinterpret_cast<std::uintptr_t>(from), bytes, false);
}

bool cma_write(pid_t pid, void* to, const void* from, std::size_t bytes) noexcept {
  return cma_copy(pid, const_cast<void*>(from), reinterpret_cast<std::uintptr_t>(to), bytes, true);
}

CmaPeers probe_cma(MpiCommHandle handle, bool allowed) {
  MPI_Comm comm = to_mpi<MPI_Comm>(handle);
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(comm, &size));
  CmaPeers out;
  out.pids.resize(static_cast<std::size_t>(size));
  // Each rank offers a known word, reads its right neighbour's and writes it back (the same value).
  struct Offer {
    std::int64_t pid;
    std::uint64_t address;
  };
  static constexpr std::uint64_t kWord = 0x5368617264436d61;  // "ShardCma"
  static std::uint64_t offered = kWord;                          // only ever written kWord, by every probe
  const Offer mine{getpid(), reinterpret_cast<std::uintptr_t>(&offered)};
  std::vector<Offer> all(out.pids.size());
  SHARDKIT_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm));
  for (int r = 0; r < size; ++r) out.pids[r] = static_cast<pid_t>(all[r].pid);
  if (size == 1) {
    out.why = "one rank";
    return out;
  }
  const Offer& right = all[(rank + 1) % size];
  // -1: turned off here (CommOptions::shm_single_copy, SHARDKIT_SHM_SINGLE_COPY=0); else 0 or the refused read's errno.
  int err = -1;
  if (allowed) {
    std::uint64_t read = 0;
    const auto pid = static_cast<pid_t>(right.pid);
    auto* at = reinterpret_cast<void*>(right.address);
    err = cma_read(pid, &read, at, sizeof read) ? 0 : errno;
    if (err == 0 && read != kWord) err = EIO;
    if (err == 0 && !cma_write(pid, at, &kWord, sizeof kWord)) err = errno;
  }
  int worst = 0, least = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&err, &worst, 1, MPI_INT, MPI_MAX, comm));
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&err, &least, 1, MPI_INT, MPI_MIN, comm));
  out.usable = worst == 0 && least == 0;
  if (least < 0)
    out.why = "single copy turned off (shm_single_copy = false, SHARDKIT_SHM_SINGLE_COPY=0)";
  else if (!out.usable)
    out.why = concat("process_vm_readv refused (", std::strerror(worst), ")");
  return out;
}

}  // namespace shardkit::detail
