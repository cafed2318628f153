#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, AddressSanitizer and UndefinedBehaviorSanitizer in their own
# folder (build-fuzz/, or $SHARDKIT_FUZZ_BUILD_DIR) and runs each for a bounded time, starting from the committed seed
# corpus (tests/fuzz/corpus/<name>) plus what earlier runs in this folder found (build-fuzz/corpus/<name>), up to
# SHARDKIT_JOBS fuzzers side by side (each is one process).
#
#   scripts/fuzz.sh [seconds per fuzzer, default 60] [fuzzer names, default all: spec dlpack]
#
# Exits non-zero on any finding: a crash, a failed property check, a sanitizer report, a leak, a timeout or running
# out of memory. The offending input is kept in build-fuzz/artifacts/<name>/; replay it with
# `build-fuzz/tests/fuzz/<name>_fuzzer <file>`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

seconds="${1:-60}"
shift || true
fuzzers=("$@")
if [ ${#fuzzers[@]} -eq 0 ]; then fuzzers=(spec dlpack); fi

"$SHARDKIT_ROOT/scripts/setup.sh"
build_dir="${SHARDKIT_FUZZ_BUILD_DIR:-$SHARDKIT_ROOT/build-fuzz}"
# libFuzzer is clang's. The fuzzers call nothing that communicates, so no MPI job is started; CUDA is off as in
# `scripts/test.sh --sanitize`.
CC="${CC:-clang}" CXX="${CXX:-clang++}" \
  cmake -S "$SHARDKIT_ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDKIT_FUZZ=ON \
        -DSHARDKIT_CUDA=OFF -DSHARDKIT_NCCL=OFF -DSHARDKIT_PYTHON=OFF -DSHARDKIT_TESTS=OFF -DSHARDKIT_EXAMPLES=OFF
targets=()
for f in "${fuzzers[@]}"; do targets+=("${f}_fuzzer"); done
cmake --build "$build_dir" -j "$SHARDKIT_JOBS" --target "${targets[@]}"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

# The fuzzers run side by side, SHARDKIT_JOBS at a time (each is one process on one core): on CI's two cores both
# get their whole time in the time of one.
status=0
summary=()
log_of() { echo "$build_dir/${1}_fuzzer.log"; }
run_fuzzer() {
  local f="$1" exe="$build_dir/tests/fuzz/${1}_fuzzer" seeds="$SHARDKIT_ROOT/tests/fuzz/corpus/$1"
  local corpus="$build_dir/corpus/$1" artifacts="$build_dir/artifacts/$1" log
  log="$(log_of "$f")"
  mkdir -p "$corpus" "$artifacts"
  local dict=()
  if [ -f "$SHARDKIT_ROOT/tests/fuzz/$f.dict" ]; then dict=(-dict="$SHARDKIT_ROOT/tests/fuzz/$f.dict"); fi
  echo "fuzz.sh: running ${f}_fuzzer for ${seconds} s (log: $log)"
  # New inputs go to the first corpus folder (the build's), never into the committed seeds.
  "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
         -artifact_prefix="$artifacts/" "${dict[@]}" "$corpus" "$seeds" >"$log" 2>&1
}
# In batches of SHARDKIT_JOBS; each fuzzer's outcome is read once its batch has ended.
report() {
  local f="$1" rc="$2" log done_line runs speed
  log="$(log_of "$f")"
  done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)"
  runs="$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)"
  speed="$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}' || true)"
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz.sh: ${f}_fuzzer FOUND A PROBLEM (exit $rc); input saved under $build_dir/artifacts/$f/." \
         "Last lines of $log:"
    tail -n 60 "$log"
    summary+=("${f}_fuzzer: FINDING (exit $rc), see $log")
  else
    summary+=("${f}_fuzzer: ok, ${runs:-?} runs, ${speed:-?} exec/s; ${done_line:-}")
  fi
}
width=$(( SHARDKIT_JOBS > 0 ? SHARDKIT_JOBS : 1 ))
for (( at = 0; at < ${#fuzzers[@]}; at += width )); do
  batch=("${fuzzers[@]:at:width}")
  pids=()
  for f in "${batch[@]}"; do
    run_fuzzer "$f" &
    pids+=($!)
  done
  for i in "${!batch[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    report "${batch[$i]}" "$rc"
  done
done
printf 'fuzz.sh: %s\n' "${summary[@]}"
exit "$status"
