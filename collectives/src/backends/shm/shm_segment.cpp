#include "backends/shm/shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>

#include "shardkit/core/error.hpp"
#include "shardkit/core/interrupt.hpp"

namespace shardkit::detail {
namespace {

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// The flags are process-shared: no FUTEX_PRIVATE_FLAG.
void futex_wait(std::atomic<std::uint32_t>* addr, std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>* addr) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::atomic<bool> g_named_for_tests{false};
std::atomic<void (*)()> g_before_open{nullptr};

}  // namespace

void shm_segment_hooks_for_tests(bool named, void (*before_open)()) noexcept {
  g_named_for_tests.store(named);
  g_before_open.store(before_open);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      bytes_(o.bytes_),
      data_offset_(o.data_offset_),
      p2p_lines_(o.p2p_lines_),
      p2p_data_(o.p2p_data_),
      p2p_(o.p2p_),
      ranks_(o.ranks_) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, bytes_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = o.bytes_;
    data_offset_ = o.data_offset_;
    p2p_lines_ = o.p2p_lines_;
    p2p_data_ = o.p2p_data_;
    p2p_ = o.p2p_;
    ranks_ = o.ranks_;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (base_) munmap(base_, bytes_);
}

ShmSegment ShmSegment::create(MpiCommHandle handle, std::string* why) {
  MPI_Comm comm = to_mpi<MPI_Comm>(handle);
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(comm, &size));
  ShmSegment s;
  s.ranks_ = size;
  const auto n = static_cast<std::size_t>(size);
  // Two lines per rank (the sets), then each rank's ring and its read line, then the point-to-point lines (each ordered
  // pair's ring entries, freed and read lines; each rank's doorbell); two slots per rank and set, plus results, then
  // the point-to-point payloads.
  s.p2p_ = P2pGeometry::for_ranks(size);
  const std::size_t ring_entries = n * n * static_cast<std::size_t>(s.p2p_.entries);
  s.p2p_lines_ = 2 * n + n * (kRingLines + 1);
  s.data_offset_ = round_up(kLinesOffset + (s.p2p_lines_ + ring_entries + 2 * n * n + n) * sizeof(ShmLine), 4096);
  s.p2p_data_ = s.data_offset_ + 2 * (n + 1) * kSlotBytes;
  s.bytes_ = s.p2p_data_ + ring_entries * s.p2p_.payload;

  // Rank 0 makes the memory as a file with no name (memfd_create), which the others open through its descriptor in
  // /proc (same node, same user): nothing is ever in /dev/shm, so nothing can be left there, whoever dies when. Where
  // one rank cannot (a /proc that hides other processes), a named file in /dev/shm instead, unlinked as soon as every
  // rank has opened it, or on the way out of an error; one that a killed job left is removed by the next segment made
  // on the node (sweep_orphans).
  if (rank == 0) sweep_orphans();  // what a killed job left there, whichever way this one goes
  int worst = attach(handle, rank, /*named=*/false, s);
  if (worst != 0) worst = attach(handle, rank, /*named=*/true, s);
  if (worst != 0) {
    if (why)
      *why = concat("a shared-memory segment of ", s.bytes_, " bytes could not be made or mapped (",
                    std::strerror(worst), ")");
    return ShmSegment();
  }
  return s;
}

int ShmSegment::attach(MpiCommHandle handle, int rank, bool named, ShmSegment& s) {
  MPI_Comm comm = to_mpi<MPI_Comm>(handle);
  struct {
    char name[64];  // the named file's ("" for the memfd)
    int pid, fd, err;
    std::uint64_t dev, ino;  // the file's identity: what another rank opens must be the same file
  } made{};
  auto map = [&](int fd) {
    void* p = mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return errno;
    s.base_ = static_cast<unsigned char*>(p);
    return 0;
  };
  // On every way out: rank 0's descriptor closed (the mappings keep the memory), the name unlinked.
  struct Made {
    int fd = -1;
    std::string name;
    ~Made() {
      if (fd >= 0) close(fd);
      if (!name.empty()) shm_unlink(name.c_str());
    }
  } own;
  if (rank == 0) {
    if (!named) {
      own.fd = g_named_for_tests.load() ? -1 : memfd_create("shardkit-shm", MFD_CLOEXEC);
      made.err = own.fd < 0 ? (g_named_for_tests.load() ? EACCES : errno) : 0;
    } else {
      static std::atomic<unsigned> made_here{0};
      std::snprintf(made.name, sizeof made.name, "/shardkit-%d-%u-%lx", static_cast<int>(getpid()), made_here++,
                    static_cast<unsigned long>(std::chrono::steady_clock::now().time_since_epoch().count()));
      own.fd = shm_open(made.name, O_CREAT | O_EXCL | O_RDWR, 0600);
      if (own.fd >= 0) own.name = made.name;
      made.err = own.fd < 0 ? errno : 0;
      // Held while the file has its name (released as the descriptor closes, or the process dies): a sweep elsewhere
      // (another PID namespace, where this process's id means nothing) leaves a file so locked alone.
      // Best effort: where a kernel or sandbox has no such locks, the sweep's other tests still apply.
      if (own.fd >= 0) {
        struct flock lock {};
        lock.l_type = F_WRLCK;
        lock.l_whence = SEEK_SET;
        (void)fcntl(own.fd, F_OFD_SETLK, &lock);
      }
    }
    // Reserve the pages now: a tmpfs out of space then fails here rather than with SIGBUS on first touch.
    if (made.err == 0) made.err = posix_fallocate(own.fd, 0, static_cast<off_t>(s.bytes_));
    if (made.err == 0) made.err = map(own.fd);
    made.pid = static_cast<int>(getpid());
    made.fd = own.fd;
    struct stat st {};
    if (made.err == 0) {
      if (fstat(own.fd, &st) == 0) {
        made.dev = st.st_dev;
        made.ino = st.st_ino;
      } else {
        made.err = errno;
      }
    }
  }
  SHARDKIT_MPI_CHECK(MPI_Bcast(&made, sizeof made, MPI_BYTE, 0, comm));
  int mine = made.err;
  if (rank != 0 && made.err == 0) {
    if (const auto hook = g_before_open.load()) hook();
    const std::string path = named ? concat("/dev/shm", made.name) : concat("/proc/", made.pid, "/fd/", made.fd);
    // The same file as rank 0's (in another PID namespace its process id may name another process's descriptor):
    // checked before it is opened (a terminal or device would act on the open), and again once open.
    struct stat st {};
    auto same = [&] { return st.st_dev == made.dev && st.st_ino == made.ino; };
    const int fd = ::stat(path.c_str(), &st) != 0 ? -1
                   : !same()                      ? (errno = EXDEV, -1)
                                                  : open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    mine = fd < 0 ? errno : fstat(fd, &st) != 0 ? errno : !same() ? EXDEV : map(fd);
    if (fd >= 0) close(fd);
  }
  // Every rank has opened the file (or failed to): its name and rank 0's descriptor go on the way out.
  int worst = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, comm));
  if (worst != 0 && s.base_) {
    munmap(s.base_, s.bytes_);
    s.base_ = nullptr;
  }
  return worst;
}

