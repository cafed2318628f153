// The simulated NCCL refuses what real NCCL may hang on: two ranks that share two communicators of their devices
// launching the operations of the two in different orders (nccl_order.cpp). Run as `nccl_order_main <case>`; the
// ctest entries check each case's exit and the line it prints (consistent: "launch order consistent").
//   crossed      rank 0 launches an allreduce on A, then on B; the others B, then A (each on its own stream)
//   p2p_crossed  rank 0 sends to rank 1 on B, then on A; rank 1 receives on A, then on B (point-to-point only, so
//                whichever receive compares first, the report is about transfers from rank 0 to rank 1)
//   consistent   the same launches on every rank, point-to-point between ranks 0 and 1 only while the others
//                launch nothing on B, grouped operations over both communicators, B split from A: no complaint

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "nccl_order_main: %s failed\n", what);
    std::exit(2);
  }
}
#define CK(expr) check((expr) == 0, #expr)

ncclComm_t make(int rank, int size) {
  ncclUniqueId id;
  if (rank == 0) CK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t c = nullptr;
  CK(ncclCommInitRank(&c, size, id, rank));
  return c;
}

struct Buf {
  float* p = nullptr;
  explicit Buf(int n) { CK(cudaMalloc(reinterpret_cast<void**>(&p), sizeof(float) * n)); }
  ~Buf() { cudaFree(p); }
};

}  // namespace

int main(int argc, char** argv) {
  int level = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string mode = argc > 1 ? argv[1] : "";
  CK(cudaSetDevice(rank));  // one device per rank (the simulated GPU has as many as the node has ranks)
  cudaStream_t sa, sb;
  CK(cudaStreamCreate(&sa));
  CK(cudaStreamCreate(&sb));
  ncclComm_t a = make(rank, size), b = nullptr;
  if (mode == "consistent")
    CK(ncclCommSplit(a, 0, rank, &b, nullptr));
  else
    b = make(rank, size);
  Buf x(4), y(4);
  auto allreduce = [&](ncclComm_t c, cudaStream_t s) { CK(ncclAllReduce(x.p, y.p, 4, ncclFloat, ncclSum, c, s)); };
  if (mode == "crossed") {
    if (rank == 0) {
      allreduce(a, sa);
      allreduce(b, sb);
    } else {
      allreduce(b, sb);
      allreduce(a, sa);
    }
  } else if (mode == "p2p_crossed") {
    if (rank == 0) {
      CK(ncclSend(x.p, 4, ncclFloat, 1, b, sb));
      CK(ncclSend(x.p, 4, ncclFloat, 1, a, sa));
    } else if (rank == 1) {
      CK(ncclRecv(y.p, 4, ncclFloat, 0, a, sa));
      CK(ncclRecv(y.p, 4, ncclFloat, 0, b, sb));
    }
  } else if (mode == "consistent") {
    allreduce(a, sa);
    allreduce(b, sb);
    if (rank == 0 && size > 1) CK(ncclSend(x.p, 4, ncclFloat, 1, b, sb));
    if (rank == 1) CK(ncclRecv(y.p, 4, ncclFloat, 0, b, sb));
    allreduce(a, sa);
    CK(ncclGroupStart());  // one launch: the order inside a group is free
    if (rank % 2) {
      allreduce(b, sb);
      allreduce(a, sa);
    } else {
      allreduce(a, sa);
      allreduce(b, sb);
    }
    CK(ncclGroupEnd());
    CK(ncclBroadcast(x.p, y.p, 0, ncclFloat, 0, b, sb));  // moves nothing: no kernel, not counted
    allreduce(a, sa);
    allreduce(b, sb);
  } else {
    std::fprintf(stderr, "nccl_order_main: unknown case '%s'\n", mode.c_str());
    return 2;
  }
  CK(cudaStreamSynchronize(sa));
  CK(cudaStreamSynchronize(sb));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::printf("launch order consistent\n");
  CK(ncclCommDestroy(a));
  CK(ncclCommDestroy(b));
  MPI_Finalize();
  return 0;
}
