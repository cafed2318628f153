// bench_collectives: shardkit's collectives against the raw MPI calls underneath them, in the style of nccl-tests.
//
// For every operation and message size, the same host buffers go to shardkit's Communicator (buffer form, created
// with the fast-path options) and to the MPI call it stands for, issued on a separate duplicate of the Runtime's
// world communicator. Repeats alternate the two (shardkit, MPI, shardkit, MPI, ...) so that machine noise hits both
// alike. One measurement is a barrier, then `iters` back-to-back calls; its per-call time is the maximum over ranks.
// The table gives, per size, the min and median over the repeats of each side, algbw and busbw as nccl-tests defines
// them, and shardkit's overhead: the ratio shardkit / MPI (of the medians and of the mins) and the extra time.
//
// Run:  mpirun -np 2 bench_collectives --op all -b 8 -e 64M -f 2 -r 5 [--json results.json]
//       bench_collectives -h   lists every flag.

#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "bench_json.hpp"
#include "shardkit/collectives/communicator.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"
#include "shardkit/launch/runtime.hpp"

namespace {

using shardkit::Array;
using shardkit::examples::json_number;
using shardkit::examples::json_string;
using shardkit::DType;
using shardkit::ReduceOp;

// ---- operations -----------------------------------------------------------------------------------------------------

enum class Collective { kAllreduce, kAllgather, kReduceScatter, kBcast, kAlltoall, kSendrecv };
constexpr Collective kAllCollectives[] = {Collective::kAllreduce, Collective::kAllgather, Collective::kReduceScatter,
                                          Collective::kBcast,     Collective::kAlltoall,  Collective::kSendrecv};
// bcast's root (nccl-tests' default).
constexpr int kRoot = 0;
// Sizes from which the overhead ratio is summarised (bandwidth-bound messages).
constexpr std::int64_t kLargeBytes = std::int64_t{64} << 10;

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kBcast:
      return "bcast";
    case Collective::kAlltoall:
      return "alltoall";
    case Collective::kSendrecv:
      break;
  }
  return "sendrecv";
}

bool reduces(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduceScatter;
}

// nccl-tests' busbw = algbw * factor: what each rank's link must carry for the algorithm-independent optimum.
double bus_factor(Collective c, int n) {
  switch (c) {
    case Collective::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Collective::kAllgather:
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
      return static_cast<double>(n - 1) / n;
    case Collective::kBcast:
    case Collective::kSendrecv:
      break;
  }
  return 1.0;
}

// Buffer sizes of one operation for a requested message size, as nccl-tests' GetCollByteCount works them out: the
// element count is rounded down to a multiple of the rank count where the buffer is split in blocks, but never to
// zero (at least one element, one per rank for the block-wise operations).
struct Layout {
  std::int64_t send_count = 0;  // elements of the send buffer (bcast: of the one in-place buffer)
  std::int64_t recv_count = 0;  // elements of the receive buffer
  std::int64_t count = 0;       // the count nccl-tests prints: per rank (allgather: sent, reduce_scatter: received)
  std::int64_t bytes = 0;       // the size nccl-tests prints: the larger of the two buffers
};

Layout layout_for(Collective c, std::int64_t bytes, std::size_t itemsize, int n) {
  const std::int64_t count = std::max<std::int64_t>(1, bytes / static_cast<std::int64_t>(itemsize));
  const std::int64_t block = std::max<std::int64_t>(1, count / n);
  Layout l;
  switch (c) {
    case Collective::kAllgather:
      l = {block, block * n, block, 0};
      break;
    case Collective::kReduceScatter:
      l = {block * n, block, block, 0};
      break;
    case Collective::kAlltoall:
      l = {block * n, block * n, block, 0};
      break;
    default:
      l = {count, count, count, 0};
      break;
  }
  l.bytes = std::max(l.send_count, l.recv_count) * static_cast<std::int64_t>(itemsize);
  return l;
}

// ---- options --------------------------------------------------------------------------------------------------------

struct Options {
  std::int64_t min_bytes = 8;
  std::int64_t max_bytes = std::int64_t{64} << 20;
  std::int64_t factor = 4;
  int iters = 20;
  int warmup = 5;
  int repeats = 5;
  bool check = true;  // nccl-tests checks by default too; it costs one extra call of each side per size
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  std::vector<Collective> collectives = {Collective::kAllreduce};
  std::string json;      // "" none, "-" stdout
  bool checked = false;  // shardkit's checked mode, to show its cost
  bool help = false;
};

