// A program outside the shardkit tree, built against an installed shardkit.
#include <cstdio>

#include "shardkit/config.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/launch/runtime.hpp"

int main(int argc, char** argv) {
  shardkit::Runtime rt(&argc, &argv);
  shardkit::Array a = shardkit::Array::arange(6, shardkit::DType::kFloat64).reshape({2, 3});
  shardkit::Array b = shardkit::Array::arange(6, shardkit::DType::kFloat64).reshape({3, 2});
  shardkit::Array c = shardkit::Array::empty({2, 2}, shardkit::DType::kFloat64);
  shardkit::gemm(a, b, c);
  const double c00 = c.to_vector<double>()[0];  // 0*0 + 1*2 + 2*4
  if (c00 != 10.0) {
    std::fprintf(stderr, "wrong gemm result %g\n", c00);
    return 1;
  }
  std::printf("consumer ok on rank %d of %d (shardkit %s)\n", rt.rank(), rt.size(), SHARDKIT_VERSION_STRING);
  return 0;
}
