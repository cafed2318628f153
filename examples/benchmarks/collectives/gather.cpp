// gather: Communicator::gather against MPI_Gather to root 0; each rank sends one block, the root receives all of them
// (the others' receive buffers keep the sentinel on both sides).

#include "bench.hpp"

namespace shardkit::bench {
namespace {

constexpr int kRoot = 0;

// One block sent, one received from every rank (on the root).
Layout counts(std::int64_t, std::int64_t block, int ranks) {
  return {block, block * ranks, block, 0};
}

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.send_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.gather(send, recv, kRoot).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Gather(send.data(), n, b.type, recv.data(), n, b.type, kRoot, b.raw));
      });
}

}  // namespace

const CollectiveTest kGatherTest = {"gather", /*reduces=*/false, kRoot, share_factor, counts, run};

}  // namespace shardkit::bench
