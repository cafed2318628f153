// bench_peer_copy: how fast one process can copy another's buffer on this host, the bound under every single-copy
// collective of the shm backend (collectives/src/backends/shm/shm_cma.hpp). A parent process fills a buffer; a child copies it
// into its own memory three ways, and the two also copy their own buffers at the same time:
//   mapped    memcpy from a shared mapping of the parent's buffer (a memfd both map), what a mapped arena would do;
//   cma       process_vm_readv of the parent's buffer (cross-memory attach), what the shm backend and Open MPI do;
//   local     memcpy within the child, the limit;
//   2 local   both processes memcpy within themselves at once: whether two cores' copies add up here.
// Times per copy, min and median over the repeats. Every copy is checked against the parent's bytes: a wrong byte
// exits 1.
//
//   bench_peer_copy [--from BYTES] [--to BYTES] [--bytes-per-size BYTES] [--repeats N]

#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "args.hpp"
#include "timing.hpp"

namespace {

using shardkit::bench::Stats;

constexpr const char* kUsage =
    "usage: bench_peer_copy [--from BYTES] [--to BYTES] [--bytes-per-size BYTES] [--repeats N]\n"
    "sizes from --from to --to (K, M, G suffixes), factor 4; each measurement copies about\n"
    "--bytes-per-size bytes in all\n";

struct Options {
  std::size_t from = std::size_t{256} << 10, to = std::size_t{32} << 20, per_size = std::size_t{512} << 20;
  int repeats = 7;
};

[[noreturn]] void fail(const char* what) {
  std::perror(what);
  std::exit(2);
}

// @throws shardkit::bench::UsageError for an unknown option or a bad value.
Options parse(int argc, char** argv) {
  using namespace shardkit::bench;
  Options o;
  ArgReader r(argc, argv, /*short_values=*/false);
  while (r.next()) {
    const std::string_view name = r.name();
    if (name == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (name == "--from") {
      o.from = static_cast<std::size_t>(parse_size(r.value(), name));
    } else if (name == "--to") {
      o.to = static_cast<std::size_t>(parse_size(r.value(), name));
    } else if (name == "--bytes-per-size") {
      o.per_size = static_cast<std::size_t>(parse_size(r.value(), name));
    } else if (name == "--repeats") {
      o.repeats = static_cast<int>(std::max<std::int64_t>(1, parse_int(r.value(), name)));
    } else {
      throw UsageError("unknown option " + std::string(r.text()));
    }
  }
  return o;
}

// Private memory for a copy's destination or a local source, touched once so that no timed copy faults it in.
unsigned char* private_buffer(std::size_t bytes, unsigned char fill) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("mmap");
  madvise(p, bytes, MADV_HUGEPAGE);  // as shardkit's host arrays from 2 MiB (core/src/allocate.cpp)
  std::memset(p, fill, bytes);
  return static_cast<unsigned char*>(p);
}

// The parent's pattern: byte i is (i * 7 + 3) mod 251, so that a copy from the wrong offset is seen.
unsigned char pattern(std::size_t i) {
  return static_cast<unsigned char>((i * 7 + 3) % 251);
}

bool holds_pattern(const unsigned char* p, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; i += 1 + i % 4093)  // a spread of bytes, the last included below
    if (p[i] != pattern(i)) return false;
  return bytes == 0 || p[bytes - 1] == pattern(bytes - 1);
}

template <typename Copy>
Stats time_copies(int repeats, int iters, Copy&& copy) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const double start = shardkit::bench::now();
    for (int i = 0; i < iters; ++i) copy();
    t.push_back((shardkit::bench::now() - start) / iters);
  }
  return shardkit::bench::stats(t, 1e6);
}

// A copy the compiler may not drop: the destination escapes.
void copy_bytes(unsigned char* to, const unsigned char* from, std::size_t bytes) {
  std::memcpy(to, from, bytes);
  asm volatile("" : : "r"(to) : "memory");
}

