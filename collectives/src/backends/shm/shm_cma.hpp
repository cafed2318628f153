#pragma once

// Single-copy reads of another rank's memory (Linux cross-memory attach, process_vm_readv): a large bcast, allgather,
// alltoall, sendrecv or allreduce reads the other ranks' own buffers instead of copying through the segment twice (and
// an allreduce writes its share of the result straight into theirs, process_vm_writev, as a bcast's root writes part of
// the others' buffers where every rank has a CPU).
// The kernel allows it only where this process may ptrace the other one (same user and no Yama restriction, or
// CAP_SYS_PTRACE); containers often forbid it, so the ranks probe it once, when the backend is made, and fall back to
// the segment when any rank cannot.

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

/// From these many bytes the shm backend reads (or writes) peers' buffers directly where it may; below, it copies
/// through its segment. Measured at 2 ranks, and at 3-4 on 2 cores for the crowded case (docs/shm.md):
/// a bcast's buffer (where every rank has a CPU, the root then writes 1/n of each other buffer while they read the
/// rest);
inline constexpr std::size_t kCmaBcastBytes = std::size_t{16} << 10;
/// one rank's part of an allgather where every rank has a CPU (WaitPolicy::crowded false),
inline constexpr std::size_t kCmaGatherBytes = std::size_t{8} << 10;
/// and where they do not (there the segment measured faster from 8 KiB to 32 KiB);
inline constexpr std::size_t kCmaCrowdedGatherBytes = std::size_t{64} << 10;
/// one block of an alltoall (through the segment, each block is copied twice);
inline constexpr std::size_t kCmaAlltoallBytes = std::size_t{8} << 10;
/// an allreduce's input, only where every rank has a CPU.
inline constexpr std::size_t kCmaReduceBytes = std::size_t{16} << 10;

/// Every rank's process id, and whether every rank could read and write another's memory (collective, blocking MPI
/// calls over `comm`; false at 1 rank, or where single copy is turned off on any rank). `why` says why not, on every
/// rank.
struct CmaPeers {
  std::vector<pid_t> pids;
  bool usable = false;
  std::string why;
};
/// `allowed`: CommOptions::shm_single_copy (false: not tried, usable false on every rank).
CmaPeers probe_cma(MpiCommHandle comm, bool allowed);

/// Copies `bytes` from address `from` of process `pid` to `to`. False (errno set) when the kernel refuses.
bool cma_read(pid_t pid, void* to, const void* from, std::size_t bytes) noexcept;

/// Copies `bytes` from `from` to address `to` of process `pid` (process_vm_writev). False (errno set) when the kernel
/// refuses.
bool cma_write(pid_t pid, void* to, const void* from, std::size_t bytes) noexcept;

}  // namespace shardkit::detail
