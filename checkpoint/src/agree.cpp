#include "agree.hpp"

#include <cstdlib>
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

// A failure travels as its class's letter, then for a BackendError its backend and native code (each ended by
// kSep), then the message: every rank raises the same class, backend and code.
constexpr char kSep = '\x1f';

std::string failure_text(const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  if (const auto* b = dynamic_cast<const BackendError*>(&e))
    return "B" + b->backend() + kSep + std::to_string(b->native_code()) + kSep + e.what();
  char code = 'B';
  if (err != nullptr) {
    switch (err->code()) {
      case ErrorCode::kInvalidArgument: code = 'I'; break;
      case ErrorCode::kMismatch: code = 'M'; break;
      case ErrorCode::kTimeout: code = 'T'; break;
      case ErrorCode::kInternal: code = 'X'; break;
      default: code = 'B'; break;
    }
  }
  if (code == 'B') return std::string("Bcheckpoint") + kSep + "0" + kSep + e.what();  // not a shardkit error
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
    const std::string prefix = static_cast<int>(r) == comm.rank() ? "" : "on rank " + std::to_string(r) + ": ";
    const std::string body = all[r].size() > 2 ? all[r].substr(2) : std::string();
    switch (code) {
      case 'I': throw InvalidArgument(prefix + body);
      case 'M': throw MismatchError(prefix + body);
      case 'T': throw TimeoutError(prefix + body);
      case 'X': throw Error(ErrorCode::kInternal, prefix + body);
      default: break;
    }
    // A BackendError: "<backend>\x1f<native code>\x1f<message>".
    const auto a = body.find(kSep);
    const auto b = a == std::string::npos ? a : body.find(kSep, a + 1);
    if (b == std::string::npos) throw BackendError("checkpoint", 0, prefix + body);
    throw BackendError(body.substr(0, a), std::atoi(body.c_str() + a + 1), prefix + body.substr(b + 1));
  }
  return payloads;
}

}  // namespace shardkit::checkpoint::detail
