#pragma once

// bench_collectives' pieces: the options, one entry per collective (as nccl-tests' testColl: its name, buffer sizes,
// busbw factor, and a run function that hands shardkit's call and the raw MPI call on the same buffers to measure()),
// and the measurement every entry shares: result check, warm-up, repeats alternating the two sides.

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/array.hpp"
#include "timing.hpp"

namespace shardkit::bench {

struct CollectiveTest;

/// The command line.
struct Options {
  std::int64_t min_bytes = 8;
  std::int64_t max_bytes = std::int64_t{64} << 20;
  std::int64_t factor = 4;
  int iters = 20;
  int warmup = 5;
  int repeats = 5;
  bool check = true;  // nccl-tests checks by default too; it costs one extra call of each side per size
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  std::vector<const CollectiveTest*> collectives;
  std::string json;      // "" none, "-" stdout
  bool checked = false;  // shardkit's checked mode, to show its cost
  bool aa = false;       // A/A calibration: the shardkit column runs the raw MPI call too
  bool help = false;
};

/// The usage text (-h).
const char* usage_text();

/// Parses and validates the command line (every rank alike). @throws UsageError.
Options parse_args(int argc, char** argv);

/// The message sizes -b, -e and -f ask for.
std::vector<std::int64_t> message_sizes(const Options& o);

/// Buffer sizes of one operation for a requested message size, as nccl-tests' GetCollByteCount works them out.
struct Layout {
  std::int64_t send_count = 0;  ///< elements of the send buffer (bcast: of the one in-place buffer)
  std::int64_t recv_count = 0;  ///< elements of the receive buffer
  std::int64_t count = 0;       ///< the count nccl-tests prints: per rank (allgather: sent, reduce_scatter: received)
  std::int64_t bytes = 0;       ///< the size nccl-tests prints: the larger of the two buffers
};

/// What one run function works with: the two sides' communicators and the raw MPI arguments.
struct Bench {
  const Options& opt;
  Communicator& comm;
  MPI_Comm raw;      ///< the baseline's communicator
  MPI_Comm control;  ///< barriers, timing and check reductions: neither measured communicator sees extra traffic
  MPI_Datatype type;
  MPI_Op op;
  int rank = 0;
  int size = 1;
};

/// One measured size of one operation.
struct Row {
  const CollectiveTest* test = nullptr;
  Layout layout;
  Stats shardkit, mpi;      ///< per-call microseconds
  Stats limit;              ///< a plain memcpy of the message's bytes (Layout::bytes) on each rank: the "limit" column
  std::int64_t wrong = -1;  ///< elements that differ, summed over ranks; -1 when not checked

