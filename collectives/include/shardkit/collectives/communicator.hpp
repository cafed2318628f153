#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/collectives/ops.hpp"
#include "shardkit/collectives/options.hpp"
#include "shardkit/collectives/token.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit {

/// An operation's value and the token that orders what comes after it.
struct Result {
  Array value;
  Token token;
};

namespace detail {
struct CommunicatorImpl;
}

/// A group of ranks that run collectives together, over MPI for host buffers and NCCL for GPU buffers (chosen per
/// operation by where the buffers live, or fixed by CommOptions::backend / SHARDKIT_BACKEND).
///
/// Operations come in two forms:
///  - buffer form: the caller passes send and receive arrays (contiguous or strided; any dtype) and gets a Token
///    (names ending in _inplace or _into where a value form of the same name exists);
///  - value form: the result is allocated and returned with its token (Result), following mpi4jax's shape rules.
/// Every operation takes `after`, a token that must complete before the operation starts.
///
/// Errors: InvalidArgument for bad arguments (raised before anything is sent), MismatchError when ranks disagree
/// (checked mode), TimeoutError when an operation does not complete in time (the communicator is then aborted),
/// Interrupted when SIGINT or SIGTERM ends its wait (shardkit/core/interrupt.hpp; aborted likewise), BackendError for
/// failures of MPI, NCCL or CUDA.
///
/// A communicator is used by one thread at a time: an operation that another thread starts while one runs raises
/// InvalidArgument before it sends anything (the first goes on).
class Communicator {
 public:
  /// All ranks of the job (a duplicate of its world communicator: `job` is the Runtime, or what it published,
  /// JobInfo::current()). Collective.
  /// `first_op`: for a default communicator made on first use, the operation that makes it ("allreduce"); a rank that
  /// never arrives then gives a TimeoutError naming that operation, which is what the caller called.
  static std::shared_ptr<Communicator> world(const JobInfo& job, CommOptions options = {},
                                             std::string_view first_op = {});
  /// All ranks of the job of the live Runtime. Collective. @throws InvalidArgument when no Runtime lives.
  static std::shared_ptr<Communicator> world(CommOptions options = {});
  /// A communicator over the ranks of an existing MPI communicator, which it duplicates (an independent message
  /// space). Collective over it.
  static std::shared_ptr<Communicator> from_mpi(MpiCommHandle comm, CommOptions options = {});
  /// Runs operations on an existing MPI communicator itself, as mpi4jax does with the communicator it is given
  /// (for example one from mpi4py, whose messages then share that communicator). Not collective: a private
  /// duplicate for shardkit's own traffic is made at the first collective that needs it, and NCCL is set up at
  /// the first collective on GPU buffers. The caller keeps `comm` alive longer than the result.
  static std::shared_ptr<Communicator> wrap_mpi(MpiCommHandle comm, CommOptions options = {});

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// Ranks with the same `color` form a new communicator, ordered by `key` then by rank; a negative color gives
  /// nullptr. Collective.
  std::shared_ptr<Communicator> split(int color, int key, std::string name = {});
  /// Same ranks, independent message space. Collective.
  std::shared_ptr<Communicator> dup(std::string name = {});

  int rank() const noexcept;
  int size() const noexcept;
  const std::string& name() const noexcept;
  const CommOptions& options() const noexcept;
  /// True when an NCCL communicator exists for GPU buffers.
  bool has_nccl() const noexcept;
  /// The MPI communicator operations run on (for interop; valid while this object lives, or the caller's own for
  /// wrap_mpi).
  MpiCommHandle mpi_handle() const noexcept;
  /// True for a communicator made by wrap_mpi: its operations run on the caller's MPI communicator itself.
  bool wraps_caller() const noexcept;
  /// True once a timeout aborted this communicator; every later operation raises BackendError.
  bool aborted() const noexcept;
  /// Number of collective operations issued so far (the sequence number of the next one).
  std::uint64_t sequence() const noexcept;

  /// The backend `op` would run on for buffers in `device` memory (CPU when the operation has no buffers).
  /// @throws InvalidArgument when the configured backend cannot run it (SHARDKIT_BACKEND=nccl on host buffers).
  BackendKind backend_for(OpKind op, Device device) const;

  // ---- every operation --------------------------------------------------------------------------------------------

