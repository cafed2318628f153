#include <algorithm>
#include <array>
#include <cctype>
#include <functional>

#include "backend.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit {

namespace {

// The one list of reduction names, in ReduceOp order (see reduce_op_name).
constexpr std::array<const char*, kReduceOpCount> kReduceOpNames = {
    "sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor"};
static_assert(std::ranges::none_of(kReduceOpNames, [](const char* n) { return n == nullptr; }),
              "every ReduceOp needs a name");

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
char upper(char c) { return static_cast<char>(std::toupper(static_cast<unsigned char>(c))); }

}  // namespace

const char* reduce_op_name(ReduceOp op) noexcept {
  const auto i = static_cast<std::size_t>(op);
  return i < kReduceOpNames.size() ? kReduceOpNames[i] : "unknown";
}

ReduceOp reduce_op_from_name(std::string_view name) {
  std::string lowered(name);
  std::ranges::transform(lowered, lowered.begin(), lower);
  for (std::size_t i = 0; i < kReduceOpNames.size(); ++i)
    if (lowered == kReduceOpNames[i]) return static_cast<ReduceOp>(i);
  throw InvalidArgument(detail::concat("unknown reduction '", lowered, "' (", reduce_op_names(), ")"));
}

std::string reduce_op_names(bool upper_case) {
  std::string list;
  for (const char* n : kReduceOpNames) {
    if (!list.empty()) list += ", ";
    list += n;
  }
  if (upper_case) std::ranges::transform(list, list.begin(), upper);
  return list;
}

bool reduce_op_supports(ReduceOp op, DType dtype) noexcept {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProd: return dtype != DType::kBool;
    case ReduceOp::kMin:
    case ReduceOp::kMax: return dtype != DType::kBool && !is_complex(dtype);
    default: break;
  }
  return is_integer(dtype) || dtype == DType::kBool;
}

namespace detail {

Clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept {
  return timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
}

OpContext OpContext::for_step(OpKind op, const char* what, const std::string& name, std::chrono::milliseconds timeout,
                              std::uint64_t seq) {
  OpContext ctx{};
  ctx.op = op;
  ctx.step = what;
  ctx.seq = seq;
  ctx.comm_name = &name;
  ctx.timeout = timeout;
  ctx.deadline = deadline_after(timeout);
  return ctx;
}

std::string OpContext::describe() const {
  if (step) return concat(step, " of communicator '", comm_name ? *comm_name : std::string("?"), "'");
  // Collectives carry their sequence number (the same on every rank); point-to-point operations have none.
  return concat(op_name(op), op_traits(op).collective ? concat(" #", seq) : std::string(), " on communicator '",
                comm_name ? *comm_name : std::string("?"), "'");
}

namespace {

class ThenWaitable final : public Waitable {
 public:
  ThenWaitable(std::shared_ptr<Waitable> inner, std::function<void()> then)
      : inner_(std::move(inner)), then_(std::move(then)) {}
  void wait() override {
    if (!then_) return;
    inner_->wait();
    auto f = std::move(then_);
    then_ = nullptr;
    f();
  }
  bool is_complete() override {
    if (!then_) return true;
    if (!inner_->is_complete()) return false;
    wait();
    return true;
  }

 private:
  std::shared_ptr<Waitable> inner_;
  std::function<void()> then_;
};

}  // namespace

Token then(Token token, std::function<void()> f) {
  if (token.is_complete()) {
    token.wait();  // rethrows a failure recorded in a completed operation
    f();
    return Token();
  }
  return Token(std::make_shared<ThenWaitable>(token.waitable(), std::move(f)));
}

}  // namespace detail
}  // namespace shardkit