constexpr const char* kUsage =
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
    "  -o REDOP      reduction of allreduce / reduce_scatter: sum (default), prod, min, max\n"
    "  --op NAME     allreduce (default), allgather, reduce_scatter, bcast, alltoall, sendrecv; a comma-separated\n"
    "                list, or all\n"
    "  --json PATH   also write the results as JSON to PATH ('-': stdout; the table then goes to stderr)\n"
    "  --checked     run shardkit in checked mode (signature exchange before each collective) to show its cost\n"
    "  -h, --help    this text\n";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::int64_t parse_int(std::string_view text, std::string_view flag) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError(shardkit::detail::concat(flag, ": '", text, "' is not an integer"));
  return v;
}

// "8", "64K", "64M", "1G": binary multiples, as nccl-tests reads them.
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
  if (v < 0 || v > INT64_MAX / mult) throw UsageError(shardkit::detail::concat(flag, ": size out of range"));
  return v * mult;
}

DType parse_dtype(std::string_view name) {
  // nccl-tests' names first.
  if (name == "float") return DType::kFloat32;
  if (name == "double") return DType::kFloat64;
  if (name == "int") return DType::kInt32;
  if (name == "char") return DType::kInt8;
  try {
    return shardkit::dtype_from_name(name);
  } catch (const shardkit::InvalidArgument&) {
    throw UsageError(shardkit::detail::concat("-d: unknown dtype '", name, "'"));
  }
}

ReduceOp parse_redop(std::string_view name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "prod") return ReduceOp::kProd;
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  throw UsageError(shardkit::detail::concat("-o: unknown reduction '", name, "' (sum, prod, min, max)"));
}

std::vector<Collective> parse_collectives(std::string_view list) {
  std::vector<Collective> out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (name == "all") {
      out.assign(std::begin(kAllCollectives), std::end(kAllCollectives));
      continue;
    }
    const auto* it = std::find_if(std::begin(kAllCollectives), std::end(kAllCollectives),
                                  [&](Collective c) { return name == collective_name(c); });
    if (it == std::end(kAllCollectives))
      throw UsageError(shardkit::detail::concat("--op: unknown operation '", name, "'"));
    if (std::find(out.begin(), out.end(), *it) == out.end()) out.push_back(*it);
  }
  if (out.empty()) throw UsageError("--op: no operation given");
  return out;
}

// Flags as nccl-tests takes them ("-b 8" or "-b8"), plus long options ("--op all" or "--op=all").
Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string_view> attached;
    if (arg.starts_with("--")) {
      if (const std::size_t eq = arg.find('='); eq != std::string_view::npos) {
        attached = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
    } else if (arg.size() > 2 && arg[0] == '-') {
      attached = arg.substr(2);
      arg = arg.substr(0, 2);
    }
    auto value = [&]() -> std::string_view {
      if (attached) return *attached;
      if (i + 1 >= argc) throw UsageError(shardkit::detail::concat(arg, " needs a value"));
      return argv[++i];
    };
    auto count = [&](int min) {
      const std::int64_t v = parse_int(value(), arg);
      if (v < min || v > INT_MAX) throw UsageError(shardkit::detail::concat(arg, " must be at least ", min));
      return static_cast<int>(v);
    };
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "-b") {
      o.min_bytes = parse_size(value(), arg);
    } else if (arg == "-e") {
      o.max_bytes = parse_size(value(), arg);
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
      o.dtype = parse_dtype(value());
    } else if (arg == "-o") {
      o.redop = parse_redop(value());
    } else if (arg == "--op") {
      o.collectives = parse_collectives(value());
    } else if (arg == "--json") {
      o.json = value();
      if (o.json.empty()) throw UsageError("--json needs a path ('-' for stdout)");
    } else if (arg == "--checked" && !attached) {
      o.checked = true;
    } else {
      throw UsageError(shardkit::detail::concat("unknown argument '", argv[i], "'"));
    }
  }
  if (o.help) return o;
  if (o.min_bytes < 1) throw UsageError("-b must be at least 1 byte");
  if (o.max_bytes < o.min_bytes) throw UsageError("-e must not be smaller than -b");
  for (Collective c : o.collectives)
    if (reduces(c) && !shardkit::reduce_op_supports(o.redop, o.dtype))
      throw UsageError(shardkit::detail::concat("-o ", shardkit::reduce_op_name(o.redop), " is not defined for ",
                                                shardkit::dtype_name(o.dtype)));
  return o;
}

