#include "backends/mpi/mpi_request.hpp"

#include <sched.h>

#include <mutex>
#include <thread>

#include "flight_recorder.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/interrupt.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

namespace {

// MPI_Testall, or MPI_Waitall when `block`, with the error of the request that failed (rather than
// MPI_ERR_IN_STATUS) raised as a BackendError: statuses (one per request) are always asked for, to find that error.
bool complete_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses, bool block) {
  MPI_Status* st = statuses.data();
  const int n = static_cast<int>(requests.size());
  int done = 1;
  int rc = MPI_SUCCESS;
  {
    const WorldErrorsReturned returned;  // Open MPI raises a nonblocking collective's error on MPI_COMM_WORLD
    rc = block ? MPI_Waitall(n, requests.data(), st) : MPI_Testall(n, requests.data(), &done, st);
  }
  if (rc == MPI_ERR_IN_STATUS)
    for (int i = 0; i < n; ++i)
      if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) {
        rc = st[i].MPI_ERROR;
        break;
      }
  if (rc != MPI_SUCCESS) throw_mpi_error(rc, block ? "MPI_Waitall()" : "MPI_Testall()", __FILE__, __LINE__);
  return done != 0;
}

}  // namespace

bool test_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses) {
  return complete_all(requests, statuses, false);
}

bool wait_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>* statuses, Clock::time_point deadline) {
  if (requests.empty()) return true;
  std::vector<MPI_Status> own;
  if (!statuses) own.resize(requests.size());
  std::vector<MPI_Status>& st = statuses ? *statuses : own;
  if (deadline == Clock::time_point::max() && !interrupt_handlers_installed()) return complete_all(requests, st, true);
  if (test_all(requests, st)) return true;
  // Spin briefly for latency, then yield, then sleep: ranks may outnumber cores. A signal ends the wait too.
  const InterruptibleWait waiting;
  for (long spin = 0;; ++spin) {
    if (test_all(requests, st)) return true;
    if (interrupt_signal() != 0) return false;
    if ((spin & 63) == 0 && Clock::now() >= deadline) return false;
    if (spin > 2000)
      std::this_thread::sleep_for(std::chrono::microseconds(spin > 20000 ? 200 : 20));
    else if (spin > 200)
      sched_yield();
  }
}

void cancel_receives(std::vector<MPI_Request>& requests) noexcept {
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
  requests.clear();
}

void raise_unfinished(const OpContext& ctx, AbortState& abort, const std::string& detail) {
  fail_current_operation();  // before the dump below: it records the operation as failed
  abort.aborted = true;
  const bool interrupted = interrupt_signal() != 0;
  abort.reason = interrupted ? concat(ctx.describe(), " was interrupted by a signal")
                             : concat(ctx.describe(), " timed out after ", ctx.timeout.count() / 1000.0, " s");
  // The job cannot continue safely on this communicator: ask the Runtime to end the job at exit instead of
  // finalising (which could hang on the operation left in flight).
  end_job_at_exit(abort.reason);
  if (interrupted)
    throw_interrupted(ctx.describe(), concat(detail, detail.empty() ? "" : "; ",
                                             "the communicator is aborted and the job will end at exit"));
  throw TimeoutError(concat(ctx.describe(), " did not complete within ", ctx.timeout.count() / 1000.0,
                            " s", detail.empty() ? "" : ": ", detail,
                            ". The communicator is aborted; the job will end at exit."));
}

void keep_forever(std::vector<Array> arrays) {
  if (arrays.empty()) return;
  static std::mutex mu;
  static auto* kept = new std::vector<std::vector<Array>>();  // never freed; reachable from here
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(arrays));
}

void keep_forever(std::shared_ptr<void> memory) {
  if (!memory) return;
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<void>>();  // never freed; reachable from here
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(memory));
}

void wait_or_raise(std::vector<MPI_Request>& requests, std::shared_ptr<void> buffers, const OpContext& ctx,
                   AbortState& abort, const std::string& detail) {
  if (wait_all(requests, nullptr, ctx.deadline)) return;
  keep_forever(std::move(buffers));  // the requests stay in flight (collectives cannot be cancelled)
  raise_unfinished(ctx, abort, detail);
}

PendingOp::~PendingOp() {
  if (!requests.empty()) abandon();
}

void PendingOp::abandon() noexcept {
  try {
    for (auto& [staged, dst] : copy_back) {
      keep_alive.push_back(std::move(staged));
      keep_alive.push_back(std::move(dst));
    }
    keep_forever(std::move(keep_alive));
  } catch (...) {
    // Out of memory: leaking without a trace still beats freeing memory MPI may write.
    new std::vector<Array>(std::move(keep_alive));
  }
  copy_back.clear();
  keep_alive.clear();
  requests.clear();
  on_complete = nullptr;
}

void PendingOp::finish(const std::vector<MPI_Status>& statuses) {
  requests.clear();
  for (auto& [staged, dst] : copy_back) dst.copy_from(staged);
  copy_back.clear();
  if (on_complete) on_complete(statuses);
  on_complete = nullptr;
  keep_alive.clear();
}

void complete(PendingOp& op, const OpContext& ctx, AbortState& abort) {
  std::vector<MPI_Status> statuses;
  if (op.want_statuses) statuses.resize(op.requests.size());
  if (!wait_all(op.requests, op.want_statuses ? &statuses : nullptr, ctx.deadline)) {
    // The requests (collectives among them) stay in flight: MPI cannot cancel them. The communicator is marked
    // aborted, the buffers are kept for good, and the job ends at exit.
    op.abandon();
    raise_unfinished(ctx, abort, "");
  }
  op.finish(statuses);
}

namespace {

class PendingMpi final : public Waitable {
 public:
  PendingMpi(PendingOp op, const OpContext& ctx, std::shared_ptr<AbortState> abort)
      : op_(std::move(op)), ctx_(ctx), name_(*ctx.comm_name), abort_(std::move(abort)) {
    ctx_.comm_name = &name_;
    ctx_.after = nullptr;
  }
  ~PendingMpi() override {
    // Dropped without waiting: complete it anyway so buffers are not freed under MPI (errors are only logged).
    if (!done_) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "shardkit: warning: pending %s failed: %s\n", op_name(ctx_.op), e.what());
      }
    }
  }
  void wait() override {
    if (done_) return;
    complete(op_, ctx_, *abort_);
    done_ = true;
  }
  bool is_complete() override {
    if (done_) return true;
    std::vector<MPI_Status> statuses(op_.requests.size());
    if (!test_all(op_.requests, statuses)) return false;
    op_.finish(statuses);
    done_ = true;
    return true;
  }

 private:
  PendingOp op_;
  OpContext ctx_;
  std::string name_;
  std::shared_ptr<AbortState> abort_;
  bool done_ = false;
};

}  // namespace

Token pending_token(PendingOp op, const OpContext& ctx, std::shared_ptr<AbortState> abort) {
  if (op.requests.empty()) {
    op.finish({});
    return Token();
  }
  return Token(std::make_shared<PendingMpi>(std::move(op), ctx, std::move(abort)));
}

}  // namespace shardkit::detail
