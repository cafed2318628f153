#include "timing.hpp"

#include <algorithm>
#include <chrono>

namespace shardkit::bench {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double slowest_rank(double seconds, MPI_Comm control) {
  double slowest = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, control));
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Stats stats(const std::vector<double>& values, double scale) {
  return {*std::min_element(values.begin(), values.end()) * scale, median(values) * scale};
}

}  // namespace shardkit::bench
