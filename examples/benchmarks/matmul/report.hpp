#pragma once

// bench_matmul's output: tables on rank 0 and the --json document.

#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"

namespace shardkit::bench {

/// The run's header lines: ranks, BLAS and its threads, meshes, p?gemm configurations, overlap default.
void print_run_header(std::FILE* f, const Bench& b, const std::string& blas_library);

/// Finds the best method of each kind in `r` (by median time).
void summarise(SizeResult& r);

/// One size's table and summary line.
void print_size(std::FILE* f, const SizeResult& r, int ranks);

/// Per algorithm (--profile): matmul as called, with overlap forced on and off, and its parts alone (medians).
void print_profile(std::FILE* f, const SizeResult& r, int ranks, bool overlap_default);

/// p?gemm's split (--profile): its time inside the local ?gemm_ calls and the rest.
void print_pgemm_split(std::FILE* f, const SizeResult& r, int ranks);

/// The --json document.
std::string json_report(const Bench& b, const std::vector<SizeResult>& results, const std::string& blas_library);

}  // namespace shardkit::bench
