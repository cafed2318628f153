#pragma once

// bench_collectives' output: the nccl-tests-style table (both sides, then the ratio shardkit / MPI), the summary
// lines and the --json text.

#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::bench {

/// "8 B", "64 KiB": the largest binary unit that divides `bytes`.
std::string human_bytes(std::int64_t bytes);

/// The run's header lines: ranks, MPI, shardkit's options as used (and what of the environment they override).
void print_run_header(std::FILE* f, const Options& o, const Runtime& rt, const CommOptions& used);

/// The column heads of one operation's table.
void print_table_header(std::FILE* f, const CollectiveTest& c, const Options& o, int ranks);

/// One size's line.
void print_row(std::FILE* f, const Row& r, const Options& o, int ranks);

/// One line per operation: the worst ratio over bandwidth-bound sizes, and the fixed cost at the smallest size.
void print_summary(std::FILE* f, const CollectiveTest& c, const std::vector<Row>& rows);

/// The --json document.
std::string json_report(const Options& o, const Runtime& rt, const CommOptions& copts, const std::vector<Row>& rows);

}  // namespace shardkit::bench