  /// Runs `op` on the arrays in `args` (buffer form). Sizes are element counts and must agree across ranks as MPI
  /// requires; receive arrays must not be read-only.
  Token run(OpKind op, const OpArgs& args, const Token& after = {});
  /// Runs `op` on input `x` with a result allocated by its value rule (mpi4jax's shape rules); `args.send` and
  /// `args.recv` are set from x and the result. @throws InvalidArgument for operations without a value form.
  Result run_value(OpKind op, const Array& x, OpArgs args = {}, const Token& after = {});
  /// Validates what run_value (or, for send and barrier, run) would validate for input `x` and `args`, running
  /// nothing and reading no data: `x` (and sendrecv's `args.send`) may be views of shape and dtype only. The JAX layer
  /// checks a call with it while tracing, so a refused call is refused there with the eager call's message.
  /// @throws InvalidArgument as run_value.
  void check_value(OpKind op, const Array& x, OpArgs args = {}) const;

  // ---- buffer form: typed views of run() --------------------------------------------------------------------------

  /// recv = op over ranks of send (same shape).
  Token allreduce(const Array& send, Array& recv, ReduceOp op, const Token& after = {}) {
    return run(OpKind::kAllreduce, {.send = &send, .recv = &recv, .reduce = op}, after);
  }
  /// In place: buf = op over ranks of buf.
  Token allreduce_inplace(Array& buf, ReduceOp op, const Token& after = {}) { return allreduce(buf, buf, op, after); }
  /// On root, recv = op over ranks of send; elsewhere recv is not touched (and may be empty).
  Token reduce(const Array& send, Array& recv, ReduceOp op, int root, const Token& after = {}) {
    return run(OpKind::kReduce, {.send = &send, .recv = &recv, .reduce = op, .root = root}, after);
  }
  /// In place: buf on every rank = buf on root.
  Token bcast_inplace(Array& buf, int root, const Token& after = {}) {
    return run(OpKind::kBcast, {.send = &buf, .recv = &buf, .root = root}, after);
  }
  /// recv (size * send.numel elements) = the ranks' sends, in rank order.
  Token allgather(const Array& send, Array& recv, const Token& after = {}) {
    return run(OpKind::kAllgather, {.send = &send, .recv = &recv}, after);
  }
  /// On root, recv (size * send.numel elements) = the ranks' sends; elsewhere recv is not touched.
  Token gather(const Array& send, Array& recv, int root, const Token& after = {}) {
    return run(OpKind::kGather, {.send = &send, .recv = &recv, .root = root}, after);
  }
  /// recv = block `rank` of root's send (size * recv.numel elements; read on root only).
  Token scatter(const Array& send, Array& recv, int root, const Token& after = {}) {
    return run(OpKind::kScatter, {.send = &send, .recv = &recv, .root = root}, after);
  }
  /// recv = block `rank` of op over ranks of send (send has size * recv.numel elements).
  Token reduce_scatter(const Array& send, Array& recv, ReduceOp op, const Token& after = {}) {
    return run(OpKind::kReduceScatter, {.send = &send, .recv = &recv, .reduce = op}, after);
  }
  /// Block j of send goes to rank j; block i of recv comes from rank i (equal blocks).
  Token alltoall(const Array& send, Array& recv, const Token& after = {}) {
    return run(OpKind::kAlltoall, {.send = &send, .recv = &recv}, after);
  }
  /// Sends buf to dest.
  Token send(const Array& buf, int dest, int tag = 0, const Token& after = {}) {
    return run(OpKind::kSend, {.send = &buf, .dest = dest, .send_tag = tag}, after);
  }
  /// Receives into buf from source (kAnySource: any, but on NCCL) with tag (kAnyTag: any).
  Token recv_into(Array& buf, int source, int tag = kAnyTag, RecvStatus* status = nullptr, const Token& after = {}) {
    return run(OpKind::kRecv, {.recv = &buf, .source = source, .recv_tag = tag, .status = status}, after);
  }
  /// Sends `send` to dest and receives into `recv` from source at once (deadlock-free exchange). `peers`: what the
  /// other ranks run meanwhile (Peers::kAllSendrecv where every rank of the communicator runs a sendrecv, as a ring
  /// does, which lets it take shm on a communicator that wraps the caller's).
  Token sendrecv_into(const Array& send, int dest, Array& recv, int source, int send_tag = 0, int recv_tag = kAnyTag,
                      RecvStatus* status = nullptr, const Token& after = {}, Peers peers = Peers::kUnknown) {
    return run(OpKind::kSendrecv,
               {.send = &send, .recv = &recv, .dest = dest, .source = source, .send_tag = send_tag,
                .recv_tag = recv_tag, .status = status, .peers = peers},
               after);
  }
  /// Waits until every rank has arrived.
  Token barrier(const Token& after = {}) { return run(OpKind::kBarrier, {}, after); }
  /// Inclusive prefix: recv on rank r = op over ranks 0..r of send.
  Token scan(const Array& send, Array& recv, ReduceOp op, const Token& after = {}) {
    return run(OpKind::kScan, {.send = &send, .recv = &recv, .reduce = op}, after);
  }
  /// recv = the ranks' sends concatenated; counts[i] is rank i's element count (the same array on every rank).
  Token allgatherv(const Array& send, Array& recv, std::span<const std::int64_t> counts, const Token& after = {}) {
    return run(OpKind::kAllgatherv, {.send = &send, .recv = &recv, .recv_counts = counts}, after);
  }
  /// send_counts[j] elements go to rank j (in rank order in send); recv_counts[i] come from rank i.
  Token alltoallv(const Array& send, std::span<const std::int64_t> send_counts, Array& recv,
                  std::span<const std::int64_t> recv_counts, const Token& after = {}) {
    return run(OpKind::kAlltoallv,
               {.send = &send, .recv = &recv, .send_counts = send_counts, .recv_counts = recv_counts}, after);
  }

