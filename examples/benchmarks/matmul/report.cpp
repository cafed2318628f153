// bench_matmul's output: the run's header, one table per size (every method with GFLOP/s, parallel efficiency and
// the speed against the best p?gemm, then a summary line), the --profile tables and the --json document.

#include <functional>
#include <thread>

#include "bench_json.hpp"
#include "output.hpp"
#include "report.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;
using shardkit::examples::json_number;
using shardkit::examples::json_string;

namespace {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBaseline:
      return "baseline";
    case Kind::kShardkit:
      return "shardkit";
    case Kind::kScalapack:
      return "scalapack";
    case Kind::kProfile:
      break;
  }
  return "profile";
}

const Method* fastest(const std::vector<Method>& ms, const std::function<bool(const Method&)>& keep) {
  const Method* best = nullptr;
  for (const Method& m : ms)
    if (m.measured() && keep(m) && (!best || m.t_median() < best->t_median())) best = &m;
  return best;
}

// GFLOP/s at a time; efficiency = GFLOP/s / (ranks x one-rank GFLOP/s) = t1 / (ranks t).
double gflops(const Dims& d, double t) {
  return d.flops() / t / 1e9;
}

std::optional<double> efficiency(const SizeResult& r, const Method& m, bool use_min, int ranks) {
  if (!r.blas || m.kind == Kind::kBaseline) return std::nullopt;
  const double t1 = use_min ? r.blas->t_min() : r.blas->t_median();
  const double t = use_min ? m.t_min() : m.t_median();
  return t1 / (ranks * t);
}

// Speed relative to the best pdgemm (by medians): > 1 is faster.
std::optional<double> vs_pgemm(const SizeResult& r, const Method& m) {
  if (!r.best_pgemm || m.kind == Kind::kBaseline || m.kind == Kind::kProfile) return std::nullopt;
  return r.best_pgemm->t_median() / m.t_median();
}

const Method* find(const SizeResult& r, const std::string& name, const std::string& part) {
  for (const Method& m : r.methods)
    if (m.name == name && m.part == part && m.measured() && (m.kind == Kind::kShardkit) == part.empty()) return &m;
  return nullptr;
}

std::string json_method(const SizeResult& r, const Method& m, int ranks) {
  const Dims& d = r.dims;
  std::string j =
      concat("{\"m\":", d.m, ",\"n\":", d.n, ",\"k\":", d.k, ",\"kind\":", json_string(kind_name(m.kind)),
             ",\"method\":", json_string(m.name), ",\"part\":", json_string(m.part), ",\"mesh\":", json_string(m.mesh),
             ",\"nb\":", m.nb, ",\"kb\":", m.kb, ",\"kb_tuned\":", m.kb_tuned ? "true" : "false");
  if (!m.measured()) return j + concat(",\"skipped\":", json_string(m.skipped), "}");
  j += ",\"seconds\":[";
  for (std::size_t i = 0; i < m.seconds.size(); ++i) j += concat(i ? "," : "", json_number(m.seconds[i]));
  j += concat("],\"ms_min\":", json_number(1e3 * m.t_min()), ",\"ms_median\":", json_number(1e3 * m.t_median()));
  if (m.kind != Kind::kProfile || m.part == "no_overlap" || m.part == "overlap_on")
    j += concat(",\"gflops_min\":", json_number(gflops(d, m.t_min())),
                ",\"gflops_median\":", json_number(gflops(d, m.t_median())),
                ",\"efficiency_median\":", json_number(efficiency(r, m, false, ranks)),
                ",\"efficiency_min\":", json_number(efficiency(r, m, true, ranks)),
                ",\"vs_best_pgemm_median\":", json_number(vs_pgemm(r, m)));
  if (m.inner_gemm_s)
    j += concat(",\"gemm_ms_median\":", json_number(1e3 * *m.inner_gemm_s),
                ",\"gemm_calls\":", json_number(m.inner_calls));
  if (m.error)
    j += concat(",\"max_rel_error\":", json_number(m.error), ",\"ok\":", *m.error <= r.tolerance ? "true" : "false");
  return j + "}";
}

