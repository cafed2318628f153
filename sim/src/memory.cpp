// Simulated device memory. A device allocation is a memfd mapped twice: the address handed out is PROT_NONE, so a
// host access through it faults and is reported ("host access to simulated device memory"), while stream workers
// use the read-write alias (worker_view). Pinned host memory and managed memory are ordinary host mappings, known
// to the simulation so that pointer attributes and copies treat them as CUDA does.

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <shared_mutex>

#include "shardkit/sim/sim.hpp"
#include "sim_internal.hpp"

namespace shardkit::sim {
namespace {

std::shared_mutex regions_mu;
std::map<std::uintptr_t, Region>& regions() {
  static auto* r = new std::map<std::uintptr_t, Region>();  // never destroyed: workers may outlive static teardown
  return *r;
}

bool lookup(const void* p, Region* out) {
  auto& m = regions();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  if (a >= it->first + it->second.mapped) return false;
  *out = it->second;
  return true;
}

struct sigaction previous_segv;

void on_segv(int sig, siginfo_t* info, void* uctx) {
  Region r;
  // No lock: a signal handler cannot take one, and a torn read here only costs the message.
  if (lookup(info->si_addr, &r) && r.kind == MemKind::kDevice) {
    char buf[256];
    const int n = std::snprintf(buf, sizeof buf,
                                "shardkit sim: host access to simulated device memory at %p (allocation %p, %zu bytes, "
                                "cuda:%d): the host read or wrote device memory without a copy\n",
                                info->si_addr, static_cast<void*>(r.base), r.size, r.device);
    if (n > 0) (void)!write(2, buf, static_cast<std::size_t>(n));
    std::abort();
  }
  // Not ours: hand the fault to whoever handled it before (sanitizers, MPI's backtrace, or the default).
  sigaction(SIGSEGV, &previous_segv, nullptr);
  (void)sig;
  (void)uctx;
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  });
}

std::size_t page_round(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return ((bytes ? bytes : 1) + page - 1) / page * page;
}

}  // namespace

bool find_region(const void* p, Region* out) {
  std::shared_lock lock(regions_mu);
  return lookup(p, out);
}

void* allocate(std::size_t bytes, MemKind kind, int device) {
  install_handler();
  Region r;
  r.size = bytes;
  r.mapped = page_round(bytes);
  r.kind = kind;
  r.device = device;
  if (kind == MemKind::kDevice) {
    const int fd = memfd_create("shardkit-sim-device", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    if (ftruncate(fd, static_cast<off_t>(r.mapped)) != 0) {
      close(fd);
      return nullptr;
    }
    void* none = mmap(nullptr, r.mapped, PROT_NONE, MAP_SHARED, fd, 0);
    void* rwm = mmap(nullptr, r.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (none == MAP_FAILED || rwm == MAP_FAILED) {
      if (none != MAP_FAILED) munmap(none, r.mapped);
      if (rwm != MAP_FAILED) munmap(rwm, r.mapped);
      return nullptr;
    }
    r.base = static_cast<char*>(none);
    r.rw = static_cast<char*>(rwm);
    // Fresh device memory is not zero on a GPU: fill it with a pattern so reading it unwritten is visible.
    std::memset(r.rw, 0xA5, r.mapped);
  } else {
    void* m = mmap(nullptr, r.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    r.base = r.rw = static_cast<char*>(m);
  }
  std::unique_lock lock(regions_mu);
  regions()[reinterpret_cast<std::uintptr_t>(r.base)] = r;
  return r.base;
}

bool release(void* p, MemKind kind) {
  Region r;
  {
    std::unique_lock lock(regions_mu);
    auto& m = regions();
    auto it = m.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == m.end() || (it->second.kind == MemKind::kPinned) != (kind == MemKind::kPinned)) return false;
    r = it->second;
    m.erase(it);
  }
  munmap(r.base, r.mapped);
  if (r.rw != r.base) munmap(r.rw, r.mapped);
  return true;
}

void* rw(const void* p) {
  Region r;
  if (!p || !find_region(p, &r)) return const_cast<void*>(p);
  return r.rw + (static_cast<const char*>(p) - r.base);
}

void* worker_view(const void* ptr) { return rw(ptr); }

}  // namespace shardkit::sim
