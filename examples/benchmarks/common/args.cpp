#include "args.hpp"

#include <charconv>
#include <cstdint>

#include "shardkit/core/error.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;

ArgReader::ArgReader(int argc, char** argv, bool short_values)
    : argc_(argc), argv_(argv), short_values_(short_values) {}

bool ArgReader::next() {
  if (++i_ >= argc_) return false;
  name_ = argv_[i_];
  attached_.reset();
  if (name_.starts_with("--")) {
    if (const std::size_t eq = name_.find('='); eq != std::string_view::npos) {
      attached_ = name_.substr(eq + 1);
      name_ = name_.substr(0, eq);
    }
  } else if (short_values_ && name_.size() > 2 && name_[0] == '-') {
    attached_ = name_.substr(2);
    name_ = name_.substr(0, 2);
  }
  return true;
}

std::string_view ArgReader::value() {
  if (attached_) return *attached_;
  if (i_ + 1 >= argc_) throw UsageError(concat(name_, " needs a value"));
  return argv_[++i_];
}

void ArgReader::no_value() const {
  if (attached_) throw UsageError(concat(name_, " takes no value"));
}

std::int64_t parse_int(std::string_view text, std::string_view flag) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError(concat(flag, ": '", text, "' is not an integer"));
  return v;
}

std::int64_t parse_size(std::string_view text, std::string_view flag) {
  std::int64_t mult = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        mult = std::int64_t{1} << 10;
        break;
      case 'M':
      case 'm':
        mult = std::int64_t{1} << 20;
        break;
      case 'G':
      case 'g':
        mult = std::int64_t{1} << 30;
        break;
      default:
        break;
    }
  }
  if (mult != 1) text.remove_suffix(1);
  const std::int64_t v = parse_int(text, flag);
  if (v < 0 || v > INT64_MAX / mult) throw UsageError(concat(flag, ": size out of range"));
  return v * mult;
}

std::vector<std::string_view> split_list(std::string_view list) {
  std::vector<std::string_view> out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    out.push_back(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return out;
}

}  // namespace shardkit::bench
