#include "shardkit/collectives/token.hpp"

#include <vector>

namespace shardkit {
namespace {

// Completes when all of its parts have. Waiting rethrows the first failure.
class JoinedWaitable final : public Waitable {
 public:
  explicit JoinedWaitable(std::vector<std::shared_ptr<Waitable>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& p : parts_) p->wait();
    parts_.clear();
  }
  bool is_complete() override {
    for (auto& p : parts_)
      if (!p->is_complete()) return false;
    return true;
  }
  void enqueue_wait(StreamHandle stream) override {
    for (auto& p : parts_) p->enqueue_wait(stream);
  }

 private:
  std::vector<std::shared_ptr<Waitable>> parts_;
};

}  // namespace

Token Token::join(const Token& a, const Token& b) {
  if (!a.w_) return b;
  if (!b.w_ || a.w_ == b.w_) return a;
  return Token(std::make_shared<JoinedWaitable>(std::vector<std::shared_ptr<Waitable>>{a.w_, b.w_}));
}

Token Token::from_stream(StreamHandle stream, int device) { return Token(cuda::record_event(stream, device)); }

bool Token::is_complete() const { return !w_ || w_->is_complete(); }

void Token::order_stream(StreamHandle stream) const {
  if (w_) w_->enqueue_wait(stream);
}

}  // namespace shardkit
