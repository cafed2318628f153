#pragma once

// The shared-memory segment of one communicator's shm backend, and how its ranks signal each other through it.
//
// Layout: a header; then, for each of two buffer sets, one 64-byte line per rank (a 32-bit step flag, a count of
// ranks sleeping on that flag, the size of the operation posted, and 48 bytes of inline data: small messages travel
// in the flag's own cache line);
// then, for each set, one data slot per rank plus one result slot (kSlotBytes each). Operations alternate sets, so
// a rank may fill one set while slower ranks still read the other. Small bcasts have a ring of their own (kRingLines
// lines per rank as root, and one line per rank saying the last of them it has read), so that a root may run that many
// ahead of its readers (shm_steps.hpp). Point-to-point messages (shm_p2p.hpp) have their own part, so they never touch
// what a collective of other ranks may still be reading: for each ordered pair of ranks a ring of P2pGeometry::entries
// entries (a line each, with a payload of P2pGeometry::payload bytes in the data part), a line on which the receiver
// counts the entries it has freed and one on which it counts the sender's buffers it has read itself (single copy);
// and for each rank a doorbell line that the others ring where it may sleep.
//
// The segment is made by the communicator's rank 0 as a file without a name (memfd_create), which the others open
// through its descriptor in /proc: nothing is ever in /dev/shm, whatever happens to the processes. Where a rank cannot
// open it, a file in /dev/shm named after rank 0's process, unlinked as soon as every rank has mapped it (or an error
// ends the making); one a killed job left there is removed by the next segment made on the node.

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "shardkit/core/array.hpp"
#include "shardkit/core/interrupt.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

/// The bytes of `a`'s buffer, which the shm files copy through the segment (an Array is a handle: a const one still
/// names writable memory, as a bcast's buffer on the ranks that receive it).
inline unsigned char* bytes_of(const Array& a) {
  return static_cast<unsigned char*>(a.data());
}

/// Above this many bytes per chunk, an allreduce's (or reduce's) reduction is split across the ranks (a second
/// handshake pays off); a reduce up to it is one-way (shm_backend.cpp).
inline constexpr std::size_t kShmSplitBytes = std::size_t{16} << 10;

/// One rank's flag line in one buffer set.
struct alignas(64) ShmLine {
  std::atomic<std::uint32_t> flag;      ///< the last step this rank posted in this set
  std::atomic<std::uint32_t> sleepers;  ///< ranks sleeping on `flag` (futex): the poster wakes them
  std::atomic<std::uint64_t> size;      ///< collectives: the bytes of the poster's operation (readers compare theirs)
  unsigned char data[48];               ///< inline data of small messages
};
static_assert(sizeof(ShmLine) == 64 && std::atomic<std::uint32_t>::is_always_lock_free &&
              std::atomic<std::uint64_t>::is_always_lock_free);

/// Tests: `named` makes segments take the named file's way (as where /proc cannot be opened), and `before_open` runs on
/// every rank but 0 before it opens the file rank 0 made.
void shm_segment_hooks_for_tests(bool named, void (*before_open)()) noexcept;

/// The size of each ordered pair's point-to-point ring: fewer and smaller entries where the ranks are many (the pairs
/// grow as their square).
struct P2pGeometry {
  int entries;          ///< a power of two
  std::size_t payload;  ///< bytes per entry, beside what its line holds
  static P2pGeometry for_ranks(int ranks) noexcept {
    return ranks <= 16 ? P2pGeometry{16, std::size_t{4} << 10} : P2pGeometry{4, std::size_t{1} << 10};
  }
};

/// A mapped segment; move-only, unmapped on destruction.
class ShmSegment {
 public:
  static constexpr std::size_t kInlineBytes = sizeof(ShmLine::data);
  static constexpr std::size_t kSlotBytes = std::size_t{1} << 20;
  /// Lines in each rank's ring of small bcasts.
  static constexpr int kRingLines = 16;
  /// Bcasts up to this size go through the root's ring, a line (kInlineBytes) per piece (shm_steps.hpp).
  static constexpr std::size_t kRingBcastBytes = 3 * kInlineBytes;
  static_assert(kRingBcastBytes / kInlineBytes <= kRingLines);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  /// Made collectively over `comm` (every rank must have arrived: blocking MPI calls). Returns an empty segment on
  /// every rank when any rank could not create or map it (`why` says why, on every rank).
  static ShmSegment create(MpiCommHandle comm, std::string* why);

