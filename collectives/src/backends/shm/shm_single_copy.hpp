#pragma once

// The shm backend's single-copy operations (shm_cma.hpp): from the sizes there up, bcast, allgather and alltoall copy
// once instead of twice where the ranks may read each other's memory: each rank posts its buffer's address in its flag
// line, the others read it with process_vm_readv, and a second handshake (the bcast root's wait for every reader)
// keeps each buffer in place until all have read it. Where every rank has a CPU, a bcast's root does not wait idle: all
// post their buffers' addresses first, and the root writes the first 1/n of each other rank's buffer while that rank
// reads the rest (each core copies (n-1)/n of the bytes instead of a reader copying them all). From kCmaReduceBytes an
// allreduce copies once too: every rank posts its input's and its output's addresses, folds its share of the elements
// from the others' inputs straight into its output (piece by piece, through a buffer that stays in cache), writes each
// piece, still in cache, into the others' outputs (process_vm_writev), and posts again before it returns (its input is
// theirs to read, its output theirs to write, until all have posted). The backend (shm_backend.cpp) takes this
// allreduce only where every rank has a CPU: with more ranks than CPUs (3-4 on 2 cores) the segment path measured
// faster (0.31-0.67x MPI against 0.48-0.74x).

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "backend.hpp"
#include "backends/shm/shm_cma.hpp"
#include "backends/shm/shm_segment.hpp"
#include "backends/shm/shm_steps.hpp"

namespace shardkit::detail {

class ShmSingleCopy {
 public:
  ShmSingleCopy(const ShmSegment& seg, const CmaPeers& cma, ShmSteps& steps, int rank, AbortState& abort)
      : seg_(seg), cma_(cma), steps_(steps), me_(rank), n_(seg.ranks()), abort_(abort) {}

  /// `out` = the element-wise reduction of every rank's `send` (the two may be one buffer).
  void allreduce(const Array& send, Array& out, ReduceOp op, const OpContext& ctx);
  /// `bytes` at `buf` from the root's buffer to every other rank's.
  void bcast(unsigned char* buf, std::size_t bytes, int root, const OpContext& ctx);
  /// The same, with the copying shared: the root writes part of every other rank's buffer while they read the rest
  /// (a full handshake, not one-way).
  void bcast_shared(unsigned char* buf, std::size_t bytes, int root, const OpContext& ctx);
  /// Block p of `recv` = `bytes` from offset `at` of rank p's `send` (allgather: at 0; alltoall: where this rank's
  /// block lies).
  void gather(const unsigned char* send, unsigned char* recv, std::size_t bytes, std::size_t at, const OpContext& ctx);

 private:
  // Posts step s in `set` with the addresses of up to kInlineBytes / 8 buffers in the flag line.
  void post_addresses(int set, std::uint32_t s, std::initializer_list<const void*> bufs);
  // Copies `bytes` from offset `at` of the `which`-th buffer rank p posted in `set` (already known to be posted) to
  // `here`, or (write) the other way.
  void copy_posted(unsigned char* here, int set, int p, int which, std::size_t at, std::size_t bytes, bool write,
                   const OpContext& ctx);

  const ShmSegment& seg_;
  const CmaPeers& cma_;
  ShmSteps& steps_;
  int me_, n_;
  AbortState& abort_;
  std::vector<unsigned char> pieces_;  // allreduce's pieces of every rank's input
};

}  // namespace shardkit::detail