std::vector<std::int64_t> message_sizes(const Options& o) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = o.min_bytes; s <= o.max_bytes; s = s > o.max_bytes / o.factor ? o.max_bytes + 1 : s * o.factor)
    sizes.push_back(s);
  return sizes;
}

// ---- the raw MPI side -----------------------------------------------------------------------------------------------

// The datatype of the baseline: a native MPI type (shardkit's MPI backend maps these dtypes to the same ones). MPI
// has no float16 / bfloat16, and no sum for bool, so those have no raw baseline.
std::optional<MPI_Datatype> raw_datatype(DType d) {
  switch (d) {
    case DType::kInt8:
      return MPI_INT8_T;
    case DType::kInt16:
      return MPI_INT16_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
    case DType::kUInt16:
      return MPI_UINT16_T;
    case DType::kUInt32:
      return MPI_UINT32_T;
    case DType::kUInt64:
      return MPI_UINT64_T;
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kComplex64:
      return MPI_C_FLOAT_COMPLEX;
    case DType::kComplex128:
      return MPI_C_DOUBLE_COMPLEX;
    default:
      break;
  }
  return std::nullopt;
}

MPI_Op raw_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    default:
      break;
  }
  return MPI_SUM;
}

// ---- buffers --------------------------------------------------------------------------------------------------------

template <typename T>
constexpr bool kNumeric = std::is_arithmetic_v<T>;
template <typename T>
constexpr bool kNumeric<std::complex<T>> = true;

// Inputs whose reductions are exact in every dtype and in any order (small integers; +-1 and +-2 for prod; integer
// overflow wraps alike on both sides), so that shardkit's result and MPI's can be compared bit for bit.
void fill_inputs(Array& a, int rank, ReduceOp redop) {
  shardkit::visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kNumeric<T>) {
      static constexpr int kProdValues[] = {1, 2, -1, -2};
      T* p = static_cast<T*>(a.data());
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        const int v = redop == ReduceOp::kProd ? kProdValues[(i + rank) % 4]
                                               : static_cast<int>((i * 7 + std::int64_t{rank} * 13) % 17) - 8;
        p[i] = static_cast<T>(v);
      }
    }
  });
}

// Output buffers start as this pattern, so that an operation that writes nothing is caught by the check.
void fill_sentinel(Array& a) {
  std::memset(a.data(), 0xA5, a.nbytes());
}

// ---- measurement ----------------------------------------------------------------------------------------------------

struct Bench {
  const Options& opt;
  shardkit::Communicator& comm;
  MPI_Comm raw;      // the baseline's communicator
  MPI_Comm control;  // barriers, timing and check reductions: neither measured communicator sees extra traffic
  MPI_Datatype type;
  MPI_Op op;
  int rank = 0;
  int size = 1;
};

struct Stats {
  double min_us = 0;
  double median_us = 0;
};

Stats stats(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  const double median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return {seconds.front() * 1e6, median * 1e6};
}

struct Row {
  Collective collective;
  Layout layout;
  Stats shardkit, mpi;
  std::int64_t wrong = -1;  // elements that differ, summed over ranks; -1 when not checked

  double algbw(const Stats& s) const { return static_cast<double>(layout.bytes) / (s.median_us * 1e-6) / 1e9; }
  double ratio_median() const { return shardkit.median_us / mpi.median_us; }
  double ratio_min() const { return shardkit.min_us / mpi.min_us; }
  double extra_us() const { return shardkit.median_us - mpi.median_us; }
};

// Per-call time of `iters` back-to-back calls after a barrier: the slowest rank's, as nccl-tests reports it.
template <typename Call>
double time_calls(const Bench& b, Call& call) {
  SHARDKIT_MPI_CHECK(MPI_Barrier(b.control));
  const double start = MPI_Wtime();
  for (int i = 0; i < b.opt.iters; ++i) call();
  const double per_call = (MPI_Wtime() - start) / b.opt.iters;
  double slowest = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&per_call, &slowest, 1, MPI_DOUBLE, MPI_MAX, b.control));
  return slowest;
}

