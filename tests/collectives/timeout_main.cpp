// A rank skips a collective; every other rank must raise TimeoutError naming the operation (and, in checked mode,
// the missing rank), and the job must end rather than hang. Run through expect_timeout.cmake, which checks the
// output of every rank and that the run ended.
//   timeout_main checked   SHARDKIT_CHECK on: the signature exchange names the rank that did not arrive
//   timeout_main unchecked no signatures: the data phase itself times out
//   timeout_main unchecked gpu   the same on the rank's GPU (NCCL): the token's wait times out and aborts the NCCL
//                                communicator; waiting on it again must not touch the aborted handle
//   timeout_main nccl-init       NCCL's creation itself does not complete (the simulated GPU stalls one rank's
//                                bootstrap): creating the communicator raises TimeoutError on every rank
//   timeout_main shm             on the shm backend (set up by a barrier first): the flags name the rank that did
//                                not arrive, and no segment is left in /dev/shm
//   timeout_main shm-sendrecv    the same with a sendrecv between each waiting rank and the last one
//   timeout_main shm-send        the same with sends to the last rank, which never receives: a ring's worth of small
//                                ones from each waiting rank (they return: posted, or pending), then one larger than
//                                the ring (it waits: for room, or for the last rank to read it)
//   timeout_main shm-sendsmall   the same with small sends only, more than a ring holds (they wait once past the bound
//                                on held-back sends: run with SHARDKIT_SHM_PENDING_BYTES=0)
//   timeout_main shm-bcast       the same with small bcasts (through the roots' rings): rank 0 sends one more than a
//                                ring holds, which the last rank never reads (rank 0 waits to reuse the line), and
//                                the other ranks read them too and wait in the next (rank 0 waits: they name it
//                                and the last rank)
//   timeout_main shm-latebcast   the same with a bcast through a buffer set (1 KiB) whose root is the last rank: the
//                                readers post only once the root has, so each names the root alone
//   timeout_main shm-latescatter the same with a scatter whose root is the last rank
//   timeout_main watchdog-late   the last rank comes 3 s late to the watchdog's set-up exchange: the others raise
//                                TimeoutError, then keep MPI progressing while the exchange completes
//   timeout_main shm-createkill  the last rank is killed while the world's shm segment is being made (rank 0 made it,
//                                this rank has not opened it): run through expect_no_shm_left.cmake
//   timeout_main shm-kill        on the shm backend, the last rank is killed (SIGKILL) while the others wait in an
//                                allreduce: the job ends (run through expect_no_shm_left.cmake, which then looks
//                                for the segment in /dev/shm)
//   timeout_main destroy gpu     the waiting ranks drop the communicator (and the operation's token and buffers) with
//                                the allreduce still pending: destroying its NCCL communicator must give up after the
//                                timeout (aborting it) instead of waiting for good for a peer that never comes

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/runtime.hpp"
#include "backends/shm/shm_segment.hpp"
#include "shm_files.hpp"
#include "watchdog.hpp"

