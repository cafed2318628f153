#pragma once

#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace shardkit {

/// A set of mesh axis names, major to minor: one name (`"x"`) or a tuple (`{"x", "y"}`). Collectives of a
/// ShardContext and the entries of a PartitionSpec take them.
class Axes {
 public:
  Axes() = default;
  Axes(const char* name) : names_{name} {}               // NOLINT(google-explicit-constructor): P("x")
  Axes(std::string name) : names_{std::move(name)} {}    // NOLINT(google-explicit-constructor)
  Axes(std::initializer_list<std::string> names) : names_(names) {}
  explicit Axes(std::vector<std::string> names) : names_(std::move(names)) {}

  const std::vector<std::string>& names() const noexcept { return names_; }
  std::size_t size() const noexcept { return names_.size(); }
  bool empty() const noexcept { return names_.empty(); }
  const std::string& operator[](std::size_t i) const { return names_[i]; }
  auto begin() const noexcept { return names_.begin(); }
  auto end() const noexcept { return names_.end(); }
  bool contains(std::string_view name) const;
  friend bool operator==(const Axes&, const Axes&) = default;
  /// "'x'" or "('x', 'y')".
  std::string to_string() const;

 private:
  std::vector<std::string> names_;
};

/// The `None` entry of a PartitionSpec: the dimension is not sharded.
struct Replicated {};
inline constexpr Replicated kNone{};

/// How each dimension of a global array is cut across mesh axes, as JAX's PartitionSpec: one entry per dimension,
/// each None (kNone) or a mesh axis or a tuple of axes (major to minor). Trailing entries may be omitted (they are
/// None); a mesh axis appears at most once; axes not mentioned mean replication over them.
class PartitionSpec {
 public:
  /// One entry: kNone, "x", or {"x", "y"}.
  class Entry {
   public:
    Entry(Replicated) {}                                          // NOLINT(google-explicit-constructor)
    Entry(const char* name) : axes_(name) {}                     // NOLINT(google-explicit-constructor)
    Entry(std::string name) : axes_(std::move(name)) {}          // NOLINT(google-explicit-constructor)
    Entry(Axes axes) : axes_(std::move(axes)) {}                 // NOLINT(google-explicit-constructor)
    Entry(std::initializer_list<std::string> names) : axes_(names) {}
    bool is_none() const noexcept { return axes_.empty(); }
    const Axes& axes() const noexcept { return axes_; }
    friend bool operator==(const Entry&, const Entry&) = default;

   private:
    Axes axes_;
  };

  /// P(): every dimension replicated.
  PartitionSpec() = default;
  PartitionSpec(std::initializer_list<Entry> entries) : entries_(entries) {}
  explicit PartitionSpec(std::vector<Entry> entries) : entries_(std::move(entries)) {}

  /// Parses Python-like text: "P('x', None)", "('x', 'y'), None", "x, None", "" (all replicated).
  /// @throws InvalidArgument on malformed text.
  static PartitionSpec parse(std::string_view text);

  std::size_t size() const noexcept { return entries_.size(); }
  const Entry& operator[](std::size_t i) const { return entries_[i]; }
  /// The axes of dimension d (empty past the end: trailing entries are None).
  const Axes& axes(std::size_t d) const;
  const std::vector<Entry>& entries() const noexcept { return entries_; }
  /// Every mesh axis the spec names, in order of appearance.
  std::vector<std::string> used_axes() const;
  /// The same spec with trailing None entries dropped (equal specs compare equal after this).
  PartitionSpec normalized() const;
  friend bool operator==(const PartitionSpec& a, const PartitionSpec& b);
  /// "P('x', None)".
  std::string to_string() const;

 private:
  std::vector<Entry> entries_;
};

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec);

/// P("x", kNone, {"y", "z"}): builds a PartitionSpec like JAX's `P(...)`.
template <typename... E>
PartitionSpec P(E&&... entries) {
  return PartitionSpec{PartitionSpec::Entry(std::forward<E>(entries))...};
}

}  // namespace shardkit
