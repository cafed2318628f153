// barrier: Communicator::barrier against MPI_Barrier. No data: one row of 0 bytes, whatever sizes -b and -e ask for
// (every size gives the same empty layout, which the table measures once).

#include "bench.hpp"

namespace shardkit::bench {
namespace {

Layout no_data(std::int64_t, std::int64_t, int) {
  return {};
}

Row run(const Bench& b, const Layout& l) {
  return measure_out_of_place(
      b, l, [&](const Array&, Array&) { b.comm.barrier().wait(); },
      [&](const Array&, Array&) { SHARDKIT_MPI_CHECK(MPI_Barrier(b.raw)); });
}

}  // namespace

const CollectiveTest kBarrierTest = {"barrier", /*reduces=*/false, /*root=*/-1, unit_factor, no_data, run};

}  // namespace shardkit::bench
