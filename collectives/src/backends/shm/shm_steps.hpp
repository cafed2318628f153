#pragma once

// How the ranks of one shm backend take turns over its segment's two buffer sets (shm_segment.hpp): the handshake
// every step of every collective is.
//
// A rank writes its part into its slot (or, when small, into its own flag line), posts the step on its flag and waits
// until every rank has posted it. Operations alternate between the two buffer sets, so a set is written again only
// after every rank has passed a step of the other set, which it posts only once done reading this one. A bcast is
// one-way instead: the root posts its part and returns; the others wait for it, read, and post that they have read;
// nobody waits for those readers then (owe()). A small reduce is one-way the other way: every rank writes its part and
// posts, the root waits for all, folds and posts; nobody waits for the root (owe() again). Every rank's next operation
// but a one-way one first waits until all have posted that step (begin()), which keeps the rule above. A one-way
// operation after a one-way one waits only for the one before that (the last use of the set it writes:
// before_one_way()), so that a bcast's root, or a reduce's other ranks, run up to two operations ahead, as MPI's eager
// sends let them. A bcast small enough to travel in a few flag lines (ShmSegment::kRingBcastBytes) uses no buffer set:
// the root writes its pieces in the next lines of its own ring (kRingLines lines; the same lines on every rank), posts
// them together (shm_post_lines: one wait for the lines to be its core's, not one per line) and returns; each reader
// waits for each piece, reads it, and after the last posts on its read line how many ring lines it has read. Only
// before writing a ring line again does the root wait until every reader of that line's last use has read that many,
// so that a root may run a whole ring ahead. The root remembers the counts it saw and reads a reader's line again only
// once that is not enough: the line, written by its reader at every bcast, would otherwise cost a cache miss per bcast.
//
// Lines must never be taken for posted while they still hold an old post, however long ago it was made. Counters are
// 64 bits here; a flag holds their low 32 (the futex word), and a flag compared by how far it is from a step is only
// right within 2^31. So each kind of line has its own counter, which advances only when lines of that kind are posted:
// the buffer sets' steps, which every rank posts at every use of a set (a set line is never more than a few steps
// from the step waited for, and is taken for posted once it moved off the value its set's last use left and reached
// the step: its poster may have gone on, a single-copy operation's second handshake, a one-way operation's readers up
// to two operations on); the ring line uses of small bcasts, whose ring line (posted only when its rank is a root,
// possibly never for long) carries 48 bits of the use's count (the flag and its `size` word), with the bcast's size
// and the root's order stamp, and is waited for exactly; and each rank's count of ring lines read, whole in its read
// line's `size` word (posted only when its rank reads, which a rank that is root for long does not), compared in 64
// bits. (Before 2026-12 one 32-bit step counted both: past 2^31 steps a reader took an unposted ring line for posted, a
// root whose ring uses passed 2^31 took readers that read nothing as done and overwrote their lines, and an allreduce
// after 2^31 small bcasts alone read a rank's slot before it wrote it.) A bcast reader waits for the root's post on its
// path and watches the root's line of the other path (`also`), where the root would have posted had it taken that path
// for this operation: a root that did disagrees on the size. A ring post carries the root's order stamp (its set step
// and its count of small bcasts as root), which the reader's must equal: a root that ran an operation the reader did
// not (a set operation, or a small bcast of its own: the reader would take the next use for this one), then this bcast,
// disagrees on the operations. (A root whose extra small bcast comes just before this one, with this one's size, is
// read as this one: as with MPI, nothing tells them apart.)
//
// Every post carries the size of the operation (what every rank's must agree on); a reader that sees another size
// raises MismatchError, and a rank that does not come by the deadline gives the TimeoutError naming it.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend.hpp"
#include "backends/shm/shm_segment.hpp"

namespace shardkit::detail {

/// Tests: the step and the ring line use that the ShmSteps made from now on start from (0 by default), to reach the
/// counters' wrap within a test (the lines still hold 0, as if unposted since).
void shm_first_step_for_tests(std::uint32_t step, std::uint64_t ring_use = 0) noexcept;

class ShmSteps {
 public:
  /// `names`: the number messages give each rank (empty: its rank here).
  ShmSteps(const ShmSegment& seg, int rank, const WaitPolicy& policy, std::vector<int> names, AbortState& abort);

