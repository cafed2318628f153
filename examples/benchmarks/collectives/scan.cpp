// scan: Communicator::scan against MPI_Scan, every rank sending and receiving the whole message (the inclusive
// prefix reduction over ranks 0..rank). No shm algorithm: it takes MPI on every route, so this row prices what
// shardkit adds around an MPI call (on communicators whose point-to-point takes shm, the polled nonblocking form).

#include "bench.hpp"

namespace shardkit::bench {
namespace {

Row run(const Bench& b, const Layout& l) {
  const int n = mpi_count(l.send_count);
  return measure_out_of_place(
      b, l, [&](const Array& send, Array& recv) { b.comm.scan(send, recv, b.opt.redop).wait(); },
      [&](const Array& send, Array& recv) {
        SHARDKIT_MPI_CHECK(MPI_Scan(send.data(), recv.data(), n, b.type, b.op, b.raw));
      });
}

}  // namespace

const CollectiveTest kScanTest = {"scan", /*reduces=*/true, /*root=*/-1, unit_factor, whole_message, run};

}  // namespace shardkit::bench