// Runs both sides once on the same inputs and compares their outputs exactly; returns the number of elements that
// differ, summed over ranks. `reset` restores the inputs and fills the output with the sentinel.
template <typename Reset, typename ShardkitCall, typename MpiCall>
std::int64_t check(const Bench& b, Array& out, Reset& reset, ShardkitCall& shardkit_call, MpiCall& mpi_call) {
  reset();
  shardkit_call();
  const auto* bytes = static_cast<const unsigned char*>(out.data());
  const std::vector<unsigned char> got(bytes, bytes + out.nbytes());
  reset();
  mpi_call();
  std::int64_t wrong = 0;
  const std::size_t item = out.itemsize();
  for (std::int64_t i = 0; i < out.numel(); ++i)
    if (std::memcmp(got.data() + i * item, bytes + i * item, item) != 0) ++wrong;
  std::int64_t total = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, b.control));
  return total;
}

template <typename Reset, typename ShardkitCall, typename MpiCall>
Row measure(const Bench& b, Collective c, const Layout& l, Array& out, Reset reset, ShardkitCall shardkit_call,
            MpiCall mpi_call) {
  Row row{c, l, {}, {}, -1};
  if (b.opt.check) row.wrong = check(b, out, reset, shardkit_call, mpi_call);
  reset();
  for (int i = 0; i < b.opt.warmup; ++i) shardkit_call();
  for (int i = 0; i < b.opt.warmup; ++i) mpi_call();
  std::vector<double> shardkit_s, mpi_s;
  for (int r = 0; r < b.opt.repeats; ++r) {
    shardkit_s.push_back(time_calls(b, shardkit_call));
    mpi_s.push_back(time_calls(b, mpi_call));
  }
  row.shardkit = stats(std::move(shardkit_s));
  row.mpi = stats(std::move(mpi_s));
  return row;
}

Row run_size(const Bench& b, Collective c, const Layout& l) {
  const DType dt = b.opt.dtype;
  const ReduceOp redop = b.opt.redop;
  shardkit::Communicator& comm = b.comm;
  // Counts fit in an int: checked against the largest size in main().
  const int send_n = static_cast<int>(l.send_count), recv_n = static_cast<int>(l.recv_count);
  const int block = static_cast<int>(l.count);

  if (c == Collective::kBcast) {
    // In place, one buffer: the root's holds the input, the others' the sentinel until the broadcast lands.
    Array buf = Array::empty({l.send_count}, dt);
    auto reset = [&] {
      if (b.rank == kRoot)
        fill_inputs(buf, b.rank, redop);
      else
        fill_sentinel(buf);
    };
    return measure(
        b, c, l, buf, reset, [&] { comm.bcast_inplace(buf, kRoot).wait(); },
        [&] { SHARDKIT_MPI_CHECK(MPI_Bcast(buf.data(), send_n, b.type, kRoot, b.raw)); });
  }

  Array send = Array::empty({l.send_count}, dt);
  Array recv = Array::empty({l.recv_count}, dt);
  fill_inputs(send, b.rank, redop);
  auto reset = [&] { fill_sentinel(recv); };

  switch (c) {
    case Collective::kAllreduce:
      return measure(
          b, c, l, recv, reset, [&] { comm.allreduce(send, recv, redop).wait(); },
          [&] { SHARDKIT_MPI_CHECK(MPI_Allreduce(send.data(), recv.data(), send_n, b.type, b.op, b.raw)); });
    case Collective::kAllgather:
      return measure(
          b, c, l, recv, reset, [&] { comm.allgather(send, recv).wait(); },
          [&] { SHARDKIT_MPI_CHECK(MPI_Allgather(send.data(), send_n, b.type, recv.data(), send_n, b.type, b.raw)); });
    case Collective::kReduceScatter:
      return measure(
          b, c, l, recv, reset, [&] { comm.reduce_scatter(send, recv, redop).wait(); },
          [&] { SHARDKIT_MPI_CHECK(MPI_Reduce_scatter_block(send.data(), recv.data(), recv_n, b.type, b.op, b.raw)); });
    case Collective::kAlltoall:
      return measure(
          b, c, l, recv, reset, [&] { comm.alltoall(send, recv).wait(); },
          [&] { SHARDKIT_MPI_CHECK(MPI_Alltoall(send.data(), block, b.type, recv.data(), block, b.type, b.raw)); });
    case Collective::kBcast:  // measured above
    case Collective::kSendrecv:
      break;
  }
  // A ring: send to the right neighbour, receive from the left one (nccl-tests' sendrecv).
  const int right = (b.rank + 1) % b.size, left = (b.rank - 1 + b.size) % b.size;
  return measure(
      b, c, l, recv, reset, [&] { comm.sendrecv_into(send, right, recv, left, /*send_tag=*/0, /*recv_tag=*/0).wait(); },
      [&] {
        SHARDKIT_MPI_CHECK(MPI_Sendrecv(send.data(), send_n, b.type, right, 0, recv.data(), recv_n, b.type, left, 0,
                                        b.raw, MPI_STATUS_IGNORE));
      });
}

