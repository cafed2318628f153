// bench_matmul's command line, and the meshes and p?gemm grids it names.

#include <algorithm>
#include <climits>
#include <cmath>
#include <string_view>

#include "args.hpp"
#include "bench.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;

const char* const kUsage =
    "usage: bench_matmul [options]\n"
    "  --sizes LIST     square sizes n (A, B and C are n x n), comma-separated (default 1024,2048,4096)\n"
    "  --m M --n N --k K  one non-square case, (M x K) @ (K x N); all three needed (added to --sizes if given)\n"
    "  --dtype T        float64 (default; ScaLAPACK pdgemm) or float32 (psgemm)\n"
    "  --algos LIST     all (default), or some of local, allgather, reduce_scatter, summa\n"
    "  --mesh SPEC      mesh of every shardkit algorithm, e.g. 2, 2x1, x=2,y=1 (default: all ranks on a line for\n"
    "                   the 1-d algorithms, the squarest 2-d mesh (rows >= columns) for summa)\n"
    "  --grid LIST      pdgemm process grids, e.g. 2x1,1x2, or all (every factorisation of the rank count);\n"
    "                   default: summa's mesh. Ranks are placed row-major, as on shardkit's mesh\n"
    "  --nb LIST        pdgemm block sizes (default 64); the best one is the baseline of the ratios\n"
    "  --pblas-kb LIST  PBLAS's panel width (what its PILAENV returns: the K step of p?gemm's local GEMMs, 32 in\n"
    "                   reference ScaLAPACK, whatever --nb is); 0 (default) keeps the library's own. Each value is\n"
    "                   a pdgemm configuration of its own, to tune pdgemm as its installer could\n"
    "  --repeat N       timed runs per method, alternating the methods (default 3): min and median reported\n"
    "  --warmup W       untimed runs per method first (default 1)\n"
    "  --threads T      BLAS threads per rank, the same for every method (default 1)\n"
    "  --no-baseline    skip the one-rank BLAS run (no efficiency then)\n"
    "  --no-pdgemm      skip ScaLAPACK\n"
    "  --check          compare every result with the one-rank product (max |C - R| / max |R|); exit 1 above the\n"
    "                   tolerance (64 eps sqrt(K))\n"
    "  --profile        also time the collective algorithms with overlap forced on and off, and their local GEMMs,\n"
    "                   transfers and adds/copies alone\n"
    "  --json PATH      also write the results as JSON to PATH ('-': stdout; the table then goes to stderr)\n"
    "  -h, --help       this text\n";