// One size. Two pipes: the parent sends the child its private buffer's address, and the child says when it starts the
// concurrent local copies, then sends back its times. The parent's private buffer is made after the fork: pages the
// two processes still share copy-on-write make process_vm_readv several times slower (16 MiB: 3.2-4.6 ms against
// 1.0 ms when made after it), which no rank of a real job has.
bool measure(std::size_t bytes, const Options& o) {
  const int iters = static_cast<int>(std::max<std::size_t>(1, o.per_size / std::max<std::size_t>(bytes, 1)));
  const int fd = memfd_create("bench_peer_copy", 0);
  if (fd < 0) fail("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) fail("ftruncate");
  auto* shared = static_cast<unsigned char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (shared == MAP_FAILED) fail("mmap");
  for (std::size_t i = 0; i < bytes; ++i) shared[i] = pattern(i);
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) fail("pipe");
  const pid_t parent = getpid();
  std::fflush(stdout);  // else the child would print the parent's unwritten lines again
  const pid_t child = fork();
  if (child < 0) fail("fork");
  if (child == 0) {
    unsigned char* dst = private_buffer(bytes, 1);
    unsigned char* local = private_buffer(bytes, 0);
    std::memcpy(local, shared, bytes);
    const auto* peer = static_cast<const unsigned char*>(mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0));
    if (peer == MAP_FAILED) fail("mmap");
    unsigned char* theirs = nullptr;  // the parent's private buffer, in its address space
    if (read(to_child[0], &theirs, sizeof theirs) != static_cast<ssize_t>(sizeof theirs)) fail("read");
    bool ok = true;
    auto check = [&] {
      ok = ok && holds_pattern(dst, bytes);
      std::memset(dst, 1, bytes);
    };
    Stats t[4];
    t[0] = time_copies(o.repeats, iters, [&] { copy_bytes(dst, peer, bytes); });
    check();
    bool cma_ok = true;
    t[1] = time_copies(o.repeats, iters, [&] {
      iovec l{dst, bytes}, r{theirs, bytes};
      cma_ok = cma_ok && process_vm_readv(parent, &l, 1, &r, 1, 0) == static_cast<ssize_t>(bytes);
    });
    if (cma_ok)
      check();
    else
      t[1] = {-1, -1};  // refused here (ptrace rules): reported, not a failure of the copies
    t[2] = time_copies(o.repeats, iters, [&] { copy_bytes(dst, local, bytes); });
    check();
    if (write(to_parent[1], "g", 1) != 1) fail("write");
    t[3] = time_copies(o.repeats, iters, [&] { copy_bytes(dst, local, bytes); });
    check();
    if (write(to_parent[1], t, sizeof t) != static_cast<ssize_t>(sizeof t) || write(to_parent[1], &ok, 1) != 1)
      fail("write");
    _exit(0);
  }
  unsigned char* mine = private_buffer(bytes, 0);
  std::memcpy(mine, shared, bytes);
  unsigned char* dst = private_buffer(bytes, 1);
  if (write(to_child[1], &mine, sizeof mine) != static_cast<ssize_t>(sizeof mine)) fail("write");
  char go = 0;
  if (read(to_parent[0], &go, 1) != 1) fail("read");
  const Stats both = time_copies(o.repeats, iters, [&] { copy_bytes(dst, mine, bytes); });
  Stats t[4];
  bool ok = false;
  if (read(to_parent[0], t, sizeof t) != static_cast<ssize_t>(sizeof t) || read(to_parent[0], &ok, 1) != 1)
    fail("read");
  ok = ok && holds_pattern(dst, bytes);
  int status = 0;
  waitpid(child, &status, 0);
  std::printf("%12zu %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7.2f %7.2f\n", bytes, t[0].min,
              t[0].median, t[1].min, t[1].median, t[2].min, t[2].median, t[3].min, t[3].median, both.min, both.median,
              t[1].median > 0 ? t[1].median / t[0].median : 0.0, t[3].median / t[2].median);
  for (unsigned char* p : {mine, dst}) munmap(p, bytes);
  munmap(shared, bytes);
  close(fd);
  for (int p : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(p);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const shardkit::bench::UsageError& e) {
    std::fprintf(stderr, "bench_peer_copy: %s\n%s", e.what(), kUsage);
    return 2;
  }
  std::printf(
      "# bench_peer_copy: a child process copies its parent's buffer; times per copy in us (min, median over"
      " %d repeats)\n",
      o.repeats);
  std::printf("# %10s %19s %19s %19s %19s %19s %7s %7s\n", "bytes", "mapped memcpy", "process_vm_readv", "local memcpy",
              "2 local: child", "2 local: parent", "cma/map", "2loc/1");
  bool ok = true;
  for (std::size_t b = o.from; b <= o.to && b > 0; b *= 4) ok = measure(b, o) && ok;
  std::printf("# copies checked: %s\n", ok ? "all hold the parent's bytes" : "WRONG BYTES");
  return ok ? 0 : 1;
}
