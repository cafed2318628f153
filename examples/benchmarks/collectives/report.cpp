#include "report.hpp"

#include <cstdlib>

#include "bench_json.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;
using shardkit::examples::json_number;
using shardkit::examples::json_string;

namespace {

// Sizes from which the overhead ratio is summarised (bandwidth-bound messages).
constexpr std::int64_t kLargeBytes = std::int64_t{64} << 10;

const char* redop_label(const CollectiveTest& c, const Options& o) {
  return c.reduces ? reduce_op_name(o.redop) : "none";
}

}  // namespace

std::string human_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return concat(bytes, " ", units[u]);
}

void print_run_header(std::FILE* f, const Options& o, const Runtime& rt, const CommOptions& used) {
  std::fprintf(f, "# bench_collectives: shardkit Communicator vs raw MPI on the same host buffers\n");
  std::fprintf(f, "# %d ranks, rank 0 on %s; %s\n", rt.size(), rt.host().c_str(), mpi_library_version().c_str());
  std::string overridden;
  for (const char* name : {"SHARDKIT_BACKEND", "SHARDKIT_CHECK", "SHARDKIT_TIMEOUT_S"})
    if (const char* v = std::getenv(name)) overridden += concat(" ", name, "=", v);
  if (!overridden.empty()) overridden = " (overriding the environment's" + overridden + ")";
  std::fprintf(f, "# shardkit options: backend=%s check=%s timeout=%lld ms%s async=%s%s\n", backend_name(used.backend),
               used.check ? "on" : "off", static_cast<long long>(used.timeout.count()),
               used.timeout.count() == 0 ? " (none)" : "", used.async ? "on" : "off", overridden.c_str());
  std::fprintf(f,
               "# sizes %s to %s, factor %lld; %d iters per measurement, %d warm-up, %d repeats alternating "
               "shardkit / MPI; check %s\n",
               human_bytes(o.min_bytes).c_str(), human_bytes(o.max_bytes).c_str(), static_cast<long long>(o.factor),
               o.iters, o.warmup, o.repeats, o.check ? "on" : "off");
  std::fprintf(f, "# times: per call, slowest rank; min and median over the repeats\n");
  if (o.aa) std::fprintf(f, "# A/A (--aa): the shardkit column runs the raw MPI call too; its ratio is the noise\n");
}

void print_table_header(std::FILE* f, const CollectiveTest& c, const Options& o, int ranks) {
  std::fprintf(f,
               "#\n# %s: dtype %s, redop %s, busbw factor %.3f\n"
               "#                                                 shardkit                           raw MPI"
               "                         shardkit / MPI                    limit: memcpy\n"
               "#        size         count  redop  root      min   median   algbw   busbw      min   median   algbw"
               "   busbw    ratio   r(min)    extra  #wrong      min   median\n"
               "#         (B)    (elements)                  (us)     (us)  (GB/s)  (GB/s)     (us)     (us)  (GB/s)"
               "  (GB/s)    (med)    (min)     (us)             (us)     (us)\n",
               c.name, std::string(dtype_name(o.dtype)).c_str(), redop_label(c, o), c.bus_factor(ranks));
}

void print_row(std::FILE* f, const Row& r, const Options& o, int ranks) {
  const double bf = r.test->bus_factor(ranks);
  const double sk_bw = r.algbw(r.shardkit), mpi_bw = r.algbw(r.mpi);
  const std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
  std::fprintf(f,
               "%13lld %13lld %6s %5d %8.2f %8.2f %7.2f %7.2f %8.2f %8.2f %7.2f %7.2f %8.3f %8.3f %8.2f %7s %8.2f %8.2f\n",
               static_cast<long long>(r.layout.bytes), static_cast<long long>(r.layout.count), redop_label(*r.test, o),
               r.test->root, r.shardkit.min, r.shardkit.median, sk_bw, sk_bw * bf, r.mpi.min, r.mpi.median, mpi_bw,
               mpi_bw * bf, r.ratio_median(), r.ratio_min(), r.extra_us(), wrong.c_str(), r.limit.min, r.limit.median);
  std::fflush(f);
}

void print_summary(std::FILE* f, const CollectiveTest& c, const std::vector<Row>& rows) {
  const Row* worst_median = nullptr;
  const Row* worst_min = nullptr;
  const Row* smallest = nullptr;
  for (const Row& r : rows) {
    if (r.test != &c) continue;
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
  std::fprintf(f, "# %-14s %s; smallest size %s: extra %+.2f us (median; min %+.2f us)\n", c.name, large,
               human_bytes(smallest->layout.bytes).c_str(), smallest->extra_us(),
               smallest->shardkit.min - smallest->mpi.min);
}

std::string json_report(const Options& o, const Runtime& rt, const CommOptions& copts, const std::vector<Row>& rows) {
  std::string j = "{\"benchmark\":\"collectives\"";
  j += concat(",\"ranks\":", rt.size(), ",\"dtype\":", json_string(dtype_name(o.dtype)),
              ",\"host\":", json_string(rt.host()), ",\"redop\":", json_string(reduce_op_name(o.redop)),
              ",\"iters\":", o.iters, ",\"warmup\":", o.warmup, ",\"repeats\":", o.repeats, ",\"aa\":", o.aa ? "true" : "false",
              ",\"mpi\":", json_string(mpi_library_version()),
              ",\"shardkit_options\":{\"backend\":", json_string(backend_name(copts.backend)),
              ",\"check\":", copts.check ? "true" : "false", ",\"timeout_ms\":", copts.timeout.count(),
              ",\"async\":", copts.async ? "true" : "false", "}");
  j += ",\"results\":[";
  const int n = rt.size();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double bf = r.test->bus_factor(n);
    j += concat(
        i ? "," : "", "\n  {\"op\":", json_string(r.test->name), ",\"bytes\":", r.layout.bytes,
        ",\"count\":", r.layout.count, ",\"shardkit_us_min\":", json_number(r.shardkit.min),
        ",\"shardkit_us_median\":", json_number(r.shardkit.median), ",\"mpi_us_min\":", json_number(r.mpi.min),
        ",\"mpi_us_median\":", json_number(r.mpi.median), ",\"algbw_gbs\":", json_number(r.algbw(r.shardkit)),
        ",\"busbw_gbs\":", json_number(r.algbw(r.shardkit) * bf), ",\"mpi_algbw_gbs\":", json_number(r.algbw(r.mpi)),
        ",\"mpi_busbw_gbs\":", json_number(r.algbw(r.mpi) * bf), ",\"ratio_median\":", json_number(r.ratio_median()),
        ",\"ratio_min\":", json_number(r.ratio_min()), ",\"extra_us\":", json_number(r.extra_us()),
        ",\"memcpy_us_min\":", json_number(r.limit.min), ",\"memcpy_us_median\":", json_number(r.limit.median),
        ",\"wrong\":", r.wrong < 0 ? std::string("null") : std::to_string(r.wrong), "}");
  }
  j += "\n]}\n";
  return j;
}

}  // namespace shardkit::bench
