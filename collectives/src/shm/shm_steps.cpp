#include "shm/shm_steps.hpp"

#include <atomic>
#include <string>
#include <utility>

#include "mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::detail {
namespace {
std::atomic<std::uint32_t> g_first_step{0};
}  // namespace

void shm_first_step_for_tests(std::uint32_t step) noexcept {
  g_first_step.store(step);
}

ShmSteps::ShmSteps(const ShmSegment& seg, int rank, const WaitPolicy& policy, std::vector<int> names, AbortState& abort)
    : seg_(seg),
      me_(rank),
      n_(seg.ranks()),
      policy_(policy),
      names_(std::move(names)),
      abort_(abort),
      step_(g_first_step.load()),
      read_seen_(static_cast<std::size_t>(seg.ranks()), 0) {}

void ShmSteps::begin(std::uint64_t size, bool one_way, const OpContext& ctx) {
  if (!one_way) settle(last_, ctx);
  size_ = size;
}

int ShmSteps::next_set() {
  before_ = last_;
  last_ = SetUse{};
  return static_cast<int>(uses_++ & 1U);
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
  l.size.store(size_, std::memory_order_relaxed);
  shm_post_unseen(l, s);
  struct Wake {
    ShmLine& line;
    ~Wake() { shm_wake(line); }
  } wake{l};
  wait_all(set, s, ctx);
}

void ShmSteps::post(int set, std::uint32_t s) {
  ShmLine& l = seg_.line(set, me_);
  l.size.store(size_, std::memory_order_relaxed);
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
  wait_all_posted(u.set, u.step, ctx);
  u.pending = false;
}

void ShmSteps::wait_all(int set, std::uint32_t s, const OpContext& ctx) {
  for (int p = 0; p < n_; ++p)
    if (p != me_) wait_for(set, p, s, ctx);
}

void ShmSteps::wait_all_posted(int set, std::uint32_t s, const OpContext& ctx) {
  for (int p = 0; p < n_; ++p)
    if (p != me_) wait_posted(set, p, s, ctx);
}

void ShmSteps::wait_for(int set, int p, std::uint32_t s, const OpContext& ctx) {
  wait_posted(set, p, s, ctx);
  check_size(seg_.line(set, p), p, ctx);
}

void ShmSteps::check_size(const ShmLine& line, int p, const OpContext& ctx) {
  const std::uint64_t theirs = line.size.load(std::memory_order_relaxed);
  if (theirs != size_) disagree(p, theirs, ctx);
}

// Waits until rank p has posted step s in `set`.
void ShmSteps::wait_posted(int set, int p, std::uint32_t s, const OpContext& ctx) {
  wait_line(seg_.line(set, p), s, ctx, [&] { return set_behind(set, s); });
}

// Never this rank: a one-way reduce's root waits before it posts.
std::string ShmSteps::set_behind(int set, std::uint32_t s) const {
  return behind([&](int q) -> ShmLine& { return seg_.line(set, q); }, s, me_);
}

template <typename Missing>
bool ShmSteps::wait_line(ShmLine& line, std::uint32_t s, const OpContext& ctx, Missing&& missing, const ShmLine* also,
                         StepMatch match) {
  auto posted = [&] { return matches(line.flag.load(std::memory_order_acquire), s, match); };
  if (posted()) return true;
  // Where `also` matched s, `line` may have too since it was last read: read again.
  if (shm_wait(line, s, policy_, ctx.deadline, also, match)) return posted();
  raise_unfinished(ctx, abort_, concat("rank(s) ", missing(), " did not arrive (shared memory)"));
}

void ShmSteps::wait_root(int set, int root, std::uint32_t s, const OpContext& ctx) {
  wait_bcast_root(seg_.line(set, root), seg_.ring_line(root, static_cast<int>(ring_uses_ % ShmSegment::kRingLines)),
                  root, s, ctx, [&] { return set_behind(set, s); });
}

// A bcast reader: waits until `root` has posted step s on `line`, for an operation of this rank's size. A root that
// posted on `other` (the line of the other path: the ring, or its set line) disagrees on the size. Exactly: the root
// writes neither line again before this rank has read (or, on the other path, failed).
template <typename Missing>
void ShmSteps::wait_bcast_root(ShmLine& line, const ShmLine& other, int root, std::uint32_t s, const OpContext& ctx,
                               Missing&& missing) {
  if (!wait_line(line, s, ctx, missing, &other, StepMatch::kExact))
    disagree(root, other.size.load(std::memory_order_relaxed), ctx);
  check_size(line, root, ctx);
}

template <typename LineOf>
std::string ShmSteps::behind(LineOf&& line_of, std::uint32_t s, int skip) const {
  std::string names;
  for (int q = 0; q < n_; ++q)
    if (q != skip && !reached(line_of(q).flag.load(std::memory_order_acquire), s))
      names += concat(names.empty() ? "" : ", ", name(q));
  return names;
}

void ShmSteps::before_ring_write(int j, const OpContext& ctx) {
  RingUse& u = ring_[j];
  if (!u.pending) return;
  for (int p = 0; p < n_; ++p) {
    if (p == me_ || p == u.root || reached(read_seen_[p], u.count)) continue;
    ShmLine& line = seg_.read_line(p);
    wait_line(line, u.count, ctx, [&] { return ring_behind(u); });
    read_seen_[p] = line.flag.load(std::memory_order_acquire);
  }
  u.pending = false;
}

// The readers of ring use u that have not posted that they read it.
std::string ShmSteps::ring_behind(const RingUse& u) const {
  return behind([&](int q) -> ShmLine& { return seg_.read_line(q); }, u.count, u.root);
}

void ShmSteps::post_ring(std::span<const int> js, std::uint32_t first) {
  std::array<ShmLine*, ShmSegment::kRingLines> lines{};
  for (std::size_t k = 0; k < js.size(); ++k) {
    lines[k] = &seg_.ring_line(me_, js[k]);
    lines[k]->size.store(size_, std::memory_order_relaxed);
  }
  shm_post_lines(lines.data(), static_cast<int>(js.size()), first);
}

// A root whose bcast is larger posts on its set line instead (the set its next use takes). The root may itself be
// waiting to reuse the line, for ranks that have not read its last use: those are named too.
void ShmSteps::wait_ring(int root, int j, std::uint32_t s, const OpContext& ctx) {
  wait_bcast_root(seg_.ring_line(root, j), seg_.line(static_cast<int>(uses_ & 1U), root), root, s, ctx, [&] {
    const std::string late = ring_[j].pending ? ring_behind(ring_[j]) : "";
    return concat(name(root), late.empty() ? "" : ", ", late);
  });
}

void ShmSteps::ring_read(int j, int root, bool post) {
  ring_[j] = RingUse{ring_uses_, root, true};
  if (me_ != root && post) shm_post(seg_.read_line(me_), ring_uses_);
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