  // ---- value form: typed views of run_value() (mpi4jax shape rules) ------------------------------------------------

  /// Same shape and dtype as x.
  Result allreduce(const Array& x, ReduceOp op, const Token& after = {}) {
    return run_value(OpKind::kAllreduce, x, {.reduce = op}, after);
  }
  /// On root the reduction; elsewhere x unchanged.
  Result reduce(const Array& x, ReduceOp op, int root, const Token& after = {}) {
    return run_value(OpKind::kReduce, x, {.reduce = op, .root = root}, after);
  }
  /// Root's x, on every rank (x gives shape and dtype elsewhere).
  Result bcast(const Array& x, int root, const Token& after = {}) {
    return run_value(OpKind::kBcast, x, {.root = root}, after);
  }
  /// Shape (size, *x.shape).
  Result allgather(const Array& x, const Token& after = {}) { return run_value(OpKind::kAllgather, x, {}, after); }
  /// On root shape (size, *x.shape); elsewhere x unchanged.
  Result gather(const Array& x, int root, const Token& after = {}) {
    return run_value(OpKind::kGather, x, {.root = root}, after);
  }
  /// On root x has shape (size, *s) and the result shape s; elsewhere x gives s and dtype.
  Result scatter(const Array& x, int root, const Token& after = {}) {
    return run_value(OpKind::kScatter, x, {.root = root}, after);
  }
  /// x has shape (size, *s); result shape s: block `rank` of the reduction.
  Result reduce_scatter(const Array& x, ReduceOp op, const Token& after = {}) {
    return run_value(OpKind::kReduceScatter, x, {.reduce = op}, after);
  }
  /// x has shape (size, ...); result block i comes from rank i.
  Result alltoall(const Array& x, const Token& after = {}) { return run_value(OpKind::kAlltoall, x, {}, after); }
  /// A new array shaped like x, received from source.
  Result recv(const Array& like, int source, int tag = kAnyTag, RecvStatus* status = nullptr,
              const Token& after = {}) {
    return run_value(OpKind::kRecv, like, {.source = source, .recv_tag = tag, .status = status}, after);
  }
  /// A new array shaped like recv_like, received from source while send goes to dest.
  Result sendrecv(const Array& send, const Array& recv_like, int source, int dest, int send_tag = 0,
                  int recv_tag = kAnyTag, RecvStatus* status = nullptr, const Token& after = {}) {
    return run_value(OpKind::kSendrecv, recv_like,
                     {.send = &send, .dest = dest, .source = source, .send_tag = send_tag, .recv_tag = recv_tag,
                      .status = status},
                     after);
  }
  /// Inclusive prefix reduction, same shape as x.
  Result scan(const Array& x, ReduceOp op, const Token& after = {}) {
    return run_value(OpKind::kScan, x, {.reduce = op}, after);
  }
  /// 1-d concatenation of every rank's x (flattened); x may differ in length between ranks.
  Result allgatherv(const Array& x, const Token& after = {}) { return run_value(OpKind::kAllgatherv, x, {}, after); }

 private:
  explicit Communicator(std::unique_ptr<detail::CommunicatorImpl> impl);
  void check_value_root(OpKind op, int root) const;
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace shardkit
