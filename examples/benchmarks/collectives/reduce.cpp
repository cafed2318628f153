// reduce: Communicator::reduce against MPI_Reduce to root 0 (nccl-tests' default), every rank sending the whole
// message; only the root's receive buffer changes (the others' keep the sentinel on both sides).

#include "bench.hpp"

namespace shardkit::bench {
namespace {

constexpr int kRoot = 0;

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.send_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.reduce(send, recv, b.opt.redop, kRoot).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Reduce(send.data(), recv.data(), n, b.type, b.op, kRoot, b.raw));
      });
}

}  // namespace

const CollectiveTest kReduceTest = {"reduce", /*reduces=*/true, kRoot, unit_factor, whole_message, run};

}  // namespace shardkit::bench
