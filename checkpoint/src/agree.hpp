#pragma once
// How the ranks of a save agree: every rank's text on every rank, and failures carried to every rank as the same
// error class, so that one rank's failure makes every rank raise (and nobody commits).

#include <string>
#include <vector>

#include "shardkit/collectives/communicator.hpp"

namespace shardkit::checkpoint::detail {

/// Every rank's `mine`, indexed by rank (two collectives: the lengths, then the bytes).
std::vector<std::string> all_texts(Communicator& comm, const std::string& mine);

/// A local failure as text for agree(): "" for none.
std::string failure_text(const std::exception& e);

/// Exchanges each rank's failure_text ("" when it succeeded); when any rank failed, every rank raises that rank's
/// error (its class, its message, naming the rank). Returns every rank's `payload` otherwise.
std::vector<std::string> agree(Communicator& comm, const std::string& failure, const std::string& payload = {});

}  // namespace shardkit::checkpoint::detail
