#pragma once

// Command-line parsing shared by the benchmarks: nccl-tests' forms ("-b 8", "-b8") and long options ("--op all",
// "--op=all"), integers, sizes with binary suffixes and comma-separated lists.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace shardkit::bench {

/// A bad command line: main() prints it with the usage text and every rank exits with 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Walks argv one option at a time, splitting off a value attached with '=' (long options) or, when `short_values`,
/// glued to a one-letter option ("-b8").
class ArgReader {
 public:
  /// @param short_values  whether "-b8" means "-b 8" (nccl-tests' style); otherwise only "--name=value" attaches.
  ArgReader(int argc, char** argv, bool short_values);

  /// Moves to the next argument; false when none is left.
  bool next();
  /// The option's name, without an attached value ("--op", "-b").
  std::string_view name() const { return name_; }
  /// The argument as given on the command line.
  std::string_view text() const { return argv_[i_]; }
  /// Whether a value was attached to the option.
  bool attached() const { return attached_.has_value(); }
  /// The option's value: the attached one, else the next argument. @throws UsageError when there is none.
  std::string_view value();
  /// For a flag: @throws UsageError "takes no value" when a value was attached.
  void no_value() const;

 private:
  int argc_;
  char** argv_;
  bool short_values_;
  int i_ = 0;
  std::string_view name_;
  std::optional<std::string_view> attached_;
};

/// `text` as an integer. @throws UsageError naming `flag` when it is not one.
std::int64_t parse_int(std::string_view text, std::string_view flag);

/// "8", "64K", "64M", "1G": binary multiples, as nccl-tests reads them. @throws UsageError when out of range.
std::int64_t parse_size(std::string_view text, std::string_view flag);

/// The items of a comma-separated list (views into `list`).
std::vector<std::string_view> split_list(std::string_view list);

}  // namespace shardkit::bench
