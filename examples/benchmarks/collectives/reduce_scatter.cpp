// reduce_scatter: Communicator::reduce_scatter against MPI_Reduce_scatter_block; each rank sends every block and
// receives the reduction of its own.

#include "bench.hpp"

namespace shardkit::bench {
namespace {

// A block for every rank sent, one received.
Layout counts(std::int64_t, std::int64_t block, int ranks) {
  return {block * ranks, block, block, 0};
}

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.recv_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.reduce_scatter(send, recv, b.opt.redop).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Reduce_scatter_block(send.data(), recv.data(), n, b.type, b.op, b.raw));
      });
}

}  // namespace

const CollectiveTest kReduceScatterTest = {"reduce_scatter", /*reduces=*/true, /*root=*/-1, share_factor, counts, run};

}  // namespace shardkit::bench