std::string json_best(const SizeResult& r, const Method* m, int ranks) {
  if (!m) return "null";
  return concat("{\"method\":", json_string(m->name), ",\"mesh\":", json_string(m->mesh), ",\"nb\":", m->nb,
                ",\"kb\":", m->kb, ",\"gflops_median\":", json_number(gflops(r.dims, m->t_median())),
                ",\"efficiency_median\":", json_number(efficiency(r, *m, false, ranks)),
                ",\"vs_best_pgemm_median\":", json_number(vs_pgemm(r, *m)), "}");
}

}  // namespace

void print_run_header(std::FILE* f, const Bench& b, const std::string& blas_library) {
  const Options& opt = b.opt;
  const Runtime& rt = b.rt;
  const int p = b.size;
  std::fprintf(f, "# bench_matmul: shardkit matmul vs one-rank BLAS and ScaLAPACK p?gemm, %s\n",
               std::string(dtype_name(opt.dtype)).c_str());
  std::fprintf(f, "# %d ranks, rank 0 on %s, device %s; %s\n", p, rt.host().c_str(), rt.device().to_string().c_str(),
               mpi_library_version().c_str());
  std::fprintf(f, "# BLAS threads per rank: %d (shardkit reports %d", opt.threads, blas_num_threads());
#if SHARDKIT_HAVE_SCALAPACK
  std::fprintf(f, ", OpenBLAS %d); ScaLAPACK's dgemm_ from %s\n", Scalapack::blas_threads(), blas_library.c_str());
#else
  (void)blas_library;
  std::fprintf(f, "); ScaLAPACK not found at build time: no pdgemm (apt install libscalapack-openmpi-dev)\n");
#endif
  std::string grids;
  for (const Grid& g : b.grids) grids += concat(grids.empty() ? "" : ",", g.label());
  std::string nbs, kbs;
  for (int nb : opt.nbs) nbs += concat(nbs.empty() ? "" : ",", nb);
  for (int kb : opt.kbs) kbs += concat(kbs.empty() ? "" : ",", kb ? std::to_string(kb) : "library's");
  const std::string pgemm =
      SHARDKIT_HAVE_SCALAPACK && opt.pdgemm
          ? concat("pdgemm grids ", grids, ", nb ", nbs, ", PBLAS panel width kb ", kbs, " ('*': tuned)")
          : std::string("no pdgemm");
  std::fprintf(f, "# meshes: %s for local/allgather/reduce_scatter, %s for summa; %s\n",
               shape_label(b.line_mesh.shape()).c_str(), shape_label(b.summa_mesh.shape()).c_str(), pgemm.c_str());
  std::fprintf(f,
               "# %d warm-up and %d timed runs per method, alternating; time = slowest rank after a barrier; "
               "eff = GFLOP/s / (%d x one-rank GFLOP/s); x best pdgemm = its median time / this one%s\n",
               opt.warmup, opt.repeats, p, opt.check ? "; results checked" : "");
  std::fprintf(f,
               "# matmul overlaps transfers with GEMMs by default here: %s (%d cores on this host, %d ranks on "
               "this host, %d BLAS threads each)\n",
               matmul_overlap_default(rt.device()) ? "yes" : "no",
               static_cast<int>(std::thread::hardware_concurrency()), rt.local_size(), blas_num_threads());
  std::fflush(f);
}

void summarise(SizeResult& r) {
  r.blas = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kBaseline; });
  r.best_shardkit = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kShardkit; });
  r.best_collective =
      fastest(r.methods, [](const Method& m) { return m.kind == Kind::kShardkit && m.name != "local"; });
  r.best_pgemm = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kScalapack; });
  r.best_pgemm_stock = fastest(r.methods, [](const Method& m) { return m.kind == Kind::kScalapack && !m.kb_tuned; });
}

