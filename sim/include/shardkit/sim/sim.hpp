#pragma once

// What shardkit's own code may ask of the simulated GPU beyond the CUDA, cuBLAS and NCCL C APIs it implements:
// enqueueing a host function as a "kernel" on a stream (the host versions of core's kernels use it), and the address
// a stream worker reads and writes for a device pointer. Only core/src/cuda/kernels_sim.cpp includes this.

#include <functional>

struct CUstream_st;

namespace shardkit::sim {

/// Runs `kernel` on the worker of `stream` after everything queued before it, as a kernel launch does. Like CUDA,
/// launching into a stream of another device than the calling thread's current one fails: returns the cudaError_t
/// value (0 on success) that cudaGetLastError would report.
int launch(CUstream_st* stream, std::function<void()> kernel);

/// The address through which a stream worker accesses `ptr`: the read-write alias of simulated device memory, or
/// `ptr` itself for host, pinned and managed memory. Call it on the worker, inside a launched kernel.
void* worker_view(const void* ptr);

}  // namespace shardkit::sim