  /// Begins an operation whose ranks must agree on `size` bytes; all but a one-way one (a bcast, a small reduce) first
  /// wait until every rank has posted the last use's step (then every rank is done with both sets' last uses).
  void begin(std::uint64_t size, bool one_way, const OpContext& ctx);
  /// The set of the next use; that use is full (a handshake every rank waits for) unless owe() says otherwise.
  int next_set();
  /// The next step of the current set use (the same sequence on every rank), as its flags hold it.
  std::uint32_t next_step();
  /// One handshake in `set`: post the next step, then wait until every rank has posted it.
  void step(int set, const OpContext& ctx);
  /// Posts step s in `set` with the operation's size.
  void post(int set, std::uint32_t s);
  /// The last use was one-way (a bcast, a small reduce): not every rank is known to have posted step s yet.
  void owe(int set, std::uint32_t s) { last_ = SetUse{s, set, true, true, prev_}; }
  /// A one-way use writes the set that the use before the last one used: every rank must be done reading it.
  /// Readers of a one-way use post once done; those of a full one are done once they posted the next use's step.
  void before_one_way(const OpContext& ctx);
  /// Waits until every other rank has posted step s in `set` for an operation of this rank's size.
  void wait_all(int set, std::uint32_t s, const OpContext& ctx);
  /// wait_all without comparing sizes.
  void wait_all_posted(int set, std::uint32_t s, const OpContext& ctx);
  /// Waits until rank p has posted step s in `set`, for an operation of this rank's size.
  void wait_for(int set, int p, std::uint32_t s, const OpContext& ctx);
  /// A small bcast through `root`'s ring begins (every rank counts them per root).
  void begin_ring_bcast(int root) { ++root_bcasts_[root]; }
  /// Small bcasts through the roots' rings: the ring line the next piece uses (the same on every rank); its count
  /// among ring line uses is ring_use() then.
  int next_ring_line() { return static_cast<int>(ring_uses_++ % ShmSegment::kRingLines); }
  std::uint64_t ring_use() const { return ring_uses_; }
  /// Before the root writes line j of its ring: waits until every rank has read the last small bcast that used line j
  /// (of any root's ring).
  void before_ring_write(int j, const OpContext& ctx);
  /// The root posts ring line uses[k] on line js[k] of its ring, with the operation's size and its set step.
  void post_ring(std::span<const int> js, std::span<const std::uint64_t> uses);
  /// A bcast reader whose bcast is too large for the ring: waits until `root` has posted step s in `set` (the current
  /// use; `exact`: one-way, the root posts nothing there again before this rank has read), for an operation of this
  /// rank's size (a root that posted on its ring instead disagrees on the size). A timeout names the root alone: in a
  /// one-way bcast the other readers post only once the root has.
  void wait_root(int set, int root, std::uint32_t s, bool exact, const OpContext& ctx);
  /// Waits until `root` has posted ring line use `use` on line j of its ring, for an operation of this rank's size (a
  /// root that posted on its set line instead disagrees on the size; one whose set step differs from this rank's, on
  /// the operations). `pieces`: lines j, j + 1, ... the bcast still has to read (a timeout names the root, and the
  /// readers it may be waiting for before it writes any of them).
  void wait_ring(int root, int j, std::uint64_t use, int pieces, const OpContext& ctx);
  /// Every rank, root included, once it has read (or sent) the piece of a small bcast on line j: the readers post the
  /// count of ring lines read so far on their read lines, where `post` (after a bcast's last piece; the root has
  /// nothing to post: nobody waits for it to read its own).
  void ring_read(int j, int root, bool post = true);
  /// Rank p as messages name it: its rank in the user's communicator where this one is a node's part.
  int name(int p) const { return names_.empty() ? p : names_[p]; }

