#pragma once

// The state behind a Communicator, shared by its construction (communicator.cpp) and the pipeline that runs every
// operation (pipeline.cpp).

#include <atomic>
#include <memory>
#include <string>

#include "backend.hpp"
#include "flight_recorder.hpp"
#include "routing.hpp"
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
  std::unique_ptr<Backend> mpi;
  std::unique_ptr<Backend> nccl;
  std::unique_ptr<Backend> shm;  // made by the first collective routed to it (decide_shm)
  bool shm_decided = false;
  bool gpu_somewhere = false;  // some rank has a GPU: known on every rank once the NCCL decision is made
  bool shm_hierarchical = false;  // shm spans nodes (shm/hierarchy.hpp): it serves fewer operations, on its own table
  // Whether point-to-point operations take shm (RouteRequest::p2p_shm): only where shm was made with the communicator
  // (make_shm_now), flat, and no rank has a GPU (whose buffers take MPI or NCCL: a send from one and its receive into
  // host memory would take different backends).
  bool p2p_shm = false;
  std::string shm_refusal;  // why the ranks have no shm backend
  std::shared_ptr<AbortState> abort = std::make_shared<AbortState>();
  int rank = 0;
  int size = 1;
  int device = -1;            // the GPU this rank would run NCCL on (-1: none)
  bool nccl_decided = false;  // whether the ranks have agreed on using NCCL yet
  // Whether that agreement was made when the communicator was made (collectively, by every rank): only then may
  // point-to-point operations use NCCL. A decision made later, by the first collective on GPU buffers, could not be
  // made by a send between two ranks (the others never come), and a send before it and its receive after it would
  // take different backends; so on such communicators send/recv/sendrecv always take MPI.
  bool nccl_for_p2p = false;
  std::string nccl_refusal;  // why the ranks agreed not to use NCCL, for SHARDKIT_BACKEND=nccl's error
  std::uint64_t seq = 0;
  int tag_ub = 32767;
  // The last operation of each backend: switching backend waits for the other one (rule 3 across backends).
  Token last_mpi, last_nccl;
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
  /// Agrees with the other ranks on NCCL (collective): used only when every rank has a GPU, NCCL is built and the
  /// backend is not forced to MPI (else nccl_refusal says why).
  void decide_nccl();
  /// Makes the shm backend: flat when every rank is on one node, hierarchical when they span nodes (collective, a step
  /// of the operation `op` that asked for it, under its deadline; where none can be made, shm_refusal says why).
  void decide_shm(const OpContext& op);
  /// Makes the shm backend now, with the communicator (collective, under the timeout), where the setting may use it:
  /// then point-to-point operations may use it too (p2p_shm).
  void make_shm_now();
  /// @throws BackendError when the backend is forced to NCCL and `op` cannot use it here.
  void require_nccl(OpKind op) const;
  /// Whether `op` may run on NCCL here (NCCL agreed on; for point-to-point, agreed on at creation).
  bool nccl_usable_for(OpKind op) const;
  /// What the router reads of the shm backend as it stands (hierarchical, crowded; both false before it is made).
  void describe_shm(RouteRequest& r) const;
  /// @throws BackendError once the communicator was aborted.
  void ensure_usable() const;
  /// Runs one operation through the pipeline (validate, route, check, stage, run, token).
  Token run(OpKind op, const OpArgs& args, const Token& after);

 private:
  void create_control();
};

}  // namespace shardkit::detail
