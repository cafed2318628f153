// allgather: Communicator::allgather against MPI_Allgather; each rank sends one block and receives all of them.

#include "bench.hpp"

namespace shardkit::bench {
namespace {

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.send_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.allgather(send, recv).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Allgather(send.data(), n, b.type, recv.data(), n, b.type, b.raw));
      });
}

}  // namespace

const CollectiveTest kAllgatherTest = {
    "allgather", /*reduces=*/false, /*root=*/-1, [](int n) { return static_cast<double>(n - 1) / n; },
    [](std::int64_t, std::int64_t block, int n) { return Layout{block, block * n, block, 0}; }, run};

}  // namespace shardkit::bench