 private:
  // A use of a buffer set: one-way (bcast) or full (a handshake every rank waited for), its step, and the value its
  // set's lines held before it (what a line not yet posted in this use still holds).
  struct SetUse {
    std::uint32_t step = 0;
    int set = 0;
    bool one_way = false;
    bool pending = false;  // not every rank is known to have posted `step` yet (steps wrap: 0 is a step too)
    std::uint32_t prev = 0;
  };
  // Whether a set line whose use started from `prev` shows step s posted (or a later one).
  static bool set_posted(std::uint32_t flag, std::uint32_t s, std::uint32_t prev) noexcept {
    return flag != prev && reached(flag, s);
  }
  // A ring line's `size` word: the bcast's size (at most kRingBcastBytes: bits 0-7), bits 32-47 of the ring line use
  // it posts (its low 32 are the flag: 48 bits in all) and the root's order stamp (bits 24-63).
  static std::uint64_t ring_word(std::uint64_t use, std::uint64_t stamp, std::uint64_t bytes) noexcept {
    return stamp << 24 | ((use >> 32) & 0xFFFFu) << 8 | bytes;
  }
  static bool ring_posted(const ShmLine& line, std::uint64_t use) noexcept {
    return line.flag.load(std::memory_order_acquire) == static_cast<std::uint32_t>(use) &&
           ((line.size.load(std::memory_order_relaxed) >> 8) & 0xFFFFu) == ((use >> 32) & 0xFFFFu);
  }
  // What every rank knows of the operations before a small bcast from `root`, in 40 bits: its set step and how many
  // small bcasts that root has sent (this one included). A ring post carries its root's; the readers compare theirs.
  std::uint64_t order_stamp(int root) const noexcept {
    return (std::uint64_t{root_bcasts_[root]} & 0xFFFFFu) << 20 | (step_ & 0xFFFFFu);
  }
  // The step the next set use's first step will be (next_step), without taking it.
  std::uint32_t peek_next_step() const noexcept;
  [[noreturn]] void disagree_on_order(int p, const OpContext& ctx);

  void settle(SetUse& u, const OpContext& ctx);
  void wait_posted(int set, int p, std::uint32_t s, std::uint32_t prev, const OpContext& ctx);
  // The other ranks that have not posted step s in `set` since it held `prev`.
  std::string set_behind(int set, std::uint32_t s, std::uint32_t prev) const;
  // Waits, sleeping on `line`, until posted() (true) or, where given, also_posted() while posted() is not (false);
  // else raises the TimeoutError (or the interruption), naming missing()'s ranks.
  template <typename Posted, typename AlsoPosted, typename Missing>
  bool wait_until(ShmLine& line, Posted&& posted, AlsoPosted&& also_posted, const OpContext& ctx, Missing&& missing);
  // The readers of ring use u that have not posted that they read it.
  struct RingUse;
  std::string ring_behind(const RingUse& u) const;
  void check_size(const ShmLine& line, int p, const OpContext& ctx);
  [[noreturn]] void disagree(int p, std::uint64_t theirs, const OpContext& ctx);

  const ShmSegment& seg_;
  int me_, n_;
  WaitPolicy policy_;
  std::vector<int> names_;
  AbortState& abort_;
  std::uint64_t step_ = 0;                   // the last step taken
  std::uint32_t uses_ = 0;                   // buffer-set uses so far (their parity: the set)
  int set_ = 0;                              // the set of the current (or last) use
  std::uint32_t prev_ = 0;                   // what that set's lines held before it
  std::array<std::uint32_t, 2> set_last_{};  // what each set's lines hold after its last use (the same on every rank)
  SetUse last_, before_;    // the last two uses of the buffer sets
  std::uint64_t size_ = 0;  // the size of the running operation
  // What a set line's `size` word carries: the operation's size (bits 0-39; the agreement is on those bits) and the
  // poster's count of ring line uses (bits 40-63), so that a root that ran a small bcast the reader did not, then the
  // reader's operation, is told apart.
  static constexpr int kSizeBits = 40;
  static constexpr std::uint64_t kSizeMask = (std::uint64_t{1} << kSizeBits) - 1;
  static constexpr std::uint64_t kRingBitsMask = (std::uint64_t{1} << (64 - kSizeBits)) - 1;
  std::uint64_t word_ = 0;
  // A use of a ring line: its count among ring line uses and its root (whose readers must have read it before the line
  // is written again).
  struct RingUse {
    std::uint64_t count = 0;
    int root = 0;
    bool pending = false;
  };

  std::uint64_t ring_uses_ = 0;                         // ring lines used so far (a small bcast's pieces)
  std::array<RingUse, ShmSegment::kRingLines> ring_{};  // each ring line's last use
  // The count each rank's read line was last seen at (counts only grow: a count seen stays true).
  std::vector<std::uint64_t> read_seen_;
  std::vector<std::uint32_t> root_bcasts_;  // small bcasts each rank has sent as root (order_stamp)
};

}  // namespace shardkit::detail
