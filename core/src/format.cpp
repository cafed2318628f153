#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "shardkit/core/array.hpp"

namespace shardkit {
namespace {

template <typename T>
std::string format_element(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else if constexpr (requires { v.real(); }) {
    std::ostringstream os;
    os << "(" << format_element(v.real()) << (v.imag() < 0 ? "" : "+") << format_element(v.imag()) << "j)";
    return os.str();
  } else {
    const double x = to_double(v);
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[64];
    // Shortest round-trip text at the element's own precision, NumPy style ("2." for integral values).
    std::to_chars_result r;
    if constexpr (std::is_same_v<T, double>)
      r = std::to_chars(buf, buf + sizeof buf, x);
    else
      r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
    std::string s(buf, r.ptr);
    if (s.find_first_of(".e") == std::string::npos) s += ".";
    return s;
  }
}

constexpr std::int64_t kSummarizeThreshold = 1000;
constexpr std::int64_t kEdgeItems = 3;

void format_rec(std::ostringstream& os, const std::vector<std::string>& items, const Shape& shape,
                const Strides& strides, int d, std::int64_t offset, std::size_t width, bool summarize) {
  if (d == static_cast<int>(shape.size())) {
    const std::string& s = items[offset];
    os << std::string(width - s.size(), ' ') << s;
    return;
  }
  os << "[";
  const std::int64_t n = shape[d];
  const bool cut = summarize && n > 2 * kEdgeItems;
  const bool last = d + 1 == static_cast<int>(shape.size());
  for (std::int64_t i = 0; i < n; ++i) {
    if (cut && i == kEdgeItems) {
      if (last)
        os << " ...";
      else
        os << '\n' << std::string(static_cast<std::size_t>(d + 1), ' ') << "...";
      i = n - kEdgeItems;
    }
    if (i > 0 || (cut && i == n - kEdgeItems)) {
      if (last)
        os << " ";
      else
        os << std::string(static_cast<std::size_t>(shape.size() - d - 1), '\n') << std::string(d + 1, ' ');
    }
    format_rec(os, items, shape, strides, d + 1, offset + i * strides[d], width, summarize);
  }
  os << "]";
}

}  // namespace

std::string Array::to_string() const {
  // As NumPy prints any empty array. Walking the dimensions instead would print one "[]" per row of, e.g., a
  // (10**12, 0) array: work and text that grow with the dimensions of an array of no elements.
  if (numel_ == 0) return "[]";
  const Array host = to(Device::cpu());
  std::vector<std::string> items(static_cast<std::size_t>(numel_));
  visit_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.data());
    for (std::int64_t i = 0; i < numel_; ++i) items[i] = format_element(p[i]);
  });
  std::size_t width = 0;
  for (const auto& s : items) width = std::max(width, s.size());
  std::ostringstream os;
  if (ndim() == 0) return numel_ ? items[0] : "[]";
  format_rec(os, items, host.shape(), host.strides(), 0, 0, width, numel_ > kSummarizeThreshold);
  return os.str();
}

}  // namespace shardkit
