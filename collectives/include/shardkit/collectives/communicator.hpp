#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardkit/collectives/token.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/launch/config.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit {

class Runtime;

/// Reductions. Sum, prod, min and max apply to every numeric dtype (min/max not to complex, and NCCL reduces
/// complex only with sum); the logical and bitwise ones to integers and bool.
enum class ReduceOp { kSum, kProd, kMin, kMax, kLogicalAnd, kLogicalOr, kLogicalXor, kBitAnd, kBitOr, kBitXor };
/// "sum", "prod", ..., "bxor".
const char* reduce_op_name(ReduceOp op) noexcept;
/// True when `op` is defined for `dtype` (on the MPI backend; NCCL supports a subset, see README).
bool reduce_op_supports(ReduceOp op, DType dtype) noexcept;

/// Wildcards for recv / sendrecv.
inline constexpr int kAnySource = -1;
inline constexpr int kAnyTag = -1;

/// An operation's value and the token that orders what comes after it.
struct Result {
  Array value;
  Token token;
};

/// What a receive matched.
struct RecvStatus {
  int source = -1;
  int tag = -1;
  std::int64_t count = 0;  ///< elements received
};

/// How a communicator behaves; defaults come from Config (the environment).
struct CommOptions {
  BackendKind backend = Config::get().backend;
  bool check = Config::get().check;
  std::chrono::milliseconds timeout = Config::get().timeout;
  /// MPI operations return at once with a pending token (nonblocking MPI) instead of completing before returning.
  bool async = false;
  /// A name for messages ("world", "mesh axis x", ...).
  std::string name = "world";
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
/// BackendError for failures of MPI, NCCL or CUDA.
///
/// A communicator is used by one thread at a time.
class Communicator {
 public:
  /// All ranks of the job (a duplicate of the Runtime's world communicator). Collective.
  static std::shared_ptr<Communicator> world(const Runtime& runtime, CommOptions options = {});
  /// All ranks of the job of the live Runtime. Collective.
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
  /// The backend an operation on buffers in `device` memory would use.
  BackendKind backend_for(Device device) const;
  /// The MPI communicator operations run on (for interop; valid while this object lives, or the caller's own for
  /// wrap_mpi).
  MpiCommHandle mpi_handle() const noexcept;
  /// True once a timeout aborted this communicator; every later operation raises BackendError.
  bool aborted() const noexcept;
  /// Number of collective operations issued so far (the sequence number of the next one).
  std::uint64_t sequence() const noexcept;

  // ---- buffer form ---------------------------------------------------------------------------------------------
  // Sizes are element counts and must agree across ranks as MPI requires; receive arrays must not be read-only.

  /// recv = op over ranks of send (same shape).
  Token allreduce(const Array& send, Array& recv, ReduceOp op, const Token& after = {});
  /// In place: buf = op over ranks of buf.
  Token allreduce_inplace(Array& buf, ReduceOp op, const Token& after = {});
  /// On root, recv = op over ranks of send; elsewhere recv is not touched (and may be empty).
  Token reduce(const Array& send, Array& recv, ReduceOp op, int root, const Token& after = {});
  /// In place: buf on every rank = buf on root.
  Token bcast_inplace(Array& buf, int root, const Token& after = {});
  /// recv (size * send.numel elements) = the ranks' sends, in rank order.
  Token allgather(const Array& send, Array& recv, const Token& after = {});
  /// On root, recv (size * send.numel elements) = the ranks' sends; elsewhere recv is not touched.
  Token gather(const Array& send, Array& recv, int root, const Token& after = {});
  /// recv = block `rank` of root's send (size * recv.numel elements; read on root only).
  Token scatter(const Array& send, Array& recv, int root, const Token& after = {});
  /// recv = block `rank` of op over ranks of send (send has size * recv.numel elements).
  Token reduce_scatter(const Array& send, Array& recv, ReduceOp op, const Token& after = {});
  /// Block j of send goes to rank j; block i of recv comes from rank i (equal blocks).
  Token alltoall(const Array& send, Array& recv, const Token& after = {});
  /// Sends buf to dest.
  Token send(const Array& buf, int dest, int tag = 0, const Token& after = {});
  /// Receives into buf from source (kAnySource allowed on MPI) with tag (kAnyTag allowed on MPI).
  Token recv_into(Array& buf, int source, int tag = kAnyTag, RecvStatus* status = nullptr, const Token& after = {});
  /// Sends `send` to dest and receives into `recv` from source at once (deadlock-free exchange).
  Token sendrecv_into(const Array& send, int dest, Array& recv, int source, int send_tag = 0, int recv_tag = kAnyTag,
                      RecvStatus* status = nullptr, const Token& after = {});
  /// Waits until every rank has arrived.
  Token barrier(const Token& after = {});
  /// Inclusive prefix: recv on rank r = op over ranks 0..r of send.
  Token scan(const Array& send, Array& recv, ReduceOp op, const Token& after = {});
  /// recv = the ranks' sends concatenated; counts[i] is rank i's element count (the same array on every rank).
  Token allgatherv(const Array& send, Array& recv, std::span<const std::int64_t> counts, const Token& after = {});
  /// send_counts[j] elements go to rank j (in rank order in send); recv_counts[i] come from rank i.
  Token alltoallv(const Array& send, std::span<const std::int64_t> send_counts, Array& recv,
                  std::span<const std::int64_t> recv_counts, const Token& after = {});

  // ---- value form (mpi4jax shape rules) --------------------------------------------------------------------------

  /// Same shape and dtype as x.
  Result allreduce(const Array& x, ReduceOp op, const Token& after = {});
  /// On root the reduction; elsewhere x unchanged.
  Result reduce(const Array& x, ReduceOp op, int root, const Token& after = {});
  /// Root's x, on every rank (x gives shape and dtype elsewhere).
  Result bcast(const Array& x, int root, const Token& after = {});
  /// Shape (size, *x.shape).
  Result allgather(const Array& x, const Token& after = {});
  /// On root shape (size, *x.shape); elsewhere x unchanged.
  Result gather(const Array& x, int root, const Token& after = {});
  /// On root x has shape (size, *s) and the result shape s; elsewhere x gives s and dtype.
  Result scatter(const Array& x, int root, const Token& after = {});
  /// x has shape (size, *s); result shape s: block `rank` of the reduction.
  Result reduce_scatter(const Array& x, ReduceOp op, const Token& after = {});
  /// x has shape (size, ...); result block i comes from rank i.
  Result alltoall(const Array& x, const Token& after = {});
  /// A new array shaped like x, received from source.
  Result recv(const Array& like, int source, int tag = kAnyTag, RecvStatus* status = nullptr,
              const Token& after = {});
  /// A new array shaped like recv_like, received from source while send goes to dest.
  Result sendrecv(const Array& send, const Array& recv_like, int source, int dest, int send_tag = 0,
                  int recv_tag = kAnyTag, RecvStatus* status = nullptr, const Token& after = {});
  /// Inclusive prefix reduction, same shape as x.
  Result scan(const Array& x, ReduceOp op, const Token& after = {});
  /// 1-d concatenation of every rank's x (flattened); x may differ in length between ranks.
  Result allgatherv(const Array& x, const Token& after = {});

 private:
  explicit Communicator(std::unique_ptr<detail::CommunicatorImpl> impl);
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace shardkit