  bool valid() const noexcept { return base_ != nullptr; }
  int ranks() const noexcept { return ranks_; }
  ShmLine& line(int set, int rank) const noexcept {
    return reinterpret_cast<ShmLine*>(base_ + kLinesOffset)[set * ranks_ + rank];
  }
  /// Rank `rank`'s data slot in `set`; rank == ranks() is the set's result slot.
  unsigned char* slot(int set, int rank) const noexcept {
    return base_ + data_offset_ + (static_cast<std::size_t>(set) * (ranks_ + 1) + rank) * kSlotBytes;
  }
  /// Line j of the ring of small bcasts rank `root` sends.
  ShmLine& ring_line(int root, int j) const noexcept { return lines()[2 * ranks_ + root * kRingLines + j]; }
  /// The line rank `rank` posts the step of each small bcast it has read on (not of those it sent).
  ShmLine& read_line(int rank) const noexcept { return lines()[2 * ranks_ + ranks_ * kRingLines + rank]; }

  /// The point-to-point rings' size.
  const P2pGeometry& p2p() const noexcept { return p2p_; }
  /// Entry i of the ring `from` sends its messages to `to` on.
  ShmLine& p2p_entry(int from, int to, int i) const noexcept {
    return lines()[p2p_lines_ + static_cast<std::size_t>(pair(from, to)) * p2p_.entries + i];
  }
  /// The payload of that entry (P2pGeometry::payload bytes).
  unsigned char* p2p_payload(int from, int to, int i) const noexcept {
    return base_ + p2p_data_ + (static_cast<std::size_t>(pair(from, to)) * p2p_.entries + i) * p2p_.payload;
  }
  /// The line `to` counts the entries of `from`'s ring it has freed on.
  ShmLine& p2p_freed(int from, int to) const noexcept { return lines()[p2p_lines_ + pairs_entries() + pair(from, to)]; }
  /// The line `to` counts the buffers of `from` it has read itself (single copy) on.
  ShmLine& p2p_read(int from, int to) const noexcept {
    return lines()[p2p_lines_ + pairs_entries() + pairs() + pair(from, to)];
  }
  /// Rank `rank`'s doorbell: rung (its flag advanced, its sleepers woken) by whoever posts what it may wait for. Its
  /// `size` turns non-zero once `rank` takes no more point-to-point messages (shm_p2p.hpp).
  ShmLine& bell(int rank) const noexcept { return lines()[p2p_lines_ + pairs_entries() + 2 * pairs() + rank]; }

 private:
  static constexpr std::size_t kLinesOffset = 64;
  // One attempt at making and mapping the file (named: in /dev/shm), collective; the worst error of any rank (0: every
  // rank mapped it into s).
  static int attach(MpiCommHandle comm, int rank, bool named, ShmSegment& s);
  // Unlinks the named segments in /dev/shm whose making process is gone.
  static void sweep_orphans() noexcept;
  ShmLine* lines() const noexcept { return reinterpret_cast<ShmLine*>(base_ + kLinesOffset); }
  std::size_t pair(int from, int to) const noexcept { return static_cast<std::size_t>(from) * ranks_ + to; }
  std::size_t pairs() const noexcept { return static_cast<std::size_t>(ranks_) * ranks_; }
  std::size_t pairs_entries() const noexcept { return pairs() * p2p_.entries; }
  unsigned char* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t data_offset_ = 0;
  std::size_t p2p_lines_ = 0;  // index of the first point-to-point line
  std::size_t p2p_data_ = 0;   // byte offset of the first payload
  P2pGeometry p2p_{};
  int ranks_ = 0;
};

/// True when `flag` has reached `step` (steps wrap around). A line last posted 2^31 steps ago, or never (0, once the
/// steps pass 2^31), has "reached" every step: only for lines known to be posted more often (shm_steps.hpp).
inline bool reached(std::uint32_t flag, std::uint32_t step) noexcept {
  return static_cast<std::int32_t>(flag - step) >= 0;
}

/// How long a waiter spins and yields before it sleeps on the futex.
struct WaitPolicy {
  int spins;
  int yields;
  /// Whether the ranks outnumber their CPUs (the short waits below); the default route then keeps small bcasts on MPI.
  bool crowded = false;
  /// Long spins while every rank can have a CPU of its own: `ranks` of this communicator, `cpus` in the union of
  /// their affinity masks (a launcher that binds each rank to one core leaves each mask one CPU wide: the union
  /// counts the cores they have together), `job_ranks` the job's ranks on this node (0: unknown) and `online` the
  /// node's CPUs. Crowded (more ranks than CPUs, in the communicator or in the job): give the CPU up almost at once.
  static WaitPolicy choose(int ranks, int cpus, int job_ranks, int online) noexcept;
  /// choose() for this communicator's ranks (collective, blocking: the ranks combine their affinity masks).
  static WaitPolicy for_comm(MpiCommHandle comm);
};

