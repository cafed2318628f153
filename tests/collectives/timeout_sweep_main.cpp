// Every operation of the table honours the timeout: one body swept over OpKind, so that a new operation is covered
// without a new test. Rank 0 takes part in nothing after the set-up (it is the root of the rooted operations and the
// peer of the point-to-point ones, with messages far above any eager limit); every other rank runs each operation on a
// communicator of its own and must, within the timeout plus a margin, raise TimeoutError naming that operation, or
// complete where the operation legitimately does not need rank 0 (a leaf of a reduction tree). At least one rank must
// time out in each operation. Rank 0 collects every rank's outcomes and prints the verdict:
//   "timeout sweep (<mode>, <n> ranks): passed, <k> operations" or "timeout sweep FAILED: ...".
// Every rank then leaves with _Exit (operations are left in flight on the aborted communicators).
//   timeout_sweep_main unchecked   blocking calls polled against the deadline (the data phase times out)
//   timeout_sweep_main checked     SHARDKIT_CHECK on: the signature exchange times out (collectives), the data phase
//                                  (point-to-point)
//   timeout_sweep_main async       pending tokens (CommOptions::async): waiting for the token times out
//   timeout_sweep_main unchecked gpu   the rank's GPU buffers: NCCL where it implements the operation (the token's
//                                      poll times out and aborts the NCCL communicator), MPI for the others

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/runtime.hpp"

namespace {

using namespace shardkit;
using Seconds = std::chrono::duration<double>;

constexpr auto kTimeout = std::chrono::milliseconds(750);
constexpr double kMarginS = 5.0;  // scheduling on an oversubscribed machine
constexpr int kMissing = 0;       // the rank that never comes
constexpr std::int64_t kRow = 65536;  // float32 elements per rank's block: 256 KiB, past every eager limit

enum Outcome : int { kTimedOut = 0, kCompleted = 1, kWrongError = 2, kTooLate = 3, kWrongName = 4 };

// The arrays of one operation's call, kept alive while a timed-out operation stays in flight.
struct Call {
  Array x, out;
  std::vector<std::int64_t> send_counts, recv_counts;
  OpArgs args;
};

// Rank r's call of `op` with rank kMissing as root and peer. The value rule gives the arrays of every operation that
// has a value form; the others (send, barrier, alltoallv; allgatherv, whose value form first exchanges lengths) are
// built from the same row of the table. x has one row per rank, so that the rules that split the leading dimension
// (reduce_scatter, scatter, alltoall) hold. `c` stays where it is: the arguments point into it.
void fill_call(Call& c, OpKind op, int rank, int size, Device where) {
  c.x = Array::zeros({size, kRow}, DType::kFloat32, where);
  c.args.root = kMissing;
  c.args.dest = kMissing;
  c.args.source = kMissing;
  const ValueRule rule = value_rule(op);
  if (rule == ValueRule::kNone || rule == ValueRule::kConcat) {
    const std::int64_t n = c.x.numel();
    c.send_counts.assign(static_cast<std::size_t>(size), kRow);
    c.recv_counts.assign(static_cast<std::size_t>(size), rule == ValueRule::kConcat ? n : kRow);
    std::int64_t total = 0;
    for (std::int64_t k : c.recv_counts) total += k;
    c.out = Array::zeros({total}, DType::kFloat32, where);
    c.args.send = &c.x;
    c.args.recv = &c.out;
    c.args.send_counts = c.send_counts;
    c.args.recv_counts = c.recv_counts;
    return;
  }
  if (!value_is_input(op, rank, kMissing))
    c.out = Array::zeros(value_shape(op, c.x.shape(), rank, size, kMissing), DType::kFloat32, where);
  bind_value(op, c.x, c.out, c.args, rank);
  if (!c.args.send) c.args.send = &c.x;  // sendrecv sends x (its value rule only shapes the result)
}

// Ends the process with a verdict when an operation outlives its deadline by far (a wait that ignores the deadline
// would otherwise hang until ctest kills the job, saying nothing about which operation).
class Watchdog {
 public:
  Watchdog()
      : thread_([this] {
          while (!stop_) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            const int op = op_;
            if (op < 0) continue;
            const double s = Seconds(std::chrono::steady_clock::now().time_since_epoch()).count() - start_;
            if (s > kTimeout.count() / 1000.0 + 2 * kMarginS) {
              std::printf("timeout sweep FAILED: %s still waiting after %.1f s (deadline %.2f s)\n",
                          op_name(static_cast<OpKind>(op)), s, kTimeout.count() / 1000.0);
              std::fflush(stdout);
              std::_Exit(1);
            }
          }
        }) {}
  ~Watchdog() {
    stop_ = true;
    thread_.join();
  }
  void watch(int op) {
    start_ = Seconds(std::chrono::steady_clock::now().time_since_epoch()).count();
    op_ = op;
  }

