// Waits that a signal ends (shardkit/core/interrupt.hpp): a wait for MPI requests for a message that never comes
// returns as soon as SIGINT or SIGTERM arrives (through the handlers the Runtime installed) or the
// flag is raised. Rank-local: each rank waits on MPI_COMM_SELF for a message nobody sends, so no peer is disturbed.
// (What an operation then raises, and that the job ends, is the process-level tests' part: tests/python.)

#include <signal.h>

#include <chrono>
#include <thread>

#include "collective_test_util.hpp"
#include "backends/mpi/mpi_request.hpp"
#include "shardkit/core/interrupt.hpp"

namespace shardkit::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A receive nobody will match; cancelled when the test is done with it.
struct OrphanReceive {
  int value = 0;
  std::vector<MPI_Request> req{MPI_REQUEST_NULL};
  OrphanReceive() { MPI_Irecv(&value, 1, MPI_INT, 0, 4242, MPI_COMM_SELF, req.data()); }
  ~OrphanReceive() { detail::cancel_receives(req); }
};

// Waits (deadline: 5 s) while `interrupt` runs on another thread after 200 ms; returns how long the wait took.
template <typename F>
Clock::duration interrupted_wait(F interrupt, bool* finished) {
  OrphanReceive r;
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    interrupt();
  });
  const auto start = Clock::now();
  *finished = detail::wait_all(r.req, nullptr, start + 5s);
  const auto took = Clock::now() - start;
  t.join();
  detail::clear_interrupt();
  return took;
}

TEST(Interrupt, RaisedFlagEndsAWait) {
  bool finished = true;
  const auto took = interrupted_wait([] { request_interrupt(SIGINT); }, &finished);
  EXPECT_FALSE(finished) << "the message nobody sent arrived";
  EXPECT_LT(took, 2s);
  EXPECT_GE(took, 150ms);
}

TEST(Interrupt, SignalsEndAWaitThroughTheRuntimesHandlers) {
  ASSERT_TRUE(interrupt_handlers_installed()) << "the Runtime installs them unless SHARDKIT_HANDLE_SIGNALS=0";
  for (int sig : {SIGINT, SIGTERM}) {
    bool finished = true;
    // Sent to the process (any thread may run the handler), as kill(1) would.
    const auto took = interrupted_wait([sig] { kill(getpid(), sig); }, &finished);
    EXPECT_FALSE(finished) << sig;
    EXPECT_LT(took, 2s) << sig;
  }
}

}  // namespace
}  // namespace shardkit::testing
