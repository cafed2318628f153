#include "backends/shm/shm_steps.hpp"

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {
namespace {
std::atomic<std::uint32_t> g_first_step{0};
std::atomic<std::uint64_t> g_first_ring_use{0};
}  // namespace

void shm_first_step_for_tests(std::uint32_t step, std::uint64_t ring_use) noexcept {
  g_first_step.store(step);
  g_first_ring_use.store(ring_use);
}

ShmSteps::ShmSteps(const ShmSegment& seg, int rank, const WaitPolicy& policy, std::vector<int> names, AbortState& abort)
    : seg_(seg),
      me_(rank),
      n_(seg.ranks()),
      policy_(policy),
      names_(std::move(names)),
      abort_(abort),
      step_(g_first_step.load()),
      ring_uses_(g_first_ring_use.load()),
      read_seen_(static_cast<std::size_t>(seg.ranks()), 0),
      root_bcasts_(static_cast<std::size_t>(seg.ranks()), 0) {}

void ShmSteps::begin(std::uint64_t size, bool one_way, const OpContext& ctx) {
  if (!one_way) settle(last_, ctx);
  size_ = size;
  word_ = (size & kSizeMask) | (ring_uses_ & kRingBitsMask) << kSizeBits;
}

int ShmSteps::next_set() {
  before_ = last_;
  last_ = SetUse{};
  set_ = static_cast<int>(uses_++ & 1U);
  prev_ = set_last_[set_];
  return set_;
}

// A step equal to what the set's lines held before this use (steps are 32 bits on the lines: after 2^32 of them) would
// be taken for unposted: it is skipped, on every rank alike.
std::uint32_t ShmSteps::next_step() {
  do {
    ++step_;
  } while (static_cast<std::uint32_t>(step_) == prev_);
  set_last_[set_] = static_cast<std::uint32_t>(step_);
  return static_cast<std::uint32_t>(step_);
}

std::uint32_t ShmSteps::peek_next_step() const noexcept {
  const std::uint32_t before = set_last_[uses_ & 1U];  // the prev_ of the set the next use takes
  std::uint64_t s = step_ + 1;
  if (static_cast<std::uint32_t>(s) == before) ++s;
  return static_cast<std::uint32_t>(s);
}

void ShmSteps::step(int set, const OpContext& ctx) {
  const std::uint32_t s = next_step();
  if (policy_.crowded) {
    post(set, s);
    wait_all(set, s, ctx);
    return;
  }
  // Where every rank has a CPU, the post does not wait for this rank's line to be its core's before the wait for the
  // others begins (the two cache misses overlap); whoever sleeps on the line is woken once this rank has seen every
  // post, or leaves with an error. Every rank that sleeps on it has posted this step already, so waking it late only
  // holds it while this rank waits for the others, whom it waits for too. Crowded ranks sleep often: woken at once.
  ShmLine& l = seg_.line(set, me_);
  l.size.store(word_, std::memory_order_relaxed);
  shm_post_unseen(l, s);
  struct Wake {
    ShmLine& line;
    ~Wake() { shm_wake(line); }
  } wake{l};
  wait_all(set, s, ctx);
}

void ShmSteps::post(int set, std::uint32_t s) {
  ShmLine& l = seg_.line(set, me_);
  l.size.store(word_, std::memory_order_relaxed);
  shm_post(l, s);
}

void ShmSteps::before_one_way(const OpContext& ctx) {
  if (before_.one_way)
    settle(before_, ctx);
  else
    settle(last_, ctx);
}

// Sizes are not compared here: a rank may be past that step by then (up to two broadcasts on) and posting the next
// one's, and each reader compared its size with the root's when it read.
void ShmSteps::settle(SetUse& u, const OpContext& ctx) {
  if (!u.pending) return;
  for (int p = 0; p < n_; ++p)
    if (p != me_) wait_posted(u.set, p, u.step, u.prev, ctx);
  u.pending = false;
}

void ShmSteps::wait_all(int set, std::uint32_t s, const OpContext& ctx) {
  for (int p = 0; p < n_; ++p)
    if (p != me_) wait_for(set, p, s, ctx);
}

void ShmSteps::wait_all_posted(int set, std::uint32_t s, const OpContext& ctx) {
  for (int p = 0; p < n_; ++p)
    if (p != me_) wait_posted(set, p, s, prev_, ctx);
}

void ShmSteps::wait_for(int set, int p, std::uint32_t s, const OpContext& ctx) {
  wait_posted(set, p, s, prev_, ctx);
  check_size(seg_.line(set, p), p, ctx);
}

void ShmSteps::check_size(const ShmLine& line, int p, const OpContext& ctx) {
  const std::uint64_t theirs = line.size.load(std::memory_order_relaxed);
  if ((theirs & kSizeMask) != (size_ & kSizeMask)) disagree(p, theirs & kSizeMask, ctx);
  if (theirs != word_) disagree_on_order(p, ctx);  // the same size, after another number of small bcasts
}

// Waits until rank p has posted step s in `set`, whose lines held `prev` before this use.
void ShmSteps::wait_posted(int set, int p, std::uint32_t s, std::uint32_t prev, const OpContext& ctx) {
  ShmLine& line = seg_.line(set, p);
  wait_until(
      line, [&] { return set_posted(line.flag.load(std::memory_order_acquire), s, prev); }, [] { return false; }, ctx,
      [&] { return set_behind(set, s, prev); });
}

// Never this rank: a one-way reduce's root waits before it posts.
std::string ShmSteps::set_behind(int set, std::uint32_t s, std::uint32_t prev) const {
  std::string names;
  for (int q = 0; q < n_; ++q)
    if (q != me_ && !set_posted(seg_.line(set, q).flag.load(std::memory_order_acquire), s, prev))
      names += concat(names.empty() ? "" : ", ", name(q));
  return names;
}

template <typename Posted, typename AlsoPosted, typename Missing>
bool ShmSteps::wait_until(ShmLine& line, Posted&& posted, AlsoPosted&& also_posted, const OpContext& ctx,
                          Missing&& missing) {
  if (posted()) return true;
  bool also = false;
  // Where the other line shows a post, `line` may have been posted since it was last read (and before the other line:
  // the root's next operation after this one): read again.
  if (shm_wait_until(line, policy_, ctx.deadline, [&] { return posted() || (also = also_posted()); }))
    return !also || posted();
  raise_unfinished(ctx, abort_, concat("rank(s) ", missing(), " did not arrive (shared memory)"));
}

// One-way, the root posts step s on its line of the current set and nothing there again before this rank has posted it
// too (it waits for this reader before it writes the set again): exactly. In a full handshake (a shared bcast) it may
// have gone on to the next step of the same use (it waited for this rank's post of s): reached. The root's next ring
// line use is the other path's: a root that posted it before posting s took that path (a small bcast). One that
// posted it after s has gone on to its next operation; one that sent a small bcast and then posted s for another
// operation posted s with another count of ring line uses (check_size).
void ShmSteps::wait_root(int set, int root, std::uint32_t s, bool exact, const OpContext& ctx) {
  ShmLine& line = seg_.line(set, root);
  const ShmLine& ring = seg_.ring_line(root, static_cast<int>(ring_uses_ % ShmSegment::kRingLines));
  const std::uint64_t use = ring_uses_ + 1;  // as a ring path would count this bcast's first piece
  const std::uint32_t prev = prev_;
  auto posted = [&] {
    const std::uint32_t f = line.flag.load(std::memory_order_acquire);
    return exact ? f == s : set_posted(f, s, prev);  // never prev: next_step skips it
  };
  auto on_ring = [&] { return ring_posted(ring, use); };
  if (!wait_until(line, posted, on_ring, ctx, [&] { return name(root); }))
    disagree(root, ring.size.load(std::memory_order_relaxed) & 0xFF, ctx);
  check_size(line, root, ctx);  // its count of ring line uses too: a root that sent a small bcast first differs
}

void ShmSteps::before_ring_write(int j, const OpContext& ctx) {
  RingUse& u = ring_[j];
  if (!u.pending) return;
  for (int p = 0; p < n_; ++p) {
    if (p == me_ || p == u.root || read_seen_[p] >= u.count) continue;
    ShmLine& line = seg_.read_line(p);
    wait_until(
        line, [&] { return (read_seen_[p] = line.size.load(std::memory_order_acquire)) >= u.count; },
        [] { return false; }, ctx, [&] { return ring_behind(u); });
  }
  u.pending = false;
}

// The readers of ring use u that have not posted that they read it.
std::string ShmSteps::ring_behind(const RingUse& u) const {
  std::string names;
  for (int q = 0; q < n_; ++q)
    if (q != u.root && q != me_ && seg_.read_line(q).size.load(std::memory_order_acquire) < u.count)
      names += concat(names.empty() ? "" : ", ", name(q));
  return names;
}

void ShmSteps::post_ring(std::span<const int> js, std::span<const std::uint64_t> uses) {
  std::array<ShmLine*, ShmSegment::kRingLines> lines{};
  std::array<std::uint32_t, ShmSegment::kRingLines> flags{};
  for (std::size_t k = 0; k < js.size(); ++k) {
    lines[k] = &seg_.ring_line(me_, js[k]);
    lines[k]->size.store(ring_word(uses[k], order_stamp(me_), size_), std::memory_order_relaxed);
    flags[k] = static_cast<std::uint32_t>(uses[k]);
  }
  shm_post_lines(lines.data(), flags.data(), static_cast<int>(js.size()));
}

// A root whose bcast is larger posts the next set step on its line of the set the next use takes, exactly (it posts
// nothing else there before this rank has posted too); a root that took the ring path may post it later, for its next
// operation: the ring line, posted first, then wins. The root may itself be waiting to write one of the lines still to
// come, for ranks that have not read their last use: those are named too.
void ShmSteps::wait_ring(int root, int j, std::uint64_t use, int pieces, const OpContext& ctx) {
  ShmLine& line = seg_.ring_line(root, j);
  const ShmLine& other = seg_.line(static_cast<int>(uses_ & 1U), root);
  const std::uint32_t next = peek_next_step();
  auto also = [&] { return other.flag.load(std::memory_order_acquire) == next; };
  auto missing = [&] {
    // The root, and the readers of the last uses of the lines still to come that have not read them (the root waits
    // for those before it writes any of its pieces).
    std::vector<bool> late(static_cast<std::size_t>(n_), false);
    for (int k = 0; k < pieces; ++k) {
      const RingUse& u = ring_[(j + k) % ShmSegment::kRingLines];
      for (int q = 0; q < n_; ++q)
        if (u.pending && q != u.root && q != root && seg_.read_line(q).size.load(std::memory_order_acquire) < u.count)
          late[q] = true;
    }
    std::string names = concat(name(root));
    for (int q = 0; q < n_; ++q)
      if (late[q]) names += concat(", ", name(q));
    return names;
  };
  auto posted = [&] { return ring_posted(line, use); };
  if (!wait_until(line, posted, also, ctx, missing)) {
    // The root posted its next set step instead: another operation, whose size may be this one's.
    const std::uint64_t theirs = other.size.load(std::memory_order_relaxed) & kSizeMask;
    if (theirs == size_) disagree_on_order(root, ctx);
    disagree(root, theirs, ctx);
  }
  const std::uint64_t word = line.size.load(std::memory_order_relaxed);
  if ((word & 0xFF) != size_) disagree(root, word & 0xFF, ctx);
  if (word >> 24 != order_stamp(root)) disagree_on_order(root, ctx);
}

void ShmSteps::ring_read(int j, int root, bool post) {
  ring_[j] = RingUse{ring_uses_, root, true};
  if (me_ == root || !post) return;
  ShmLine& line = seg_.read_line(me_);
  line.size.store(ring_uses_, std::memory_order_release);  // after the reads of the lines: the root may write them
  shm_post(line, static_cast<std::uint32_t>(ring_uses_));
}

void ShmSteps::disagree_on_order(int p, const OpContext& ctx) {
  abort_.aborted = true;
  abort_.reason = concat(ctx.describe(), ": the ranks disagree on the operations before it");
  request_abort_at_exit("the ranks disagree on the order of shared-memory operations");
  throw MismatchError(concat(ctx.describe(), ": rank ", name(p),
                             " ran another number of operations before it than rank ", name(me_),
                             " (shared memory): the ranks disagree on the order of operations. Rerun with ",
                             "SHARDKIT_CHECK=1 to have every rank name the mismatch; the job will end at exit"));
}

void ShmSteps::disagree(int p, std::uint64_t theirs, const OpContext& ctx) {
  abort_.aborted = true;
  abort_.reason = concat(ctx.describe(), ": the ranks disagree on its size");
  request_abort_at_exit("the ranks disagree on a shared-memory operation's size");
  throw MismatchError(concat(ctx.describe(), ": rank ", name(p), " posted ", theirs, " bytes, rank ", name(me_),
                             " has ", size_,
                             " (shared memory): the ranks disagree on this operation. Rerun with SHARDKIT_CHECK=1 ",
                             "to have every rank name the mismatch; the job will end at exit"));
}

}  // namespace shardkit::detail
