// sendrecv: Communicator::sendrecv_into against MPI_Sendrecv on a ring (nccl-tests' sendrecv): each rank sends to its
// right neighbour and receives from its left one.

#include "bench.hpp"

namespace shardkit::bench {
namespace {

Row run(const Bench& b, const Layout& l) {
  const int send_n = mpi_count(l.send_count), recv_n = mpi_count(l.recv_count);
  const int right = (b.rank + 1) % b.size, left = (b.rank - 1 + b.size) % b.size;
  return measure_out_of_place(
      b, l,
      [&](const Array& send, Array& recv) {
        b.comm.sendrecv_into(send, right, recv, left, /*send_tag=*/0, /*recv_tag=*/0).wait();
      },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Sendrecv(send.data(), send_n, b.type, right, 0, recv.data(), recv_n, b.type, left, 0,
                                        b.raw, MPI_STATUS_IGNORE));
      });
}

}  // namespace

const CollectiveTest kSendrecvTest = {"sendrecv", /*reduces=*/false, /*root=*/-1, unit_factor, whole_message, run};

}  // namespace shardkit::bench
