#pragma once

// Output shared by the benchmarks: where the table goes, the --json file, the communicator options every benchmark
// measures shardkit with, and main()'s handling of usage errors and failures.

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "args.hpp"
#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::bench {

/// The table's stream: stderr when the JSON goes to stdout (`json` is "-"), so that stdout stays parseable.
std::FILE* table_stream(const std::string& json);

/// Writes `text` to `path` ("-": stdout). @throws std::runtime_error when the file cannot be written.
void write_json(const std::string& path, const std::string& text);

/// `v` formatted with `format`, or "-" for none.
std::string fmt(std::optional<double> v, const char* format = "%.3f");

/// shardkit's fast path on host buffers (the default route, or the backend SHARDKIT_BACKEND forces), set explicitly:
/// SHARDKIT_CHECK / SHARDKIT_TIMEOUT_S in the environment (ctest sets both) would otherwise add a signature exchange
/// or polling to every call and skew the comparison. `check` turns checked mode on, to show its cost.
CommOptions fast_comm_options(bool check);

/// main() of a benchmark: starts the runtime, parses the arguments on every rank (a UsageError prints `usage` on
/// rank 0 and exits 2 everywhere alike; `help` prints it and exits 0), then runs. A failure while running ends the
/// whole job, since the other ranks may be inside a collective.
/// @param parse  `Options(int argc, char** argv)`, throwing UsageError.
/// @param run    `int(const Runtime&, const Options&)`: the exit code.
template <typename Parse, typename Run>
int bench_main(int argc, char** argv, const char* name, const char* usage, Parse parse, Run run) {
  try {
    Runtime rt(&argc, &argv);
    const bool root = rt.rank() == 0;
    try {
      const auto opt = parse(argc, argv);
      if (opt.help) {
        if (root) std::fputs(usage, stdout);
        return 0;
      }
      return run(rt, opt);
    } catch (const UsageError& e) {
      // Every rank parses the same arguments and stops here alike.
      if (root) std::fprintf(stderr, "%s: %s\n%s", name, e.what(), usage);
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: rank %d: %s\n", name, rt.rank(), e.what());
      request_abort_at_exit(e.what());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace shardkit::bench