void print_size(std::FILE* f, const SizeResult& r, int ranks) {
  const Dims& d = r.dims;
  std::fprintf(f, "#\n# C(%lld x %lld) = A(%lld x %lld) @ B(%lld x %lld): %.3g GFLOP; load average %.2f -> %.2f\n",
               static_cast<long long>(d.m), static_cast<long long>(d.n), static_cast<long long>(d.m),
               static_cast<long long>(d.k), static_cast<long long>(d.k), static_cast<long long>(d.n), d.flops() / 1e9,
               r.load_before, r.load_after);
  std::fprintf(f,
               "# %-10s %-15s %-5s %4s %4s %10s %10s %9s %9s %7s %7s %8s %10s\n"
               "# %-10s %-15s %-5s %4s %4s %10s %10s %9s %9s %7s %7s %8s %10s\n",
               "size", "method", "mesh", "nb", "kb", "min", "median", "GFLOP/s", "GFLOP/s", "eff", "eff", "x best",
               "max rel", "", "", "", "", "", "(ms)", "(ms)", "(min)", "(median)", "(med)", "(min)", "pdgemm", "error");
  for (const Method& m : r.methods) {
    if (m.kind == Kind::kProfile) continue;
    if (!m.measured()) {
      std::fprintf(f, "  %-10s %-15s %-5s %4s %4s skipped: %s\n", d.label().c_str(), m.label().c_str(), m.mesh.c_str(),
                   m.nb ? std::to_string(m.nb).c_str() : "-", "-", m.skipped.c_str());
      continue;
    }
    std::string err = "-";
    if (m.error) err = fmt(m.error, "%.2e") + (*m.error <= r.tolerance ? "" : " BAD");
    // A tuned panel width is marked with '*'.
    const std::string kb = m.kb ? std::to_string(m.kb) + (m.kb_tuned ? "*" : "") : "-";
    std::fprintf(f, "  %-10s %-15s %-5s %4s %4s %10.2f %10.2f %9.2f %9.2f %7s %7s %8s %10s\n", d.label().c_str(),
                 m.label().c_str(), m.mesh.c_str(), m.nb ? std::to_string(m.nb).c_str() : "-", kb.c_str(),
                 1e3 * m.t_min(), 1e3 * m.t_median(), gflops(d, m.t_min()), gflops(d, m.t_median()),
                 fmt(efficiency(r, m, false, ranks)).c_str(), fmt(efficiency(r, m, true, ranks)).c_str(),
                 fmt(vs_pgemm(r, m)).c_str(), err.c_str());
  }
  // Summary line: the goal's two ratios.
  std::string s = concat("# ", d.label(), ":");
  if (r.blas) s += concat(" one-rank BLAS ", fmt(gflops(d, r.blas->t_median()), "%.2f"), " GFLOP/s;");
  if (r.best_shardkit) {
    s += concat(" best shardkit ", r.best_shardkit->name, " ", fmt(gflops(d, r.best_shardkit->t_median()), "%.2f"),
                " GFLOP/s");
    if (auto e = efficiency(r, *r.best_shardkit, false, ranks)) s += concat(", efficiency ", fmt(e));
    if (auto v = vs_pgemm(r, *r.best_shardkit)) s += concat(", ", fmt(v), "x pdgemm");
    s += ";";
  }
  if (r.best_collective && r.best_collective != r.best_shardkit) {
    s += concat(" best communicating ", r.best_collective->name, " ",
                fmt(gflops(d, r.best_collective->t_median()), "%.2f"), " GFLOP/s");
    if (auto e = efficiency(r, *r.best_collective, false, ranks)) s += concat(", efficiency ", fmt(e));
    if (auto v = vs_pgemm(r, *r.best_collective)) s += concat(", ", fmt(v), "x pdgemm");
    s += ";";
  }
  auto pgemm = [&](const char* what, const Method& m) {
    s += concat(" ", what, " ", m.name, " grid ", m.mesh, " nb ", m.nb, " kb ", m.kb, " ",
                fmt(gflops(d, m.t_median()), "%.2f"), " GFLOP/s");
    if (auto e = efficiency(r, m, false, ranks)) s += concat(", efficiency ", fmt(e));
  };
  if (r.best_pgemm) pgemm("best", *r.best_pgemm);
  if (r.best_pgemm_stock && r.best_pgemm_stock != r.best_pgemm) {
    s += ";";
    pgemm("best with the library's panel width:", *r.best_pgemm_stock);
    if (r.best_shardkit)
      s += concat(" (best shardkit ", fmt(r.best_pgemm_stock->t_median() / r.best_shardkit->t_median()), "x that)");
  }
  std::fprintf(f, "%s (medians)\n", s.c_str());
}

