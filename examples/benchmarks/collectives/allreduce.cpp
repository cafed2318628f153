// allreduce: Communicator::allreduce against MPI_Allreduce, every rank sending and receiving the whole message.

#include "bench.hpp"

namespace shardkit::bench {
namespace {

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.send_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.allreduce(send, recv, b.opt.redop).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Allreduce(send.data(), recv.data(), n, b.type, b.op, b.raw));
      });
}

}  // namespace

const CollectiveTest kAllreduceTest = {
    "allreduce", /*reduces=*/true, /*root=*/-1, [](int n) { return 2.0 * (n - 1) / n; }, whole_message, run};

}  // namespace shardkit::bench
