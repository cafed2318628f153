#pragma once

// The state behind a Communicator, shared by its construction (communicator.cpp) and the pipeline that runs every
// operation (pipeline.cpp).

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "flight_recorder.hpp"
#include "transport.hpp"
#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

struct CommunicatorImpl {
  CommOptions options;
  // The communicator operations run on: a duplicate or split shardkit owns, or (wrap_mpi) the caller's.
  MpiComm owned;
  MpiCommHandle data = 0;
  // A private duplicate for checked-mode signatures, the MPI backend's own traffic and NCCL bootstrap: created on
  // first need (collective over the ranks), so that wrapping a caller's communicator costs nothing up front.
  MpiComm control_comm;
  /// One slot per registered transport, in the registry's order (transport.hpp): its backend and decision record.
  std::vector<TransportSlot> slots;
  // Whether some rank has a GPU, once known (some_rank_has_gpu): the ranks' fact, which transports' rules read.
  bool gpu_known = false;
  bool gpu_somewhere = false;
  std::shared_ptr<AbortState> abort = std::make_shared<AbortState>();
  int rank = 0;
  int size = 1;
  int device = -1;  // the GPU this rank runs device transports on (-1: none)
  std::uint64_t seq = 0;
  int tag_ub = 32767;
  std::shared_ptr<FlightRecorder> recorder;  // this communicator's recent operations (flight_recorder.hpp)
  // The identity every member agrees on (agreed with the control communicator; -1 until then): the flight recorder's
  // dumps carry it, so that two communicators over the same ranks (two dup()s, two meshes) are never taken for one.
  std::int64_t id = -1;
  // Whether some thread is inside run(): a second thread's operation meanwhile is refused (one thread at a time,
  // communicator.hpp). Relaxed, one load and one store an operation: two threads entering within the same few
  // nanoseconds may both pass, but not one that comes while another's operation waits for the other ranks.
  std::atomic<bool> running{false};

  /// The control communicator, created (collectively, under the timeout) on first use.
  MpiCommHandle control();
  /// Makes the transports made with every communicator and, where `collectively` (every rank is here: a communicator
  /// shardkit owns), those made with it (Transport::make_with_communicator).
  void make_transports(bool collectively);
  /// Whether some rank has a GPU: known from a transport's decision (learn_gpu), else asked of every rank (a blocking
  /// collective over the control communicator: call it only where every rank is known to be here).
  bool some_rank_has_gpu();
  /// What an exchange of a transport's decision learned of the ranks' GPUs.
  void learn_gpu(bool somewhere) noexcept {
    gpu_known = true;
    gpu_somewhere = somewhere;
  }
  /// The slot of the transport recorded as `kind` (nullptr: none registered).
  const TransportSlot* slot_of(BackendKind kind) const noexcept;
  /// @throws BackendError once the communicator was aborted.
  void ensure_usable() const;
  /// Runs one operation through the pipeline (validate, route, check, stage, run, token).
  Token run(OpKind op, const OpArgs& args, const Token& after);

 private:
  void create_control();
  /// Routes one operation: the transports' decisions it starts, then the first that takes it (its slot's index).
  std::size_t choose(const RouteRequest& req, const OpContext& ctx);
};

}  // namespace shardkit::detail
