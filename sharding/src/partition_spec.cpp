#include "shardkit/sharding/partition_spec.hpp"

#include <algorithm>
#include <cctype>

#include "shardkit/core/error.hpp"

namespace shardkit {

bool Axes::contains(std::string_view name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

std::string Axes::to_string() const {
  if (names_.size() == 1) return "'" + names_[0] + "'";
  std::string s = "(";
  for (std::size_t i = 0; i < names_.size(); ++i) s += (i ? ", '" : "'") + names_[i] + "'";
  return s + (names_.size() == 1 ? ",)" : ")");
}

const Axes& PartitionSpec::axes(std::size_t d) const {
  static const Axes kEmpty;
  return d < entries_.size() ? entries_[d].axes() : kEmpty;
}

std::vector<std::string> PartitionSpec::used_axes() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_)
    for (const std::string& a : e.axes()) out.push_back(a);
  return out;
}

PartitionSpec PartitionSpec::normalized() const {
  std::vector<Entry> e = entries_;
  while (!e.empty() && e.back().is_none()) e.pop_back();
  return PartitionSpec(std::move(e));
}

bool operator==(const PartitionSpec& a, const PartitionSpec& b) {
  return a.normalized().entries_ == b.normalized().entries_;
}

std::string PartitionSpec::to_string() const {
  std::string s = "P(";
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (i) s += ", ";
    s += entries_[i].is_none() ? "None" : entries_[i].axes().to_string();
  }
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec) { return os << spec.to_string(); }

namespace {

// A small recursive-descent parser over Python-like spec text.
class SpecParser {
 public:
  explicit SpecParser(std::string_view text) : t_(text) {}

  PartitionSpec parse() {
    skip_space();
    bool wrapped = false;
    if (peek_word("P")) {
      pos_ += 1;
      skip_space();
      expect('(');
      wrapped = true;
    }
    std::vector<PartitionSpec::Entry> entries;
    skip_space();
    while (!at_end() && !(wrapped && peek() == ')')) {
      entries.push_back(entry());
      skip_space();
      if (!at_end() && peek() == ',') {
        ++pos_;
        skip_space();
        continue;
      }
      break;
    }
    if (wrapped) expect(')');
    skip_space();
    if (!at_end()) fail("unexpected text");
    return PartitionSpec(std::move(entries));
  }

 private:
  PartitionSpec::Entry entry() {
    if (peek() == '(') {
      ++pos_;
      std::vector<std::string> names;
      skip_space();
      while (peek() != ')') {
        names.push_back(name());
        skip_space();
        if (peek() == ',') {
          ++pos_;
          skip_space();
        } else if (peek() != ')') {
          fail("expected ',' or ')' in a tuple of axes");
        }
      }
      ++pos_;
      if (names.empty()) return PartitionSpec::Entry(kNone);
      return PartitionSpec::Entry(Axes(std::move(names)));
    }
    std::string n = name(/*allow_none=*/true);
    if (n.empty()) return PartitionSpec::Entry(kNone);
    return PartitionSpec::Entry(std::move(n));
  }

  // A quoted or bare axis name; "" for None when allowed.
  std::string name(bool allow_none = false) {
    skip_space();
    if (at_end()) fail("expected an axis name");
    const char c = peek();
    if (c == '\'' || c == '"') {
      const std::size_t close = t_.find(c, pos_ + 1);
      if (close == std::string_view::npos) fail("unterminated quote");
      std::string n(t_.substr(pos_ + 1, close - pos_ - 1));
      pos_ = close + 1;
      if (n.empty()) fail("empty axis name");
      return n;
    }
    if (!(std::isalpha(static_cast<unsigned char>(c)) || c == '_')) fail("expected an axis name");
    const std::size_t start = pos_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_')) ++pos_;
    std::string n(t_.substr(start, pos_ - start));
    if (n == "None") {
      if (!allow_none) fail("None inside a tuple of axes");
      return "";
    }
    return n;
  }

  bool peek_word(std::string_view w) const {
    if (t_.substr(pos_, w.size()) != w) return false;
    std::size_t after = pos_ + w.size();
    while (after < t_.size() && std::isspace(static_cast<unsigned char>(t_[after]))) ++after;
    return after < t_.size() && t_[after] == '(';
  }
  char peek() const { return at_end() ? '\0' : t_[pos_]; }
  bool at_end() const { return pos_ >= t_.size(); }
  void skip_space() {
    while (!at_end() && std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(detail::concat("cannot parse partition spec \"", t_, "\": ", what, " at offset ", pos_));
  }

  std::string_view t_;
  std::size_t pos_ = 0;
};

}  // namespace

PartitionSpec PartitionSpec::parse(std::string_view text) { return SpecParser(text).parse(); }

}  // namespace shardkit