// Per algorithm: matmul as called (overlap by default), with overlap forced on and off, and the parts alone (medians).
void print_profile(std::FILE* f, const SizeResult& r, int ranks, bool overlap_default) {
  const Dims& d = r.dims;
  bool header = false;
  for (MatmulAlgorithm alg : kAllAlgorithms) {
    const std::string name = matmul_algorithm_name(alg);
    const Method* as_called = find(r, name, "");
    const Method* gemm = find(r, name, "gemm");
    if (!as_called || !gemm) continue;
    if (!header) {
      std::fprintf(f,
                   "# profile %s (medians, ms): default = matmul as called (overlap %s by default here); overlap / "
                   "no-overlap = forced on / off (off: each transfer completed before its GEMM); gemm/comm/elementwise "
                   "= those steps alone (warm buffers); fresh = allocating and first touching the call's own buffers "
                   "(page faults); rest = no-overlap (local: default) - parts; hidden = (no-overlap - overlap) / comm "
                   "(negative: overlap costs); gemm eff = one-rank time / (ranks x gemm)\n",
                   d.label().c_str(), overlap_default ? "on" : "off");
      std::fprintf(f, "# %-10s %-15s %9s %9s %11s %9s %9s %12s %9s %9s %8s %9s\n", "size", "algorithm", "default",
                   "overlap", "no-overlap", "gemm", "comm", "elementwise", "fresh", "rest", "hidden", "gemm eff");
      header = true;
    }
    const Method* on = find(r, name, "overlap_on");
    const Method* off = find(r, name, "no_overlap");
    const Method* comm = find(r, name, "comm");
    const Method* elem = find(r, name, "adds");
    if (!elem) elem = find(r, name, "copies");
    const Method* fresh = find(r, name, "fresh");
    auto ms = [](const Method* m) -> std::optional<double> {
      return m ? std::optional<double>(1e3 * m->t_median()) : std::nullopt;
    };
    std::optional<double> rest, hidden, geff;
    double parts = gemm->t_median();
    for (const Method* x : {comm, elem, fresh})
      if (x) parts += x->t_median();
    rest = 1e3 * ((off ? off : as_called)->t_median() - parts);
    if (on && off && comm && comm->t_median() > 0) hidden = (off->t_median() - on->t_median()) / comm->t_median();
    if (r.blas) geff = r.blas->t_median() / (ranks * gemm->t_median());
    std::fprintf(f, "  %-10s %-15s %9s %9s %11s %9s %9s %12s %9s %9s %8s %9s\n", d.label().c_str(), name.c_str(),
                 fmt(ms(as_called), "%.2f").c_str(), fmt(ms(on), "%.2f").c_str(), fmt(ms(off), "%.2f").c_str(),
                 fmt(ms(gemm), "%.2f").c_str(), fmt(ms(comm), "%.2f").c_str(), fmt(ms(elem), "%.2f").c_str(),
                 fmt(ms(fresh), "%.2f").c_str(), fmt(rest, "%.2f").c_str(), fmt(hidden, "%.2f").c_str(),
                 fmt(geff).c_str());
  }
}

