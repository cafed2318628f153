// bench_collectives' command line: nccl-tests' flags (-b -e -f -n -w -r -c -d -o) plus --op, --json, --checked and --aa.

#include <algorithm>
#include <climits>
#include <string>
#include <string_view>

#include "args.hpp"
#include "bench.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;

namespace {

constexpr const char* kUsageHead =
    "usage: bench_collectives [options]\n"
    "  -b MINBYTES   smallest message size (default 8); suffixes K, M, G (powers of 1024)\n"
    "  -e MAXBYTES   largest message size (default 64M)\n"
    "  -f FACTOR     size multiplication factor between steps (default 4)\n"
    "  -n ITERS      back-to-back calls per measurement (default 20)\n"
    "  -w WARMUP     warm-up calls per size and side (default 5)\n"
    "  -r REPEATS    measurements per size and side, alternating shardkit / MPI (default 5)\n"
    "  -c CHECK      1: compare shardkit's result with MPI's once per size, exit 1 on a mismatch (default 1)\n"
    "  -d DTYPE      float32 (default), float64, int8..int64, uint8..uint64, complex64, complex128\n"
    "                (nccl-tests' float, double, int, char also accepted)\n"
    "  -o REDOP      reduction of allreduce / reduce_scatter / reduce: sum (default), prod, min, max\n"
    "  --op NAME     the operation (default allreduce; barrier moves no data: one row), one of\n";
constexpr const char* kUsageTail =
    "  --json PATH   also write the results as JSON to PATH ('-': stdout; the table then goes to stderr)\n"
    "  --checked     run shardkit in checked mode (signature exchange before each collective) to show its cost\n"
    "  --aa          A/A calibration: the shardkit column runs the raw MPI call too, so its ratio column shows the\n"
    "                spread that two identical sides measure on this machine\n"
    "  -h, --help    this text\n";

DType parse_dtype(std::string_view name) {
  // nccl-tests' names first.
  if (name == "float") return DType::kFloat32;
  if (name == "double") return DType::kFloat64;
  if (name == "int") return DType::kInt32;
  if (name == "char") return DType::kInt8;
  try {
    return dtype_from_name(name);
  } catch (const InvalidArgument&) {
    throw UsageError(concat("-d: unknown dtype '", name, "'"));
  }
}

ReduceOp parse_redop(std::string_view name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "prod") return ReduceOp::kProd;
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  throw UsageError(concat("-o: unknown reduction '", name, "' (sum, prod, min, max)"));
}

std::vector<const CollectiveTest*> parse_collectives(std::string_view list) {
  const auto all = all_collectives();
  std::vector<const CollectiveTest*> out;
  for (std::string_view name : split_list(list)) {
    if (name == "all") {
      out.assign(all.begin(), all.end());
      continue;
    }
    const auto it = std::find_if(all.begin(), all.end(), [&](const CollectiveTest* c) { return name == c->name; });
    if (it == all.end()) throw UsageError(concat("--op: unknown operation '", name, "'"));
    if (std::find(out.begin(), out.end(), *it) == out.end()) out.push_back(*it);
  }
  if (out.empty()) throw UsageError("--op: no operation given");
  return out;
}

}  // namespace

// The operations' names come from the table of entries (all_collectives()).
const char* usage_text() {
  static const std::string text = [] {
    const std::string indent(16, ' ');
    std::string ops, line = indent;
    for (const CollectiveTest* c : all_collectives()) {
      const std::string name = concat(c->name, ", ");
      if (line.size() + name.size() > 100) {
        ops += line.substr(0, line.size() - 1) + "\n";  // without the trailing space
        line = indent;
      }
      line += name;
    }
    ops += line + "or all; a comma-separated list\n";
    return concat(kUsageHead, ops, kUsageTail);
  }();
  return text.c_str();
}

Options parse_args(int argc, char** argv) {
  Options o;
  o.collectives = {&kAllreduceTest};
  ArgReader args(argc, argv, /*short_values=*/true);
  while (args.next()) {
    const std::string_view arg = args.name();
    auto count = [&](int min) {
      const std::int64_t v = parse_int(args.value(), arg);
      if (v < min || v > INT_MAX) throw UsageError(concat(arg, " must be at least ", min));
      return static_cast<int>(v);
    };
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "-b") {
      o.min_bytes = parse_size(args.value(), arg);
    } else if (arg == "-e") {
      o.max_bytes = parse_size(args.value(), arg);
    } else if (arg == "-f") {
      o.factor = count(2);
    } else if (arg == "-n") {
      o.iters = count(1);
    } else if (arg == "-w") {
      o.warmup = count(0);
    } else if (arg == "-r") {
      o.repeats = count(1);
    } else if (arg == "-c") {
      o.check = count(0) != 0;
    } else if (arg == "-d") {
      o.dtype = parse_dtype(args.value());
    } else if (arg == "-o") {
      o.redop = parse_redop(args.value());
    } else if (arg == "--op") {
      o.collectives = parse_collectives(args.value());
    } else if (arg == "--json") {
      o.json = args.value();
      if (o.json.empty()) throw UsageError("--json needs a path ('-' for stdout)");
    } else if (arg == "--checked" && !args.attached()) {
      o.checked = true;
    } else if (arg == "--aa" && !args.attached()) {
      o.aa = true;
    } else {
      throw UsageError(concat("unknown argument '", args.text(), "'"));
    }
  }
  if (o.help) return o;
  if (o.min_bytes < 1) throw UsageError("-b must be at least 1 byte");
  if (o.max_bytes < o.min_bytes) throw UsageError("-e must not be smaller than -b");
  for (const CollectiveTest* c : o.collectives)
    if (c->reduces && !reduce_op_supports(o.redop, o.dtype))
      throw UsageError(concat("-o ", reduce_op_name(o.redop), " is not defined for ", dtype_name(o.dtype)));
  if (!raw_datatype(o.dtype))
    throw UsageError(
        concat("-d ", dtype_name(o.dtype), ": MPI has no native datatype for it, so there is no raw baseline"));
  if (o.max_bytes / static_cast<std::int64_t>(dtype_size(o.dtype)) > INT_MAX)
    throw UsageError("-e: the raw MPI calls take int counts; the largest size is too big");
  return o;
}

std::vector<std::int64_t> message_sizes(const Options& o) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = o.min_bytes; s <= o.max_bytes; s = s > o.max_bytes / o.factor ? o.max_bytes + 1 : s * o.factor)
    sizes.push_back(s);
  return sizes;
}

}  // namespace shardkit::bench