namespace {

// An integer flag value in [min, INT_MAX].
std::int64_t parse_bounded(std::string_view text, std::string_view flag, std::int64_t min) {
  const std::int64_t v = parse_int(text, flag);
  if (v < min || v > INT_MAX) throw UsageError(concat(flag, ": ", v, " out of range (at least ", min, ")"));
  return v;
}

std::vector<MatmulAlgorithm> parse_algorithms(std::string_view list) {
  std::vector<MatmulAlgorithm> out;
  for (std::string_view a : split_list(list)) {
    if (a == "all") {
      out.assign(std::begin(kAllAlgorithms), std::end(kAllAlgorithms));
      continue;
    }
    MatmulAlgorithm alg{};
    try {
      alg = parse_matmul_algorithm(a);
    } catch (const InvalidArgument& e) {
      throw UsageError(concat("--algos: ", e.what()));
    }
    if (alg == MatmulAlgorithm::kAuto) throw UsageError("--algos: name the algorithms (auto is not one)");
    if (std::find(out.begin(), out.end(), alg) == out.end()) out.push_back(alg);
  }
  return out;
}

// The flags that take no value, and what each sets.
struct Switch {
  std::string_view name;
  bool Options::*field;
  bool value;
};
constexpr Switch kSwitches[] = {{"--no-baseline", &Options::baseline, false},
                                {"--no-pdgemm", &Options::pdgemm, false},
                                {"--check", &Options::check, true},
                                {"--profile", &Options::profile, true}};

const Switch* find_switch(std::string_view name) {
  for (const Switch& s : kSwitches)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace

Options parse_args(int argc, char** argv) {
  Options o;
  std::vector<Dims> squares;
  bool sizes_given = false;
  std::int64_t m = 0, n = 0, k = 0;
  ArgReader args(argc, argv, /*short_values=*/false);
  while (args.next()) {
    const std::string_view arg = args.name();
    auto list = [&](std::int64_t min) {
      std::vector<int> out;
      for (std::string_view s : split_list(args.value())) out.push_back(static_cast<int>(parse_bounded(s, arg, min)));
      return out;
    };
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "--sizes") {
      sizes_given = true;
      for (int v : list(1)) squares.push_back({v, v, v});
    } else if (arg == "--m") {
      m = parse_bounded(args.value(), arg, 1);
    } else if (arg == "--n") {
      n = parse_bounded(args.value(), arg, 1);
    } else if (arg == "--k") {
      k = parse_bounded(args.value(), arg, 1);
    } else if (arg == "--dtype") {
      const std::string_view d = args.value();
      if (d == "float64" || d == "double")
        o.dtype = DType::kFloat64;
      else if (d == "float32" || d == "float")
        o.dtype = DType::kFloat32;
      else
        throw UsageError(concat("--dtype: '", d, "' (float64 or float32)"));
    } else if (arg == "--algos" || arg == "--algo") {
      o.algorithms = parse_algorithms(args.value());
    } else if (arg == "--mesh") {
      o.mesh = args.value();
    } else if (arg == "--grid") {
      o.grids.clear();
      for (std::string_view g : split_list(args.value())) o.grids.emplace_back(g);
    } else if (arg == "--nb") {
      o.nbs = list(1);
    } else if (arg == "--pblas-kb") {
      o.kbs = list(0);
    } else if (arg == "--repeat" || arg == "--repeats") {
      o.repeats = static_cast<int>(parse_bounded(args.value(), arg, 1));
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(parse_bounded(args.value(), arg, 0));
    } else if (arg == "--threads") {
      o.threads = static_cast<int>(parse_bounded(args.value(), arg, 1));
    } else if (arg == "--json") {
      o.json = args.value();
      if (o.json.empty()) throw UsageError("--json needs a path ('-' for stdout)");
    } else if (const Switch* sw = find_switch(arg)) {
      args.no_value();
      o.*(sw->field) = sw->value;
    } else {
      throw UsageError(concat("unknown argument '", args.text(), "'"));
    }
  }
  if (o.help) return o;
  const bool mnk = m || n || k;
  if (mnk && !(m && n && k)) throw UsageError("--m, --n and --k go together: give all three");
  if (!sizes_given && !mnk) squares = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}};
  o.sizes = squares;
  if (mnk) o.sizes.push_back({m, n, k});
  if (o.sizes.empty()) throw UsageError("no size to run");
  if (o.algorithms.empty()) throw UsageError("--algos: no algorithm given");
  if (o.nbs.empty()) throw UsageError("--nb: no block size given");
  if (o.kbs.empty()) throw UsageError("--pblas-kb: no value given");
  return o;
}

std::pair<std::int64_t, std::int64_t> squarest(std::int64_t p) {
  std::int64_t c = static_cast<std::int64_t>(std::sqrt(static_cast<double>(p)));
  while (c > 1 && p % c) --c;
  return {p / std::max<std::int64_t>(c, 1), std::max<std::int64_t>(c, 1)};
}

std::string shape_label(const std::vector<std::int64_t>& shape) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) s += concat(i ? "x" : "", shape[i]);
  return s;
}

std::vector<Grid> parse_grids(const std::vector<std::string>& texts, int p, const Mesh& summa_mesh) {
  std::vector<Grid> out;
  auto add = [&](Grid g) {
    if (std::none_of(out.begin(), out.end(), [&](const Grid& h) { return h.rows == g.rows && h.cols == g.cols; }))
      out.push_back(g);
  };
  if (texts.empty()) {
    if (summa_mesh.ndim() == 2) {
      add({static_cast<int>(summa_mesh.shape()[0]), static_cast<int>(summa_mesh.shape()[1])});
    } else {
      const auto [r, c] = squarest(p);
      add({static_cast<int>(r), static_cast<int>(c)});
    }
    return out;
  }
  for (const std::string& t : texts) {
    if (t == "all") {
      for (int r = 1; r <= p; ++r)
        if (p % r == 0) add({r, p / r});
      continue;
    }
    MeshShape s;
    try {
      s = parse_mesh_shape(t);
    } catch (const InvalidArgument& e) {
      throw UsageError(concat("--grid: ", e.what()));
    }
    if (s.shape.size() != 2 || s.shape[0] * s.shape[1] != p)
      throw UsageError(concat("--grid ", t, ": a 2-d grid of ", p, " ranks is needed (e.g. ", p, "x1)"));
    add({static_cast<int>(s.shape[0]), static_cast<int>(s.shape[1])});
  }
  return out;
}

}  // namespace shardkit::bench
