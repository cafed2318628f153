#pragma once

// The MPI transport's descriptor (transport.hpp): made with every communicator, it takes every operation no other
// transport takes (the registry's last).

#include "transport.hpp"

namespace shardkit::detail {

const Transport& mpi_transport() noexcept;

}  // namespace shardkit::detail
