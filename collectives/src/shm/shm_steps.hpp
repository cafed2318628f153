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
// Steps are 32 bits and wrap, and a line unposted for 2^31 steps (or never: 0) has reached every step. A bcast reader
// therefore waits for the root's step exactly, on its ring line and its set line: the root posts neither again before
// this reader has read (or, on the other path, raised), and some roots never post their ring lines (before 2026-11-29,
// once the steps passed 2^31, a reader of such a root's bcast took the line for posted without waiting: a MismatchError
// naming 0 bytes where the line was never posted, the line's old bytes where its last use had the reader's size). The
// other waits take reached(): their posters may have gone on (a single-copy operation's second handshake on the same
// set, a one-way operation's readers up to two operations on), and every set is posted at least every other set use;
// only a run of 2^31 steps of small bcasts alone would leave a set line that stale.
//
// Every post carries the size of the operation (what every rank's must agree on); a reader that sees another size
// raises MismatchError, and a rank that does not come by the deadline gives the TimeoutError naming it.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend.hpp"
#include "shm/shm_segment.hpp"

namespace shardkit::detail {

/// Tests: the step that the ShmSteps made from now on start from (0 by default), to reach the steps' wrap within a
/// test.
void shm_first_step_for_tests(std::uint32_t step) noexcept;

class ShmSteps {
 public:
  /// `names`: the number messages give each rank (empty: its rank here).
  ShmSteps(const ShmSegment& seg, int rank, const WaitPolicy& policy, std::vector<int> names, AbortState& abort);

  /// Begins an operation whose ranks must agree on `size` bytes; all but a one-way one (a bcast, a small reduce) first
  /// wait until every rank has posted the last use's step (then every rank is done with both sets' last uses).
  void begin(std::uint64_t size, bool one_way, const OpContext& ctx);
  /// The set of the next use; that use is full (a handshake every rank waits for) unless owe() says otherwise.
  int next_set();
  /// The next step number (the same sequence on every rank).
  std::uint32_t next_step() { return ++step_; }
  /// One handshake in `set`: post the next step, then wait until every rank has posted it.
  void step(int set, const OpContext& ctx);
  /// Posts step s in `set` with the operation's size.
  void post(int set, std::uint32_t s);
  /// The last use was one-way (a bcast, a small reduce): not every rank is known to have posted step s yet.
  void owe(int set, std::uint32_t s) { last_ = SetUse{s, set, true, true}; }
  /// A one-way use writes the set that the use before the last one used: every rank must be done reading it.
  /// Readers of a one-way use post once done; those of a full one are done once they posted the next use's step.
  void before_one_way(const OpContext& ctx);
  /// Waits until every other rank has posted step s in `set` for an operation of this rank's size.
  void wait_all(int set, std::uint32_t s, const OpContext& ctx);
  /// wait_all without comparing sizes.
  void wait_all_posted(int set, std::uint32_t s, const OpContext& ctx);
  /// Waits until rank p has posted step s in `set`, for an operation of this rank's size.
  void wait_for(int set, int p, std::uint32_t s, const OpContext& ctx);
  /// Small bcasts through the roots' rings: the ring line the next one uses (the same on every rank).
  int next_ring_line() { return static_cast<int>(ring_uses_++ % ShmSegment::kRingLines); }
  /// Before the root writes line j of its ring: waits until every rank has read the last small bcast that used line j
  /// (of any root's ring).
  void before_ring_write(int j, const OpContext& ctx);
  /// The root posts steps first, first + 1, ... on lines js of its ring, with the operation's size.
  void post_ring(std::span<const int> js, std::uint32_t first);
  /// A bcast reader whose bcast is too large for the ring: waits until `root` has posted step s in `set`, for an
  /// operation of this rank's size (a root that posted on its ring instead disagrees on the size).
  void wait_root(int set, int root, std::uint32_t s, const OpContext& ctx);
  /// Waits until `root` has posted step s on line j of its ring, for an operation of this rank's size (a root that
  /// posted on its set line instead disagrees on the size).
  void wait_ring(int root, int j, std::uint32_t s, const OpContext& ctx);
  /// Every rank, root included, once it has read (or sent) the piece of a small bcast on line j: the readers post the
  /// count of ring lines read so far on their read lines, where `post` (after a bcast's last piece; the root has
  /// nothing to post: nobody waits for it to read its own).
  void ring_read(int j, int root, bool post = true);
  /// Rank p as messages name it: its rank in the user's communicator where this one is a node's part.
  int name(int p) const { return names_.empty() ? p : names_[p]; }

 private:
  // A use of a buffer set: one-way (bcast) or full (a handshake every rank waited for), and its step.
  struct SetUse {
    std::uint32_t step = 0;
    int set = 0;
    bool one_way = false;
    bool pending = false;  // not every rank is known to have posted `step` yet (steps wrap: 0 is a step too)
  };

  void settle(SetUse& u, const OpContext& ctx);
  void wait_posted(int set, int p, std::uint32_t s, const OpContext& ctx);
  // The other ranks that have not posted step s in `set`.
  std::string set_behind(int set, std::uint32_t s) const;
  // Waits until `line` matches step s (true), or `also`, where given, matches it first (false), as `match` compares;
  // else raises the TimeoutError (or the interruption), naming missing()'s ranks.
  template <typename Missing>
  bool wait_line(ShmLine& line, std::uint32_t s, const OpContext& ctx, Missing&& missing, const ShmLine* also = nullptr,
                 StepMatch match = StepMatch::kReached);
  template <typename Missing>
  void wait_bcast_root(ShmLine& line, const ShmLine& other, int root, std::uint32_t s, const OpContext& ctx,
                       Missing&& missing);
  // The ranks but `skip` whose line_of(rank) has not reached step s.
  template <typename LineOf>
  std::string behind(LineOf&& line_of, std::uint32_t s, int skip = -1) const;
  void check_size(const ShmLine& line, int p, const OpContext& ctx);
  [[noreturn]] void disagree(int p, std::uint64_t theirs, const OpContext& ctx);

  const ShmSegment& seg_;
  int me_, n_;
  WaitPolicy policy_;
  std::vector<int> names_;
  AbortState& abort_;
  std::uint32_t step_ = 0;  // the last step posted
  std::uint32_t uses_ = 0;  // buffer-set uses so far
  SetUse last_, before_;    // the last two uses of the buffer sets
  std::uint64_t size_ = 0;  // the size of the running operation
  // A use of a ring line: its count among ring line uses and its root (whose readers must have read it before the line
  // is written again).
  struct RingUse {
    std::uint32_t count = 0;
    int root = 0;
    bool pending = false;
  };
  std::string ring_behind(const RingUse& u) const;

  std::uint32_t ring_uses_ = 0;                         // ring lines used so far (a small bcast's pieces)
  std::array<RingUse, ShmSegment::kRingLines> ring_{};  // each ring line's last use
  // The count each rank's read line was last seen at (counts only grow: a count seen stays true). Counts, not steps:
  // a step seen before 2^31 other operations would compare wrongly after them; ring line uses pass each count in turn.
  std::vector<std::uint32_t> read_seen_;
};

}  // namespace shardkit::detail
