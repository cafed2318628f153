// The interrupt flag and the signal handlers (shardkit/core/interrupt.hpp), without MPI: a signal arriving inside an
// InterruptibleWait raises the flag (and the process lives on), the flag names its signal, and the Interrupted error
// names the operation and the signal.

#include <gtest/gtest.h>
#include <signal.h>

#include "shardkit/core/interrupt.hpp"

namespace shardkit {
namespace {

TEST(Interrupt, FlagStaysRaisedUntilCleared) {
  EXPECT_EQ(interrupt_signal(), 0);
  request_interrupt(SIGTERM);
  request_interrupt(SIGINT);  // the first signal is the one reported
  EXPECT_EQ(interrupt_signal(), SIGTERM);
  detail::clear_interrupt();
  EXPECT_EQ(interrupt_signal(), 0);
}

TEST(Interrupt, SignalDuringAWaitRaisesTheFlag) {
  ASSERT_TRUE(install_interrupt_handlers());
  EXPECT_TRUE(interrupt_handlers_installed());
  for (int sig : {SIGINT, SIGTERM}) {
    {
      const InterruptibleWait waiting;
      raise(sig);  // to this thread, at once; without the handler (or outside a wait) it would end the test process
    }
    EXPECT_EQ(interrupt_signal(), sig);
    detail::clear_interrupt();
  }
  uninstall_interrupt_handlers();
  EXPECT_FALSE(interrupt_handlers_installed());
  struct sigaction now = {};
  sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL) << "the previous handler is back";
}

TEST(Interrupt, InterruptedNamesTheOperationAndTheSignal) {
  request_interrupt(SIGINT);
  try {
    detail::throw_interrupted("recv #3 on communicator 'c'", "the communicator is aborted");
    ADD_FAILURE() << "no Interrupted";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInterrupted);
    EXPECT_EQ(e.signal(), SIGINT);
    EXPECT_STREQ(e.what(), "recv #3 on communicator 'c' was interrupted by SIGINT while waiting; the communicator is "
                           "aborted");
  }
  detail::clear_interrupt();
}

}  // namespace
}  // namespace shardkit