/// Posts `step` on `line` and wakes its sleepers.
void shm_post(ShmLine& line, std::uint32_t step) noexcept;
/// Posts `step` on `line` without waiting for the store to be seen (shm_post's sequentially consistent store waits for
/// the line to be this core's, a cache miss where a reader has it); its sleepers are not woken: shm_wake must follow.
void shm_post_unseen(ShmLine& line, std::uint32_t step) noexcept;
/// Wakes the sleepers of a line posted with shm_post_unseen (after a fence: sequentially consistent with each
/// waiter's increment of the sleepers and read of the flag, as shm_post's store is).
void shm_wake(ShmLine& line) noexcept;
/// shm_post on several lines at once: posts steps[k] on lines[k] without waiting for each store to be seen (the
/// sequentially consistent store of shm_post waits for its line to be this core's: one miss after another), then wakes
/// each line's sleepers (shm_wake; its first fence waits for all the stores, the others find none left).
void shm_post_lines(ShmLine* const* lines, const std::uint32_t* steps, int count) noexcept;

/// A doorbell (ShmSegment::bell): after a store that its owner may be waiting for, advances the bell's flag and wakes
/// the owner where it sleeps on it (nothing to do, beyond reading its sleepers, where it does not).
void shm_ring(ShmLine& bell) noexcept;
/// A waiter, having counted itself among `line`'s sleepers, read its flag (`seen`) and found nothing to do: sleeps
/// until the flag moves past `seen` or `timeout` passes (a spurious wake-up is possible).
void shm_sleep(ShmLine& line, std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept;
/// A spinning waiter's pause between two looks.
void shm_relax() noexcept;
/// Lets MPI progress what this process has in flight (MPI_Iprobe, which runs Open MPI's progress engine), as MPI's own
/// waits do: an eager MPI send may leave its data queued in the sender (TCP), to be written by its next MPI call, and a
/// rank waiting in shm makes none. Nothing where MPI is not running or provides less than MPI_THREAD_MULTIPLE.
void shm_mpi_progress() noexcept;

/// Waits until `ready()` returns true (true), or `deadline` passes or a signal arrives (shardkit/core/interrupt.hpp;
/// false). `ready` is asked at every look, and may make progress or throw. Spins, then yields, then sleeps on
/// `sleep_on`'s futex, at most 50 ms at a time so that the deadline and signals are seen: whoever makes `ready()` true
/// must post or ring that line then (shm_post, shm_ring).
template <typename Ready>
bool shm_wait_until(ShmLine& sleep_on, const WaitPolicy& policy, std::chrono::steady_clock::time_point deadline,
                    Ready&& ready) {
  for (int i = 0; i < policy.spins; ++i) {
    if (ready()) return true;
    shm_relax();
  }
  const InterruptibleWait waiting;
  using std::chrono::steady_clock;
  for (long k = 0;; ++k) {
    if (ready()) return true;
    if (interrupt_signal() != 0) return false;
    const auto now = (k & 7) == 0 || k >= policy.yields ? steady_clock::now() : steady_clock::time_point::min();
    if (now >= deadline) return false;
    if (k < policy.yields) {
      if ((k & 15) == 15) shm_mpi_progress();
      sched_yield();
      continue;
    }
    shm_mpi_progress();  // before each sleep: at most 50 ms apart
    // Counted among the sleepers before the last look (sequentially consistent with the poster's store and its read
    // of the sleepers: one of them sees the other), and until awake again, even where `ready` throws.
    struct Sleeper {
      ShmLine& line;
      explicit Sleeper(ShmLine& l) : line(l) {
        line.sleepers.fetch_add(1, std::memory_order_seq_cst);
        std::atomic_thread_fence(std::memory_order_seq_cst);
      }
      ~Sleeper() { line.sleepers.fetch_sub(1, std::memory_order_seq_cst); }
    } sleeper(sleep_on);
    const std::uint32_t seen = sleep_on.flag.load(std::memory_order_seq_cst);
    if (ready()) return true;
    const std::chrono::nanoseconds left = deadline == steady_clock::time_point::max()
                                              ? std::chrono::nanoseconds(std::chrono::milliseconds(50))
                                              : std::chrono::nanoseconds(deadline - now);
    shm_sleep(sleep_on, seen, std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(50)));
  }
}

}  // namespace shardkit::detail
