#include "agree.hpp"

#include <cstring>

#include "shardkit/core/error.hpp"

namespace shardkit::checkpoint::detail {

std::vector<std::string> all_texts(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  Array len = Array::from_values<std::int64_t>({static_cast<std::int64_t>(mine.size())});
  Result lens = comm.allgather(len);
  lens.token.wait();
  std::vector<std::int64_t> counts = lens.value.to_vector<std::int64_t>();
  Array bytes = Array::empty({static_cast<std::int64_t>(mine.size())}, DType::kUInt8);
  if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), mine.size());
  std::int64_t total = 0;
  for (auto c : counts) total += c;
  Array all = Array::empty({total}, DType::kUInt8);
  comm.allgatherv(bytes, all, counts).wait();
  std::vector<std::string> out(static_cast<std::size_t>(n));
  const char* p = static_cast<const char*>(all.data());
  for (int r = 0; r < n; ++r) {
    out[static_cast<std::size_t>(r)].assign(p, static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
    p += counts[static_cast<std::size_t>(r)];
  }
  return out;
}

std::string failure_text(const std::exception& e) {
  char code = 'B';
  if (const auto* err = dynamic_cast<const Error*>(&e)) {
    switch (err->code()) {
      case ErrorCode::kInvalidArgument: code = 'I'; break;
      case ErrorCode::kMismatch: code = 'M'; break;
      case ErrorCode::kTimeout: code = 'T'; break;
      case ErrorCode::kInternal: code = 'X'; break;
      default: code = 'B'; break;
    }
  }
  return std::string(1, code) + e.what();
}

std::vector<std::string> agree(Communicator& comm, const std::string& failure, const std::string& payload) {
  // One exchange carries both: "F<failure>" or "P<payload>".
  const std::vector<std::string> all = all_texts(comm, failure.empty() ? "P" + payload : "F" + failure);
  std::vector<std::string> payloads;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] != 'F') {
      payloads.push_back(all[r].substr(1));
      continue;
    }
    const char code = all[r].size() > 1 ? all[r][1] : 'B';
    const std::string message =
        (static_cast<int>(r) == comm.rank() ? std::string() : "on rank " + std::to_string(r) + ": ") +
        all[r].substr(2);
    switch (code) {
      case 'I': throw InvalidArgument(message);
      case 'M': throw MismatchError(message);
      case 'T': throw TimeoutError(message);
      default: throw BackendError("checkpoint", 0, message);
    }
  }
  return payloads;
}

}  // namespace shardkit::checkpoint::detail
