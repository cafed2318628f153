#include "shm/shm_steps.hpp"

#include <string>
#include <utility>

#include "mpi/mpi_request.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::detail {

ShmSteps::ShmSteps(const ShmSegment& seg, int rank, const WaitPolicy& policy, std::vector<int> names,
                   AbortState& abort)
    : seg_(seg), me_(rank), n_(seg.ranks()), policy_(policy), names_(std::move(names)), abort_(abort) {}

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
  post(set, s);
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
  const std::uint64_t theirs = seg_.line(set, p).size.load(std::memory_order_relaxed);
  if (theirs != size_) disagree(p, theirs, ctx);
}

// Waits until rank p has posted step s in `set` (or the deadline passes: fail()).
void ShmSteps::wait_posted(int set, int p, std::uint32_t s, const OpContext& ctx) {
  ShmLine& l = seg_.line(set, p);
  if (!reached(l.flag.load(std::memory_order_acquire), s) && !shm_wait(l, s, policy_, ctx.deadline))
    fail(set, s, ctx);
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

void ShmSteps::fail(int set, std::uint32_t s, const OpContext& ctx) {
  std::string missing;
  for (int p = 0; p < n_; ++p)
    if (!reached(seg_.line(set, p).flag.load(std::memory_order_acquire), s))
      missing += concat(missing.empty() ? "" : ", ", name(p));
  raise_unfinished(ctx, abort_, concat("rank(s) ", missing, " did not arrive (shared memory)"));
}

}  // namespace shardkit::detail