void ShmSegment::sweep_orphans() noexcept {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  while (const dirent* e = readdir(d)) {
    int pid = 0;
    if (std::sscanf(e->d_name, "shardkit-%d-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // its maker lives (in this PID namespace)
    // Nor one made moments ago (its maker, in another PID namespace, may not hold its lock yet).
    struct stat made {};
    if (::stat((std::string("/dev/shm/") + e->d_name).c_str(), &made) != 0 || time(nullptr) - made.st_mtime < 10)
      continue;
    // Nor one whose maker holds its lock (a live maker in another PID namespace, whose id means another process).
    const std::string name = std::string("/") + e->d_name;
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) continue;
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (fcntl(fd, F_OFD_SETLK, &lock) == 0) shm_unlink(name.c_str());
    close(fd);
  }
  closedir(d);
}

namespace {

// Ranks of the whole job on this node, as the launcher tells them (a sub-communicator's ranks share the CPUs with the
// others); 0 when it does not say.
int launcher_local_ranks() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

}  // namespace

WaitPolicy WaitPolicy::choose(int ranks, int cpus, int job_ranks, int online) noexcept {
  const bool crowded = ranks > cpus || (online > 0 && job_ranks > online);
  return crowded ? WaitPolicy{16, 4, true} : WaitPolicy{1 << 14, 64, false};
}

WaitPolicy WaitPolicy::for_comm(MpiCommHandle handle) {
  MPI_Comm comm = to_mpi<MPI_Comm>(handle);
  int size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_size(comm, &size));
  cpu_set_t mine, all;
  CPU_ZERO(&mine);
  CPU_ZERO(&all);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_SET(0, &mine);
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&mine, &all, static_cast<int>(sizeof(cpu_set_t)), MPI_BYTE, MPI_BOR, comm));
  return choose(size, CPU_COUNT(&all), launcher_local_ranks(), static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

void shm_post(ShmLine& line, std::uint32_t step) noexcept {
  // Sequentially consistent with the waiter's (increment sleepers; read flag): one of them sees the other.
  line.flag.store(step, std::memory_order_seq_cst);
  if (line.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&line.flag);
}

void shm_post_unseen(ShmLine& line, std::uint32_t step) noexcept {
  line.flag.store(step, std::memory_order_release);
}

void shm_wake(ShmLine& line) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (line.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&line.flag);
}

void shm_post_lines(ShmLine* const* lines, const std::uint32_t* steps, int count) noexcept {
  for (int k = 0; k < count; ++k) shm_post_unseen(*lines[k], steps[k]);
  for (int k = 0; k < count; ++k) shm_wake(*lines[k]);  // the first fence waits for all
}

void shm_ring(ShmLine& bell) noexcept {
  if (bell.sleepers.load(std::memory_order_seq_cst) == 0) return;
  bell.flag.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&bell.flag);
}

void shm_sleep(ShmLine& line, std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
  futex_wait(&line.flag, seen, timeout);
}

void shm_relax() noexcept {
  cpu_relax();
}

void shm_mpi_progress() noexcept {
  if (!mpi_initialized() || mpi_finalized()) return;
  // Only where any thread may call MPI at any time: under a lower level, another thread may be inside MPI meanwhile
  // (a shm wait made no MPI call before).
  static const bool multiple = [] {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    return level == MPI_THREAD_MULTIPLE;
  }();
  int flag = 0;
  if (multiple) MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
}

}  // namespace shardkit::detail
