// The local product: one operand cut (A by rows or B by columns), the other replicated; no communication.

#include "algorithm.hpp"
#include "shardkit/core/gemm.hpp"
#include "transfer.hpp"

namespace shardkit::detail {

Array local_gemm(const Blocks& blocks) {
  const Array& a = blocks.a.local();
  const Array& b = blocks.b.local();
  Array c = Array::empty({a.dim(0), b.dim(1)}, a.dtype(), a.device());
  gemm(a, b, c);
  settle(c);
  return c;
}

}  // namespace shardkit::detail
