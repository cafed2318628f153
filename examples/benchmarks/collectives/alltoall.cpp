// alltoall: Communicator::alltoall against MPI_Alltoall; each rank sends one block to every rank.

#include "bench.hpp"

namespace shardkit::bench {
namespace {

// A block for every rank sent, one from every rank received.
Layout counts(std::int64_t, std::int64_t block, int ranks) {
  return {block * ranks, block * ranks, block, 0};
}

Row run(const Bench& b, const Layout& l) {
  const int block = mpi_count(l.count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.alltoall(send, recv).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Alltoall(send.data(), block, b.type, recv.data(), block, b.type, b.raw));
      });
}

}  // namespace

const CollectiveTest kAlltoallTest = {"alltoall", /*reduces=*/false, /*root=*/-1, share_factor, counts, run};

}  // namespace shardkit::bench
