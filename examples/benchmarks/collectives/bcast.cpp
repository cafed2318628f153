// bcast: Communicator::bcast_inplace against MPI_Bcast, in place on one buffer from root 0 (nccl-tests' default).

#include "bench.hpp"

namespace shardkit::bench {
namespace {

constexpr int kRoot = 0;

Row run(const Bench& b, const Layout& l) {
  // The root's buffer holds the input, the others' the sentinel until the broadcast lands.
  Array buf = Array::empty({l.send_count}, b.opt.dtype);
  const int n = mpi_count(l.send_count);
  auto reset = [&] {
    if (b.rank == kRoot)
      fill_inputs(buf, b.rank, b.opt.redop);
    else
      fill_sentinel(buf);
  };
  return measure(
      b, l, buf, reset, [&] { b.comm.bcast_inplace(buf, kRoot).wait(); },
      [&] { SHARDKIT_MPI_CHECK(MPI_Bcast(buf.data(), n, b.type, kRoot, b.raw)); });
}

}  // namespace

const CollectiveTest kBcastTest = {"bcast", /*reduces=*/false, kRoot, unit_factor, whole_message, run};

}  // namespace shardkit::bench
