#include <functional>

#include "backend.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit {

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kLogicalAnd: return "land";
    case ReduceOp::kLogicalOr: return "lor";
    case ReduceOp::kLogicalXor: return "lxor";
    case ReduceOp::kBitAnd: return "band";
    case ReduceOp::kBitOr: return "bor";
    case ReduceOp::kBitXor: break;
  }
  return "bxor";
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

std::string OpContext::describe() const {
  if (step) return concat(step, " of communicator '", comm_name ? *comm_name : std::string("?"), "'");
  return concat(op_name(op), " #", seq, " on communicator '", comm_name ? *comm_name : std::string("?"), "'");
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