 private:
  std::atomic<int> op_{-1};
  std::atomic<double> start_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "unchecked";
  const bool gpu = argc > 2 && std::string(argv[2]) == "gpu";
  const Device where = gpu ? rt.device() : Device::cpu();
  if (gpu && where.kind != DeviceKind::kCUDA) {
    std::printf("timeout sweep FAILED: no GPU on rank %d\n", rt.rank());
    return 1;
  }
  CommOptions o;
  o.check = mode == "checked";
  o.async = mode == "async";
  o.timeout = kTimeout;
  // One communicator per operation, made by every rank (and used once by all of them on the sweep's buffers, which
  // also makes checked mode's private duplicate and sets NCCL up) before rank 0 goes missing: only the operations
  // themselves can time out below.
  std::vector<std::shared_ptr<Communicator>> comms;
  for (int k = 0; k < kOpCount; ++k) {
    o.name = std::string("sweep-") + op_name(static_cast<OpKind>(k));
    comms.push_back(Communicator::world(rt, o));
    comms.back()->allreduce(Array::zeros({1}, DType::kFloat32, where), ReduceOp::kSum).token.wait();
  }
  const int rank = comms[0]->rank(), size = comms[0]->size();
  std::vector<int> outcomes(kOpCount, kCompleted);
  std::vector<Call> in_flight;  // never freed before the job ends: MPI may still read or write them
  in_flight.reserve(kOpCount);
  if (rank != kMissing) {
    Watchdog watchdog;
    for (int k = 0; k < kOpCount; ++k) {
      watchdog.watch(k);
      const auto op = static_cast<OpKind>(k);
      Call& c = in_flight.emplace_back();
      fill_call(c, op, rank, size, where);
      const auto start = std::chrono::steady_clock::now();
      try {
        comms[k]->run(op, c.args).wait();
        outcomes[k] = kCompleted;
      } catch (const TimeoutError& e) {
        const double s = Seconds(std::chrono::steady_clock::now() - start).count();
        const std::string msg = e.what();
        // "allreduce #3 on", "send on": collectives carry their sequence number, point-to-point operations none.
        const std::string name = std::string(op_name(op)) + (op_traits(op).collective ? " #" : " on ");
        const std::string comm_text = "communicator '" + comms[k]->name() + "'";
        outcomes[k] = s > kTimeout.count() / 1000.0 + kMarginS                                  ? kTooLate
                      : msg.find(name) == std::string::npos || msg.find(comm_text) == std::string::npos ? kWrongName
                                                                                                  : kTimedOut;
        std::printf("rank %d: %s: TimeoutError after %.2f s: %s\n", rank, op_name(op), s, e.what());
      } catch (const std::exception& e) {
        outcomes[k] = kWrongError;
        std::printf("rank %d: %s: unexpected error: %s\n", rank, op_name(op), e.what());
      }
      std::fflush(stdout);
    }
    watchdog.watch(-1);
  }
  // Every rank's outcomes to rank 0, over MPI_COMM_WORLD (untouched by the sweep).
  std::vector<int> all(static_cast<std::size_t>(kOpCount * size));
  MPI_Gather(outcomes.data(), kOpCount, MPI_INT, all.data(), kOpCount, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::string failures;
    for (int k = 0; k < kOpCount; ++k) {
      int timed_out = 0;
      for (int r = 0; r < size; ++r) {
        if (r == kMissing) continue;
        const int v = all[static_cast<std::size_t>(r * kOpCount + k)];
        if (v == kTimedOut) ++timed_out;
        static const char* const kWhat[] = {"", "", "raised another error", "timed out too late",
                                            "raised a TimeoutError that does not name it"};
        if (v >= kWrongError) failures += std::string(" ") + op_name(static_cast<OpKind>(k)) + ": rank " +
                                          std::to_string(r) + " " + kWhat[v] + ";";
      }
      if (size > 1 && timed_out == 0)
        failures += std::string(" ") + op_name(static_cast<OpKind>(k)) + ": no rank timed out;";
    }
    if (failures.empty())
      std::printf("timeout sweep (%s%s, %d ranks): passed, %d operations\n", mode.c_str(), gpu ? " gpu" : "", size,
                  kOpCount);
    else
      std::printf("timeout sweep FAILED (%s, %d ranks):%s\n", mode.c_str(), size, failures.c_str());
    std::fflush(stdout);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // lets mpirun forward the output first
  // Every rank leaves at once, without MPI_Finalize (unsafe with operations in flight) and without the abort path
  // (which the timeout tests check): when three ranks called MPI_Abort together, mpirun once failed to end the job
  // (a loaded CI run).
  std::_Exit(0);
}
