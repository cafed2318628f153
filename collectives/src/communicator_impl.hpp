#pragma once

// The state behind a Communicator, shared by its construction (communicator.cpp) and the pipeline that runs every
// operation (pipeline.cpp).

#include <memory>
#include <string>

#include "backend.hpp"
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
  std::shared_ptr<AbortState> abort = std::make_shared<AbortState>();
  int rank = 0;
  int size = 1;
  int device = -1;            // the GPU this rank would run NCCL on (-1: none)
  bool nccl_decided = false;  // whether the ranks have agreed on using NCCL yet
  std::uint64_t seq = 0;
  int tag_ub = 32767;
  // The last operation of each backend: switching backend waits for the other one (rule 3 across backends).
  Token last_mpi, last_nccl;

  /// The control communicator, created (collectively, under the timeout) on first use.
  MpiCommHandle control();
  /// Agrees with the other ranks on NCCL (collective): used only when every rank has a GPU, NCCL is built and the
  /// backend is not forced to MPI. @throws BackendError when the backend is forced to NCCL and a rank cannot use it.
  void decide_nccl();
  /// @throws BackendError once the communicator was aborted.
  void ensure_usable() const;
  /// Runs one operation through the pipeline (validate, route, check, stage, run, token).
  Token run(OpKind op, const OpArgs& args, const Token& after);

 private:
  void create_control();
};

}  // namespace shardkit::detail
