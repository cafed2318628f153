// The call sites of operations (call_site.hpp): each thread's current one, and the process's table of ids for them.

#include "shardkit/collectives/call_site.hpp"

#include <array>
#include <cstddef>
#include <mutex>
#include <vector>

namespace shardkit {
CallSite& current_call_site() noexcept {
  thread_local CallSite site;
  return site;
}

namespace {
std::mutex sites_mu;
std::vector<CallSite>& sites() {
  static auto* s = new std::vector<CallSite>{CallSite{}};  // id 0: none; never freed (handlers may outlive statics)
  return *s;
}
}  // namespace

std::int64_t call_site_id(const CallSite& site) {
  if (!site.file) return 0;
  std::lock_guard lock(sites_mu);
  auto& s = sites();
  for (std::size_t i = 1; i < s.size(); ++i)  // few sites: those of the traced calls
    if (s[i].file == site.file && s[i].line == site.line) return static_cast<std::int64_t>(i);
  s.push_back(site);
  return static_cast<std::int64_t>(s.size() - 1);
}

CallSite call_site_of(std::int64_t id) noexcept {
  // Every call of a compiled operation asks (the XLA handler): an id keeps its site for good, so each thread remembers
  // the ids it has seen, a few of them, and takes the lock only for others.
  struct Seen {
    std::int64_t id = 0;
    CallSite site;
  };
  thread_local std::array<Seen, 16> seen{};
  if (id <= 0) return CallSite{};
  Seen& slot = seen[static_cast<std::size_t>(id) % seen.size()];
  if (slot.id == id) return slot.site;
  std::lock_guard lock(sites_mu);
  const auto& s = sites();
  if (static_cast<std::size_t>(id) >= s.size()) return CallSite{};  // not (yet) an id: not remembered
  slot = {id, s[static_cast<std::size_t>(id)]};
  return slot.site;
}
}  // namespace shardkit
