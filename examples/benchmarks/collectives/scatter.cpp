// scatter: Communicator::scatter against MPI_Scatter from root 0; the root sends a block to every rank, each rank
// receives its own.

#include "bench.hpp"

namespace shardkit::bench {
namespace {

constexpr int kRoot = 0;

// A block for every rank sent (by the root), one received.
Layout counts(std::int64_t, std::int64_t block, int ranks) {
  return {block * ranks, block, block, 0};
}

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.recv_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.scatter(send, recv, kRoot).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Scatter(send.data(), n, b.type, recv.data(), n, b.type, kRoot, b.raw));
      });
}

}  // namespace

const CollectiveTest kScatterTest = {"scatter", /*reduces=*/false, kRoot, share_factor, counts, run};

}  // namespace shardkit::bench