// ---- output ---------------------------------------------------------------------------------------------------------

std::string human_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return shardkit::detail::concat(bytes, " ", units[u]);
}

void print_table_header(std::FILE* f, Collective c, const Options& o, int n) {
  std::fprintf(f,
               "#\n# %s: dtype %s, redop %s, busbw factor %.3f\n"
               "#                                                 shardkit                           raw MPI"
               "                         shardkit / MPI\n"
               "#        size         count  redop  root      min   median   algbw   busbw      min   median   algbw"
               "   busbw    ratio   r(min)    extra  #wrong\n"
               "#         (B)    (elements)                  (us)     (us)  (GB/s)  (GB/s)     (us)     (us)  (GB/s)"
               "  (GB/s)    (med)    (min)     (us)\n",
               collective_name(c), std::string(shardkit::dtype_name(o.dtype)).c_str(),
               reduces(c) ? shardkit::reduce_op_name(o.redop) : "none", bus_factor(c, n));
}

void print_row(std::FILE* f, const Row& r, const Options& o, int n) {
  const double bf = bus_factor(r.collective, n);
  const double sk_bw = r.algbw(r.shardkit), mpi_bw = r.algbw(r.mpi);
  const std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
  std::fprintf(f, "%13lld %13lld %6s %5d %8.2f %8.2f %7.2f %7.2f %8.2f %8.2f %7.2f %7.2f %8.3f %8.3f %8.2f %7s\n",
               static_cast<long long>(r.layout.bytes), static_cast<long long>(r.layout.count),
               reduces(r.collective) ? shardkit::reduce_op_name(o.redop) : "none",
               r.collective == Collective::kBcast ? kRoot : -1, r.shardkit.min_us, r.shardkit.median_us, sk_bw,
               sk_bw * bf, r.mpi.min_us, r.mpi.median_us, mpi_bw, mpi_bw * bf, r.ratio_median(), r.ratio_min(),
               r.extra_us(), wrong.c_str());
  std::fflush(f);
}

// One line per operation: the worst ratio over bandwidth-bound sizes, and the fixed cost at the smallest size.
void print_summary(std::FILE* f, Collective c, const std::vector<Row>& rows) {
  const Row* worst_median = nullptr;
  const Row* worst_min = nullptr;
  const Row* smallest = nullptr;
  for (const Row& r : rows) {
    if (r.collective != c) continue;
    if (!smallest) smallest = &r;
    if (r.layout.bytes < kLargeBytes) continue;
    if (!worst_median || r.ratio_median() > worst_median->ratio_median()) worst_median = &r;
    if (!worst_min || r.ratio_min() > worst_min->ratio_min()) worst_min = &r;
  }
  if (!smallest) return;
  char large[160] = "no size >= 64 KiB";
  if (worst_median)
    std::snprintf(large, sizeof large, "sizes >= 64 KiB: max ratio %.3f (median, at %s), %.3f (min, at %s)",
                  worst_median->ratio_median(), human_bytes(worst_median->layout.bytes).c_str(), worst_min->ratio_min(),
                  human_bytes(worst_min->layout.bytes).c_str());
  std::fprintf(f, "# %-14s %s; smallest size %s: extra %+.2f us (median; min %+.2f us)\n", collective_name(c), large,
               human_bytes(smallest->layout.bytes).c_str(), smallest->extra_us(),
               smallest->shardkit.min_us - smallest->mpi.min_us);
}

