#include "layout.hpp"

namespace shardkit::detail {

Array packed(const Array& x) { return x.is_contiguous() ? x : x.clone(); }

}  // namespace shardkit::detail