// p?gemm's split: its time inside the local ?gemm_ calls (slowest rank) and the rest (broadcasts, waiting for the
// other ranks, packing). Local GFLOP/s = this rank's share of the flops / its time in ?gemm_.
void print_pgemm_split(std::FILE* f, const SizeResult& r, int ranks) {
  bool header = false;
  for (const Method& m : r.methods) {
    if (m.kind != Kind::kScalapack || !m.measured() || !m.inner_gemm_s) continue;
    if (!header) {
      std::fprintf(f,
                   "# %s split %s (medians, ms): in ?gemm_ = ScaLAPACK's local GEMM calls (slowest rank); rest = "
                   "total - that (communication, waiting, packing)\n",
                   m.name.c_str(), r.dims.label().c_str());
      std::fprintf(f, "# %-10s %-15s %-5s %4s %4s %9s %9s %9s %8s %14s\n", "size", "method", "grid", "nb", "kb",
                   "total", "in gemm", "rest", "calls", "local GFLOP/s");
      header = true;
    }
    const double total = m.t_median(), in_gemm = *m.inner_gemm_s;
    std::fprintf(f, "  %-10s %-15s %-5s %4d %4d %9.2f %9.2f %9.2f %8.0f %14.2f\n", r.dims.label().c_str(),
                 m.name.c_str(), m.mesh.c_str(), m.nb, m.kb, 1e3 * total, 1e3 * in_gemm, 1e3 * (total - in_gemm),
                 *m.inner_calls, r.dims.flops() / ranks / in_gemm / 1e9);
  }
}

std::string json_report(const Bench& b, const std::vector<SizeResult>& results, const std::string& blas_library) {
  const Options& o = b.opt;
  std::string grids, nbs, kbs;
  for (const Grid& g : b.grids) grids += concat(grids.empty() ? "" : ",", json_string(g.label()));
  for (int nb : o.nbs) nbs += concat(nbs.empty() ? "" : ",", nb);
  for (int kb : o.kbs) kbs += concat(kbs.empty() ? "" : ",", kb);
  std::string j = concat(
      "{\"benchmark\":\"matmul\",\"ranks\":", b.size, ",\"dtype\":", json_string(dtype_name(o.dtype)),
      ",\"host\":", json_string(b.rt.host()), ",\"mpi\":", json_string(mpi_library_version()),
      ",\"threads\":", o.threads, ",\"repeats\":", o.repeats, ",\"warmup\":", o.warmup,
      ",\"scalapack\":", SHARDKIT_HAVE_SCALAPACK ? "true" : "false", ",\"blas_library\":", json_string(blas_library),
      ",\"line_mesh\":", json_string(shape_label(b.line_mesh.shape())),
      ",\"summa_mesh\":", json_string(shape_label(b.summa_mesh.shape())), ",\"grids\":[", grids, "],\"nb\":[", nbs,
      "],\"pblas_kb\":[", kbs, "],\"check\":", o.check ? "true" : "false",
      ",\"profile\":", o.profile ? "true" : "false",
      ",\"overlap_default\":", matmul_overlap_default(b.rt.device()) ? "true" : "false");
  j += ",\"summary\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const SizeResult& r = results[i];
    j += concat(i ? "," : "", "\n  {\"m\":", r.dims.m, ",\"n\":", r.dims.n, ",\"k\":", r.dims.k,
                ",\"load_before\":", json_number(r.load_before), ",\"load_after\":", json_number(r.load_after),
                ",\"blas_gflops_median\":",
                json_number(r.blas ? std::optional(gflops(r.dims, r.blas->t_median())) : std::nullopt),
                ",\"best_shardkit\":", json_best(r, r.best_shardkit, b.size),
                ",\"best_communicating\":", json_best(r, r.best_collective, b.size),
                ",\"best_pgemm\":", json_best(r, r.best_pgemm, b.size),
                ",\"best_pgemm_stock_kb\":", json_best(r, r.best_pgemm_stock, b.size), "}");
  }
  j += "\n],\"results\":[";
  bool first = true;
  for (const SizeResult& r : results)
    for (const Method& m : r.methods) {
      j += concat(first ? "" : ",", "\n  ", json_method(r, m, b.size));
      first = false;
    }
  j += "\n]}\n";
  return j;
}

}  // namespace shardkit::bench
