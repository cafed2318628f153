#pragma once

// The NCCL transport's descriptor (transport.hpp): GPU buffers, where every rank has a GPU of its own and NCCL is
// built.

#include "transport.hpp"

namespace shardkit::detail {

const Transport& nccl_transport() noexcept;

}  // namespace shardkit::detail