  double algbw(const Stats& s) const { return static_cast<double>(layout.bytes) / (s.median * 1e-6) / 1e9; }
  double ratio_median() const { return shardkit.median / mpi.median; }
  double ratio_min() const { return shardkit.min / mpi.min; }
  double extra_us() const { return shardkit.median - mpi.median; }
};

/// One collective, as one file defines it.
struct CollectiveTest {
  const char* name;
  bool reduces;  ///< takes -o
  int root;      ///< the root printed in the table; -1 for none
  /// nccl-tests' busbw = algbw * factor: what each rank's link must carry for the algorithm-independent optimum.
  double (*bus_factor)(int ranks);
  /// Send and receive counts from the element count asked for and its share per rank (`block`, at least 1).
  Layout (*counts)(std::int64_t count, std::int64_t block, int ranks);
  /// Measures one size (Row::test is filled in by the caller).
  Row (*run)(const Bench& b, const Layout& l);
};

/// Counts of the operations that send and receive the whole message (allreduce, bcast, sendrecv).
Layout whole_message(std::int64_t count, std::int64_t block, int ranks);

/// Bus factor (n - 1) / n: each rank's link carries every share but its own (allgather, reduce_scatter, alltoall).
double share_factor(int ranks);

/// Bus factor 1: the whole message crosses each link once (bcast, sendrecv).
double unit_factor(int ranks);

/// Every collective, in the order --op all runs them.
std::span<const CollectiveTest* const> all_collectives();

/// The layout of `t` for a requested message size: element counts rounded down to whole blocks, never to zero.
Layout layout_for(const CollectiveTest& t, std::int64_t bytes, std::size_t itemsize, int ranks);

/// The baseline's MPI datatype for `d`; none where MPI has no native one (float16, bfloat16, bool).
std::optional<MPI_Datatype> raw_datatype(DType d);

/// The MPI reduction for `op`.
MPI_Op raw_op(ReduceOp op);

/// Inputs whose reductions are exact in every dtype and in any order, so that both sides compare bit for bit.
void fill_inputs(Array& a, int rank, ReduceOp redop);

/// Output buffers start as this pattern, so that an operation that writes nothing is caught by the check.
inline void fill_sentinel(Array& a) {
  std::memset(a.data(), 0xA5, a.nbytes());
}

/// Bytewise comparison of `got` with `out`'s contents: the number of elements that differ, summed over ranks.
std::int64_t count_wrong(const Bench& b, const std::vector<unsigned char>& got, const Array& out);

/// Per-call time of `iters` back-to-back calls after a barrier: the slowest rank's, as nccl-tests reports it.
template <typename Call>
double time_calls(const Bench& b, Call& call) {
  return time_slowest(b.control,
                      [&] {
                        for (int i = 0; i < b.opt.iters; ++i) call();
                      }) /
         b.opt.iters;
}

/// Checks (once: both sides on the same inputs, outputs compared exactly), warms up, then times the two sides in
/// alternation. `reset` restores the inputs and fills the output `out` with the sentinel.
template <typename Reset, typename ShardkitCall, typename MpiCall>
Row measure(const Bench& b, const Layout& l, Array& out, Reset reset, ShardkitCall shardkit_call_, MpiCall mpi_call) {
  Row row{nullptr, l, {}, {}, {}, -1};
  // --aa: both columns run the raw MPI call, so that their ratio shows what this measurement's order and noise give
  // two identical sides (expect 1 within that: 0.93-1.07 from 8 B to 32 MiB at 2 ranks here, 0.91-1.22 for 4-16 MiB
  // allgathers and bcasts with -n 10).
  auto shardkit_call = [&] {
    if (b.opt.aa)
      mpi_call();
    else
      shardkit_call_();
  };
  if (b.opt.check) {
    reset();
    shardkit_call();
    const auto* bytes = static_cast<const unsigned char*>(out.data());
    const std::vector<unsigned char> got(bytes, bytes + out.nbytes());
    reset();
    mpi_call();
    row.wrong = count_wrong(b, got, out);
  }
  reset();
  // The limit: one memcpy of the message's bytes per call, between two buffers of this rank, timed in the same
  // alternation. Host Arrays, as the operations' host buffers: from 2 MiB they have huge pages, where std::vector's
  // 4 KiB pages made a 16 MiB memcpy take 2.0-2.9 ms against 0.7-0.9 (bench_peer_copy's local memcpy).
  Array from = Array::empty({l.bytes}, DType::kUInt8, Device::cpu());
  Array to = Array::empty(from.shape(), DType::kUInt8, Device::cpu());
  std::memset(from.data(), 1, from.nbytes());
  std::memset(to.data(), 0, to.nbytes());
  auto copy = [&] { std::memcpy(to.data(), from.data(), from.nbytes()); };
  for (int i = 0; i < b.opt.warmup; ++i) shardkit_call();
  for (int i = 0; i < b.opt.warmup; ++i) mpi_call();
  for (int i = 0; i < b.opt.warmup; ++i) copy();
  std::vector<double> shardkit_s, mpi_s, limit_s;
  // Rounds of shardkit, MPI, memcpy, then MPI, shardkit, memcpy, and so on: shardkit and MPI each follow the memcpy of
  // a large message (cold caches) in every other round, and each other in the rounds between. Shardkit always went
  // first at one time, and measured 5-15% over MPI at 2-32 MiB on the MPI route. Rotating the three instead (shardkit,
  // MPI, memcpy; MPI, memcpy, shardkit; memcpy, shardkit, MPI), shardkit followed the memcpy twice as often as MPI
  // did, and 8 MiB bcasts and allgathers on the MPI route still measured 1.05-1.16x raw MPI.
  for (int r = 0; r < b.opt.repeats; ++r) {
    const bool mpi_first = r % 2 == 1;
    if (!mpi_first) shardkit_s.push_back(time_calls(b, shardkit_call));
    mpi_s.push_back(time_calls(b, mpi_call));
    if (mpi_first) shardkit_s.push_back(time_calls(b, shardkit_call));
    limit_s.push_back(time_calls(b, copy));
  }
  row.shardkit = stats(shardkit_s, 1e6);
  row.mpi = stats(mpi_s, 1e6);
  row.limit = stats(limit_s, 1e6);
  return row;
}

/// measure() for the out-of-place operations: a send buffer of inputs and a receive buffer, each side called as
/// `call(send, recv)`.
template <typename ShardkitCall, typename MpiCall>
Row measure_out_of_place(const Bench& b, const Layout& l, ShardkitCall shardkit_call, MpiCall mpi_call) {
  Array send = Array::empty({l.send_count}, b.opt.dtype);
  Array recv = Array::empty({l.recv_count}, b.opt.dtype);
  fill_inputs(send, b.rank, b.opt.redop);
  return measure(
      b, l, recv, [&] { fill_sentinel(recv); }, [&] { shardkit_call(send, recv); }, [&] { mpi_call(send, recv); });
}

/// The counts fit in an int (checked against the largest size before anything runs): MPI's count argument.
inline int mpi_count(std::int64_t n) {
  return static_cast<int>(n);
}

/// The collectives' entries (one file each).
extern const CollectiveTest kAllreduceTest, kAllgatherTest, kReduceScatterTest, kBcastTest, kReduceTest, kGatherTest,
    kScatterTest, kAlltoallTest, kSendrecvTest, kScanTest, kBarrierTest;

}  // namespace shardkit::bench
