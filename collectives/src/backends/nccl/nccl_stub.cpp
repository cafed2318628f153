// Stands in for nccl_backend.cpp in builds without NCCL.
#include "backend.hpp"
#include "shardkit/core/error.hpp"
#include "backends/nccl/nccl_backend.hpp"

namespace shardkit::detail {

bool nccl_built() noexcept { return false; }

std::unique_ptr<Backend> make_nccl_backend(MpiCommHandle, int, std::shared_ptr<AbortState>, std::chrono::milliseconds) {
  throw BackendError("NCCL", 0, "shardkit was built without NCCL (SHARDKIT_NCCL=OFF or NCCL not found)");
}

std::unique_ptr<Backend> split_nccl_backend(Backend&, int, int, std::shared_ptr<AbortState>,
                                            std::chrono::milliseconds) {
  throw BackendError("NCCL", 0, "shardkit was built without NCCL");
}

}  // namespace shardkit::detail