void write_json(const Options& o, const shardkit::Runtime& rt, const shardkit::CommOptions& copts,
                const std::vector<Row>& rows) {
  std::string j = "{\"benchmark\":\"collectives\"";
  j += shardkit::detail::concat(
      ",\"ranks\":", rt.size(), ",\"dtype\":", json_string(shardkit::dtype_name(o.dtype)),
      ",\"host\":", json_string(rt.host()), ",\"redop\":", json_string(shardkit::reduce_op_name(o.redop)),
      ",\"iters\":", o.iters, ",\"warmup\":", o.warmup, ",\"repeats\":", o.repeats,
      ",\"mpi\":", json_string(shardkit::mpi_library_version()),
      ",\"shardkit_options\":{\"backend\":", json_string(shardkit::backend_name(copts.backend)),
      ",\"check\":", copts.check ? "true" : "false", ",\"timeout_ms\":", copts.timeout.count(),
      ",\"async\":", copts.async ? "true" : "false", "}");
  j += ",\"results\":[";
  const int n = rt.size();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double bf = bus_factor(r.collective, n);
    j += shardkit::detail::concat(
        i ? "," : "", "\n  {\"op\":", json_string(collective_name(r.collective)), ",\"bytes\":", r.layout.bytes,
        ",\"count\":", r.layout.count, ",\"shardkit_us_min\":", json_number(r.shardkit.min_us),
        ",\"shardkit_us_median\":", json_number(r.shardkit.median_us), ",\"mpi_us_min\":", json_number(r.mpi.min_us),
        ",\"mpi_us_median\":", json_number(r.mpi.median_us), ",\"algbw_gbs\":", json_number(r.algbw(r.shardkit)),
        ",\"busbw_gbs\":", json_number(r.algbw(r.shardkit) * bf), ",\"mpi_algbw_gbs\":", json_number(r.algbw(r.mpi)),
        ",\"mpi_busbw_gbs\":", json_number(r.algbw(r.mpi) * bf), ",\"ratio_median\":", json_number(r.ratio_median()),
        ",\"ratio_min\":", json_number(r.ratio_min()), ",\"extra_us\":", json_number(r.extra_us()),
        ",\"wrong\":", r.wrong < 0 ? std::string("null") : std::to_string(r.wrong), "}");
  }
  j += "\n]}\n";
  if (o.json == "-") {
    std::fputs(j.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  std::FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) throw std::runtime_error(shardkit::detail::concat("cannot write ", o.json, ": ", std::strerror(errno)));
  const bool ok = std::fputs(j.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(shardkit::detail::concat("cannot write ", o.json));
}

// ---- main -----------------------------------------------------------------------------------------------------------

int run(const shardkit::Runtime& rt, const Options& opt) {
  const bool root = rt.rank() == 0;
  // With the JSON on stdout, the table goes to stderr so that stdout stays parseable.
  std::FILE* table = opt.json == "-" ? stderr : stdout;

  // The fast path, set explicitly: SHARDKIT_CHECK / SHARDKIT_TIMEOUT_S in the environment (ctest sets both) would
  // otherwise add a signature exchange or nonblocking polling to every call and skew the comparison.
  shardkit::CommOptions copts;
  copts.backend = shardkit::BackendKind::kMpi;  // host buffers, measured against MPI
  copts.check = opt.checked;
  copts.timeout = std::chrono::milliseconds(0);
  copts.async = false;
  copts.name = "bench";
  std::shared_ptr<shardkit::Communicator> comm = shardkit::Communicator::world(rt, copts);
  const shardkit::MpiComm raw = shardkit::MpiComm::dup(rt.world());
  const shardkit::MpiComm control = shardkit::MpiComm::dup(rt.world());
  const Bench b{opt,
                *comm,
                shardkit::to_mpi<MPI_Comm>(raw.handle()),
                shardkit::to_mpi<MPI_Comm>(control.handle()),
                *raw_datatype(opt.dtype),
                raw_op(opt.redop),
                rt.rank(),
                rt.size()};

  const std::vector<std::int64_t> sizes = message_sizes(opt);
  if (root) {
    std::fprintf(table, "# bench_collectives: shardkit Communicator vs raw MPI on the same host buffers\n");
    std::fprintf(table, "# %d ranks, rank 0 on %s; %s\n", rt.size(), rt.host().c_str(),
                 shardkit::mpi_library_version().c_str());
    const shardkit::CommOptions& used = comm->options();
    std::string overridden;
    for (const char* name : {"SHARDKIT_BACKEND", "SHARDKIT_CHECK", "SHARDKIT_TIMEOUT_S"})
      if (const char* v = std::getenv(name)) overridden += shardkit::detail::concat(" ", name, "=", v);
    if (!overridden.empty()) overridden = " (overriding the environment's" + overridden + ")";
    std::fprintf(table, "# shardkit options: backend=%s check=%s timeout=%lld ms%s async=%s%s\n",
                 shardkit::backend_name(used.backend), used.check ? "on" : "off",
                 static_cast<long long>(used.timeout.count()), used.timeout.count() == 0 ? " (none)" : "",
                 used.async ? "on" : "off", overridden.c_str());
    std::fprintf(table,
                 "# sizes %s to %s, factor %lld; %d iters per measurement, %d warm-up, %d repeats alternating "
                 "shardkit / MPI; check %s\n",
                 human_bytes(opt.min_bytes).c_str(), human_bytes(opt.max_bytes).c_str(),
                 static_cast<long long>(opt.factor), opt.iters, opt.warmup, opt.repeats, opt.check ? "on" : "off");
    std::fprintf(table, "# times: per call, slowest rank; min and median over the repeats\n");
  }

  std::vector<Row> rows;
  for (Collective c : opt.collectives) {
    if (root) print_table_header(table, c, opt, rt.size());
    std::optional<Layout> last;
    for (std::int64_t bytes : sizes) {
      const Layout l = layout_for(c, bytes, shardkit::dtype_size(opt.dtype), rt.size());
      // Rounding to whole blocks can give the same buffers for neighbouring sizes: measure them once.
      if (last && last->send_count == l.send_count && last->recv_count == l.recv_count) continue;
      last = l;
      rows.push_back(run_size(b, c, l));
      if (root) print_row(table, rows.back(), opt, rt.size());
    }
  }

  std::int64_t wrong = 0;
  for (const Row& r : rows) wrong += std::max<std::int64_t>(r.wrong, 0);
  if (root) {
    std::fprintf(table, "#\n# Summary (ratio = shardkit / MPI time; extra = shardkit - MPI time)\n");
    for (Collective c : opt.collectives) print_summary(table, c, rows);
    if (opt.check)
      std::fprintf(table, "# Wrong results: %lld %s\n", static_cast<long long>(wrong), wrong ? "FAILED" : "OK");
    std::fflush(table);
    if (!opt.json.empty()) write_json(opt, rt, comm->options(), rows);
  }
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    shardkit::Runtime rt(&argc, &argv);
    const bool root = rt.rank() == 0;
    Options opt;
    try {
      opt = parse_args(argc, argv);
      if (!opt.help && !raw_datatype(opt.dtype))
        throw UsageError(shardkit::detail::concat("-d ", shardkit::dtype_name(opt.dtype),
                                                  ": MPI has no native datatype for it, so there is no raw baseline"));
      const std::int64_t largest = opt.max_bytes / static_cast<std::int64_t>(shardkit::dtype_size(opt.dtype));
      if (largest > INT_MAX) throw UsageError("-e: the raw MPI calls take int counts; the largest size is too big");
    } catch (const UsageError& e) {
      // Every rank parses the same arguments and stops here alike.
      if (root) std::fprintf(stderr, "bench_collectives: %s\n%s", e.what(), kUsage);
      return 2;
    }
    if (opt.help) {
      if (root) std::fputs(kUsage, stdout);
      return 0;
    }
    try {
      return run(rt, opt);
    } catch (const std::exception& e) {
      // The other ranks may be inside a collective: end the job rather than hang in MPI_Finalize.
      std::fprintf(stderr, "bench_collectives: rank %d: %s\n", rt.rank(), e.what());
      shardkit::request_abort_at_exit(e.what());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 1;
  }
}
