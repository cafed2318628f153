// allgather: Communicator::allgather against MPI_Allgather; each rank sends one block and receives all of them.

#include "bench.hpp"

namespace shardkit::bench {
namespace {

// One block sent, one received from every rank.
Layout counts(std::int64_t, std::int64_t block, int ranks) {
  return {block, block * ranks, block, 0};
}

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.send_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.allgather(send, recv).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Allgather(send.data(), n, b.type, recv.data(), n, b.type, b.raw));
      });
}

}  // namespace

const CollectiveTest kAllgatherTest = {"allgather", /*reduces=*/false, /*root=*/-1, share_factor, counts, run};

}  // namespace shardkit::bench