int main(int argc, char** argv) {
  using namespace shardkit;
  Runtime rt(&argc, &argv);
  const bool checked = argc > 1 && std::strcmp(argv[1], "checked") == 0;
  const bool gpu = argc > 2 && std::strcmp(argv[2], "gpu") == 0;
  const Device where = gpu ? rt.device() : Device::cpu();
  CommOptions o;
  o.check = checked;
  o.timeout = std::chrono::milliseconds(1500);
  o.name = "timeout-test";
  if (argc > 1 && std::strcmp(argv[1], "nccl-init") == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      auto c = Communicator::world(rt, o);
      std::printf("rank %d: ERROR: communicator created (has_nccl=%d)\n", rt.rank(), c->has_nccl() ? 1 : 0);
      return 1;
    } catch (const TimeoutError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank %d: caught after %.1f s: TimeoutError: %s\n", rt.rank(), s, e.what());
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return 0;  // the Runtime ends the job with MPI_Abort
  }
  const bool shm = argc > 1 && std::strncmp(argv[1], "shm", 3) == 0;
  if (shm) o.backend = BackendKind::kShm;
  if (argc > 1 && std::strcmp(argv[1], "watchdog-late") == 0) {
    // The last rank comes late to the watchdog's exchange, which the others give up on: their TimeoutError leaves the
    // exchange in flight, and MPI completes it once the late rank comes, writing what it writes then. The waiting
    // ranks keep MPI progressing meanwhile (under AddressSanitizer a write into freed memory is reported).
    static const bool late = rt.rank() == rt.size() - 1;
    shardkit::detail::watchdog_before_exchange_for_tests([] {
      if (late) std::this_thread::sleep_for(std::chrono::seconds(3));
    });
    const auto t0 = std::chrono::steady_clock::now();
    try {
      auto c = Communicator::world(rt, o);
      if (!late) std::printf("rank %d: ERROR: communicator created\n", rt.rank());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(5));
      return late ? 0 : 1;
    } catch (const TimeoutError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank %d: caught after %.1f s: TimeoutError: %s\n", rt.rank(), s, e.what());
      std::fflush(stdout);
    }
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
         std::chrono::steady_clock::now() < until;) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::printf("rank %d: progressed MPI past the late exchange\n", rt.rank());
    std::fflush(stdout);
    return 0;  // the Runtime ends the job with MPI_Abort
  }
  if (argc > 1 && std::strcmp(argv[1], "shm-createkill") == 0) {
    if (rt.rank() == 0) std::printf("segment owner pid: %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    static int last = rt.size() - 1;
    static int me = rt.rank();
    shardkit::detail::shm_segment_hooks_for_tests(false, [] {
      if (me == last) raise(SIGKILL);  // after rank 0 made the segment, before this rank opened it
    });
  }
  auto comm = Communicator::world(rt, o);
  const int skipper = comm->size() - 1;
  if (shm) {
    comm->barrier().wait();  // sets the segment up on every rank
    if (comm->rank() == 0) std::printf("segment owner pid: %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    if (std::strcmp(argv[1], "shm-kill") == 0) {
      if (comm->rank() == skipper) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        raise(SIGKILL);
      }
      comm->allreduce(Array::zeros({1 << 18}, DType::kFloat32), ReduceOp::kSum);
      std::printf("rank %d: ERROR: allreduce completed without rank %d\n", comm->rank(), skipper);
      return 1;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  if (argc > 1 && std::strcmp(argv[1], "destroy") == 0 && comm->rank() != skipper) {
    const int rank = comm->rank();
    {
      auto [y, t] = comm->allreduce(Array::zeros({16}, DType::kFloat32, where), ReduceOp::kSum);
      comm.reset();
    }  // the last handles to the communicator and the pending operation go here
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: destroyed the communicator with its allreduce pending after %.1f s\n", rank, s);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return 0;
  }
  if (comm->rank() == skipper) {
    // Skips the collective; stays alive until the others end the job (MPI_Abort). Leaving earlier, by MPI_Finalize,
    // while another rank aborts left Open MPI 4.1's mpirun waiting for good at times (its ranks already gone), on a
    // loaded machine where the aborting ranks came late.
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::printf("rank %d: skipped the allreduce\n", comm->rank());
    std::fflush(stdout);
    return 0;
  }
  Token token;
  try {
    if (argc > 1 && std::strcmp(argv[1], "shm-sendsmall") == 0) {
      // Small sends only, more than the ring holds: held back (they return) up to SHARDKIT_SHM_PENDING_BYTES.
      const auto ring = shardkit::detail::P2pGeometry::for_ranks(comm->size());
      for (int i = 0; i < ring.entries + 5; ++i) comm->send(Array::zeros({4}, DType::kFloat32), skipper, 0).wait();
    } else if (argc > 1 && std::strcmp(argv[1], "shm-send") == 0) {
      const auto ring = shardkit::detail::P2pGeometry::for_ranks(comm->size());
      for (int i = 0; i <= ring.entries; ++i) comm->send(Array::zeros({4}, DType::kFloat32), skipper, 0);
      const auto larger = static_cast<std::int64_t>((ring.entries + 1) * ring.payload / 4);
      comm->send(Array::zeros({larger}, DType::kFloat32), skipper, 0);
    } else if (argc > 1 && std::strcmp(argv[1], "shm-sendrecv") == 0) {
      Array y = Array::zeros({16}, DType::kFloat32);
      token = comm->sendrecv_into(Array::zeros({16}, DType::kFloat32), skipper, y, skipper, 0, 0);
    } else if (argc > 1 && std::strcmp(argv[1], "shm-reduce") == 0) {
      // One-way: rank 0 (the root) waits for the last rank in the first; the others in a later one, for both.
      const Array x = Array::zeros({4}, DType::kFloat32);
      Array y = Array::zeros({4}, DType::kFloat32);
      for (int i = 0; i < 3; ++i) {
        token = comm->reduce(x, y, ReduceOp::kSum, 0);
        token.wait();
      }
    } else if (argc > 1 && std::strcmp(argv[1], "shm-latebcast") == 0) {
      Array x = Array::zeros({256}, DType::kFloat32);
      token = comm->bcast_inplace(x, skipper);
    } else if (argc > 1 && std::strcmp(argv[1], "shm-latescatter") == 0) {
      Array y = Array::zeros({256}, DType::kFloat32);
      token = comm->scatter(Array::zeros({256 * comm->size()}, DType::kFloat32), y, skipper);
    } else if (argc > 1 && std::strcmp(argv[1], "shm-bcast") == 0) {
      Array x = Array::zeros({4}, DType::kFloat32);
      for (int i = 0; i <= shardkit::detail::ShmSegment::kRingLines + 1; ++i) {
        token = comm->bcast_inplace(x, 0);
        token.wait();
      }
    } else {
      token = comm->allreduce(Array::zeros({16}, DType::kFloat32, where), ReduceOp::kSum).token;
    }
    token.wait();
    std::printf("rank %d: ERROR: the operation completed without rank %d\n", comm->rank(), skipper);
    return 1;
  } catch (const TimeoutError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: caught after %.1f s: TimeoutError: %s\n", comm->rank(), s, e.what());
    if (shm) std::printf("rank %d: shm segments left: %d\n", comm->rank(), shardkit::testing::own_shm_segments());
    std::fflush(stdout);
  }
  // The pending token of the aborted operation: asking again reports the failure without touching the aborted
  // communicator's handle.
  try {
    if (token.is_complete()) std::printf("rank %d: ERROR: aborted operation reported complete\n", comm->rank());
    token.wait();
    std::printf("rank %d: ERROR: aborted operation's token waited successfully\n", comm->rank());
  } catch (const Error& e) {
    std::printf("rank %d: token of the aborted operation: %s\n", comm->rank(), e.what());
  }
  // Later use of the aborted communicator is refused.
  try {
    comm->barrier();
    std::printf("rank %d: ERROR: aborted communicator still usable\n", comm->rank());
  } catch (const BackendError& e) {
    std::printf("rank %d: refused after abort: %s\n", comm->rank(), e.what());
  }
  std::fflush(stdout);
  // Give the other waiting ranks time to report before this one's exit ends the job.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  return 0;  // the Runtime ends the job with MPI_Abort: finalising could hang on the operation left in flight
}
