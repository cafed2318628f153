#!/usr/bin/env bash
# The test command: installs what is missing, configures (CUDA compiled wherever nvcc is), builds, and runs ctest: every
# test but the `large` and `multihost` ones (`scripts/test.sh -L 'large|multihost'`). Extra arguments go to ctest
# instead, e.g. `scripts/test.sh -L mpi` or `scripts/test.sh -R dlpack`.
#
# `scripts/test.sh --sanitize [ctest arguments]` instead builds the core, launch, collectives and sharding tests with
# AddressSanitizer and UndefinedBehaviorSanitizer in their own folder (build-sanitize/, or
# $SHARDKIT_SANITIZE_BUILD_DIR) and runs them; any sanitizer report fails the run. A -R of yours replaces the
# selection below (ctest keeps the last -R).
#
# `scripts/test.sh --sim-gpu [ctest arguments]` builds on the simulated GPU (SHARDKIT_SIM_GPU=ON, build-sim/ or
# $SHARDKIT_SIM_BUILD_DIR) and runs the `gpu`-labelled tests at 1-4 ranks under several delay seeds
# (SHARDKIT_SIM_SEEDS, default "1 2"), once more with every rank of the node on one GPU (SHARDKIT_SIM_GPUS=1: NCCL
# must be refused and MPI used), with SHARDKIT_REQUIRE_GPU=1 so that a skipped GPU test fails. With --sanitize as well,
# the same under AddressSanitizer and UndefinedBehaviorSanitizer (build-sim-sanitize/; a longer build; one seed by
# default, and not the one-GPU pass), and first (without ctest arguments) the host suites of --sanitize in that same
# build: CI's one sanitized build.
#
# `scripts/test.sh --tsan [ctest arguments]` builds the collectives tests with ThreadSanitizer (build-tsan/, or
# $SHARDKIT_TSAN_BUILD_DIR; CUDA off) and runs the suites where threads of ours meet the caller's: the shm
# point-to-point suites with the poster thread (shm_poster.cpp), the flight recorder and trace writer with the watchdog
# thread (watchdog.cpp, in every rank), the interrupt tests (signals) and the timeouts (the watchdog's hang warning and
# the dumps it writes for other ranks), at 2-4 ranks, after a canary race that must be reported. Any report fails the
# run; Open MPI's own are suppressed (tests/sanitizers/tsan_mpi.supp). About 2.5 minutes on 2 cores; the whole
# collectives suite passes too, but takes 8 minutes at 2 and 3 ranks.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

sanitize=0
sim_gpu=0
tsan=0
ctest_args=()
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    --sim-gpu) sim_gpu=1 ;;
    --tsan) tsan=1 ;;
    *) ctest_args+=("$arg") ;;
  esac
done

"$SHARDKIT_ROOT/scripts/setup.sh"

# 1 when the ctest arguments select tests themselves (-R, -L, ...), else 0.
selects_tests() {
  local arg
  for arg in "$@"; do
    case "$arg" in
      -R|-E|-L|-LE|-I|-U|--tests-regex|--exclude-regex|--label-regex|--label-exclude|--tests-information|--union|\
      -R?*|-E?*|-L?*|-I?*|--tests-regex=*|--exclude-regex=*|--label-regex=*|--label-exclude=*) echo 1; return ;;
    esac
  done
  echo 0
}

# The sanitized builds' optimisation: -O1 with line tables only (-g1: every report still names file and line). Against
# RelWithDebInfo's -O2 -g this compiles in less than half the time (operations_test.cpp under ASan and UBSan: 14 s
# against 30 s on an idle machine here; the --sanitize build 4.6 min against ~8), which was most of each sanitized
# step's time on a fresh clone; the suites ran as fast (ctest 264 s against 236-286 s).
SANITIZE_BUILD=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")

# The sanitizers' environment for both sanitized runs (extra ASan options in $1).
# Every report is fatal (halt_on_error; UBSan is also compiled with -fno-sanitize-recover). Leak detection stays on
# for our own code; Open MPI's finalize-time leaks (by design) are suppressed by library in lsan_mpi.supp. Those
# rules need the allocating frame named: Open MPI allocates from plugins that it unloads at MPI_Finalize, so the test
# executables of a sanitized build keep them loaded (tests/sanitizers/keep_loaded.cpp), and the fast unwinder's first
# frame names them. (Unwinding every allocation's whole stack instead, fast_unwind_on_malloc=0, made these runs 15x
# slower on the allocation-heavy suites: 97 s against 6 s for the sharding suite at 4 ranks.)
# mpirun starts the ranks with its own environment, so these reach every rank.
# intercept_tls_get_addr=0: GCC 12's ASan guesses the extent of each dynamic-TLS block that __tls_get_addr hands out,
# and where a block happens to start 16 bytes past a page it reads a "glibc 2.19" header that today's glibc does not
# write; LeakSanitizer's exit-time tracer then scans a made-up range and dies ("Tracer caught signal 11", "DTLS 9 at
# 0x4476-0x400005578" with LSAN_OPTIONS=verbosity=1:log_threads=1) after every test passed. It hit the 3-rank runs
# here, by memory layout. Without the interceptor LeakSanitizer still scans every thread's static TLS and the heap.
sanitizer_env() {
  local supp="$SHARDKIT_ROOT/tests/sanitizers/lsan_mpi.supp"
  local asan="halt_on_error=1:detect_leaks=1:intercept_tls_get_addr=0${1:-}"
  export ASAN_OPTIONS="$asan${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
}

# The host suites under the sanitizers (--sanitize, and --sim-gpu --sanitize before the GPU suites): the leak check's
# own canary (a leak of ours must be reported, MPI's kept allocations not), the core and launch unit tests, the
# Runtime at 1-4 ranks (and with GPUs hidden), the sharding layer (meshes, specs, shard_map, matmul) at 1-4 ranks, and
# the collectives on host buffers at 1 and 2 ranks. Under the sanitizers the collectives take about 50 s at 1 rank and
# 100 s at 2 on a 2-core machine, and more at 3 and 4; those (odd sizes, more peers) pass clean too and are left to an
# explicit `scripts/test.sh --sanitize -R 'collectives\.np[34]'` (but for the shm suites, below). The host suites expect
# a machine without a GPU: in the simulated-GPU build they run with none simulated (SHARDKIT_SIM_GPUS=0), as a CUDA
# build on a CPU-only node.
SANITIZED_HOST_TARGETS=(core_tests launch_unit_tests runtime_tests collectives_tests collectives_timeout sharding_tests
                        checkpoint_tests sanitizer_leak_canary)
sanitized_host_suites() {
  local build_dir="$1"
  local tests='^(sanitizer_leak_canary|core_tests|launch_unit_tests|runtime\.np[1-4]|runtime_hidden_gpus\.np[12]|'
  tests+='collectives\.np[12]|sharding\.np[1-4]|checkpoint\.np[1-4]|collectives_timeout_watchdog_late\.np2)$'
  SHARDKIT_SIM_GPUS=0 ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure -R "$tests" \
    "${ctest_args[@]}"
  # The shm backend's own tests at 3 and 4 ranks as well (odd rank counts; more ranks than cores: the crowded wait),
  # and its segment path (single-copy reads off) at 2: the collectives binary with gtest's filter in the environment
  # (not when a selection of yours was given).
  if [ ${#ctest_args[@]} -eq 0 ]; then
    SHARDKIT_SIM_GPUS=0 GTEST_FILTER='*Shm*' \
      ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure \
      -R '^(collectives\.np[34]|collectives_shm_segment_only\.np2)$'
  fi
}
# The extra ASan checks of both sanitized runs (stack use after return, initialisation order), the simulated GPU's
# suites included.
SANITIZED_HOST_ASAN=":detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"

# ---- --sim-gpu ----------------------------------------------------------------------------------------------------
if [ "$sim_gpu" = 1 ]; then
  build_dir="${SHARDKIT_SIM_BUILD_DIR:-$SHARDKIT_ROOT/build-sim}"
  build_settings=(-DCMAKE_BUILD_TYPE=Release)
  if [ "$sanitize" = 1 ]; then
    build_dir="${SHARDKIT_SIM_BUILD_DIR:-$SHARDKIT_ROOT/build-sim-sanitize}"
    build_settings=("${SANITIZE_BUILD[@]}")
    sanitizer_env "$SANITIZED_HOST_ASAN"
  fi
  cmake -S "$SHARDKIT_ROOT" -B "$build_dir" "${build_settings[@]}" -DSHARDKIT_SIM_GPU=ON -DSHARDKIT_SANITIZE=$sanitize \
        -DSHARDKIT_PYTHON=OFF -DSHARDKIT_TESTS=ON -DSHARDKIT_EXAMPLES=OFF
  targets=(sim_tests nccl_order_main core_gpu_tests collectives_tests sharding_gpu_tests checkpoint_gpu_tests
           collectives_timeout collectives_timeout_sweep)
  # The XLA:GPU handler's test exists where jaxlib's FFI headers were found (setup.sh installs jax).
  # (The list is read whole first: `| grep -q` would close the pipe early, and pipefail would then say "absent".)
  build_targets=$(cmake --build "$build_dir" --target help)
  if [[ "$build_targets" == *jax_cuda_handler_tests* ]]; then
    targets+=(jax_cuda_handler_tests)
  fi
  if [ "$sanitize" = 1 ]; then
    targets+=("${SANITIZED_HOST_TARGETS[@]}")
  fi
  cmake --build "$build_dir" -j "$SHARDKIT_JOBS" --target "${targets[@]}"
  shardkit_mpirun_setup
  start=$(date +%s)
  if [ "$(selects_tests "${ctest_args[@]}")" = 1 ]; then
    # A selection of yours (e.g. `scripts/test.sh --sim-gpu -L multihost`, a step of CI): those tests alone, once, in
    # this build, with no GPU required (the multihost cases run host suites in a build where every rank has a GPU).
    ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure "${ctest_args[@]}"
    echo "test.sh --sim-gpu: ctest passed in $(( $(date +%s) - start )) s"
    exit 0
  fi
  if [ "$sanitize" = 1 ] && [ ${#ctest_args[@]} -eq 0 ]; then
    echo "test.sh --sim-gpu --sanitize: the host suites"
    sanitized_host_suites "$build_dir"
  fi
  export SHARDKIT_REQUIRE_GPU=1
  ctest --test-dir "$build_dir" --output-on-failure -L sim "${ctest_args[@]}"
  # Two delay seeds find the missing waits; under the sanitizers (which look for memory errors, not orderings) one.
  default_seeds="1 2"
  [ "$sanitize" = 1 ] && default_seeds="1"
  for seed in ${SHARDKIT_SIM_SEEDS:-$default_seeds}; do
    echo "test.sh --sim-gpu: seed $seed"
    SHARDKIT_SIM_SEED=$seed ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure -L gpu \
      "${ctest_args[@]}"
  done
  # Every rank on one GPU (NCCL refused, MPI staged): a routing check, so not again under the sanitizers (2 minutes).
  if [ "$sanitize" = 0 ]; then
    echo "test.sh --sim-gpu: one GPU shared by every rank"
    SHARDKIT_SIM_GPUS=1 ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure -L gpu -LE fault \
      -R 'np[24]' "${ctest_args[@]}"
  fi
  echo "test.sh --sim-gpu: ctest passed in $(( $(date +%s) - start )) s"
  exit 0
fi

# ---- --tsan -------------------------------------------------------------------------------------------------------
# -O1 as the other sanitized builds (SANITIZE_BUILD). halt_on_error: the first report fails the rank, so the test.
if [ "$tsan" = 1 ]; then
  build_dir="${SHARDKIT_TSAN_BUILD_DIR:-$SHARDKIT_ROOT/build-tsan}"
  cmake -S "$SHARDKIT_ROOT" -B "$build_dir" "${SANITIZE_BUILD[@]}" -DSHARDKIT_TSAN=ON -DSHARDKIT_CUDA=OFF \
        -DSHARDKIT_NCCL=OFF -DSHARDKIT_PYTHON=OFF -DSHARDKIT_TESTS=ON -DSHARDKIT_EXAMPLES=OFF
  cmake --build "$build_dir" -j "$SHARDKIT_JOBS" --target collectives_tests collectives_timeout sanitizer_race_canary \
        checkpoint_tests
  shardkit_mpirun_setup
  tsan_supp="$SHARDKIT_ROOT/tests/sanitizers/tsan_mpi.supp"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$tsan_supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
  start=$(date +%s)
  if [ ${#ctest_args[@]} -eq 0 ]; then
    ctest --test-dir "$build_dir" --output-on-failure -R '^sanitizer_race_canary$'
    GTEST_FILTER='ShmP2pTest.*:ShmPointToPoint*:ShmSendrecv*:FlightRecorder*:TraceWriter*:Interrupt*' \
      ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure -R '^collectives\.np[234]$'
    ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure \
      -R '^collectives_timeout_(checked|unchecked|shm.*)\.np[24]$'
    # Checkpoints' background writer and remover threads against the callers'.
    GTEST_FILTER='Checkpoint.OnlyCommitted*:Checkpoint.TheBackgroundWriter*:Checkpoint.ABackgroundSave*' \
      ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure -R '^checkpoint\.np[24]$'
  else
    ctest --test-dir "$build_dir" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure "${ctest_args[@]}"
  fi
  echo "test.sh --tsan: ctest passed in $(( $(date +%s) - start )) s"
  exit 0
fi

if [ "$sanitize" = 0 ]; then
  shardkit_build -DSHARDKIT_TESTS=ON -DSHARDKIT_EXAMPLES=ON
  shardkit_mpirun_setup
  # Every test but the `large` ones (more than 2^31 elements per call, 16 GiB) and the `multihost` ones (simulated
  # hosts: root and network namespaces; they run alone, one after another), unless the arguments select tests
  # themselves. CI runs those two labels in a step of its own: `scripts/test.sh -L 'large|multihost'`.
  if [ "$(selects_tests "${ctest_args[@]}")" = 0 ]; then
    ctest_args+=(-LE 'large|multihost')
  fi
  start=$(date +%s)
  ctest --test-dir "$SHARDKIT_BUILD_DIR" -j "$SHARDKIT_CTEST_JOBS" --output-on-failure "${ctest_args[@]}"
  echo "test.sh: ctest passed in $(( $(date +%s) - start )) s"
  exit 0
fi

# ---- --sanitize ---------------------------------------------------------------------------------------------------
# CUDA is off: nvcc compiles host code with its own host-compiler pass, and ASan-instrumented host code that calls into
# the (uninstrumented) CUDA runtime and driver mostly reports the driver's own allocations and mappings; what we want
# checked here is shardkit's host logic, which is the same code with or without CUDA. GPU paths are checked by
# scripts/gpu_check.sh. SANITIZE_BUILD (above): optimised enough for the MPI suites to run in minutes, with line
# numbers in the reports. (CI runs these host suites in its --sim-gpu --sanitize build instead: there the layer below
# CUDA is the simulator, our own instrumented code, so the CUDA-compiled host code is checked too, in one build.)
build_dir="${SHARDKIT_SANITIZE_BUILD_DIR:-$SHARDKIT_ROOT/build-sanitize}"
cmake -S "$SHARDKIT_ROOT" -B "$build_dir" "${SANITIZE_BUILD[@]}" -DSHARDKIT_SANITIZE=ON \
      -DSHARDKIT_CUDA=OFF -DSHARDKIT_NCCL=OFF -DSHARDKIT_PYTHON=OFF -DSHARDKIT_TESTS=ON -DSHARDKIT_EXAMPLES=OFF
# Only the executables of the suites run below (the MPI test main comes with them).
cmake --build "$build_dir" -j "$SHARDKIT_JOBS" --target "${SANITIZED_HOST_TARGETS[@]}"
shardkit_mpirun_setup

sanitizer_env "$SANITIZED_HOST_ASAN"
start=$(date +%s)
sanitized_host_suites "$build_dir"
echo "test.sh --sanitize: ctest passed in $(( $(date +%s) - start )) s"
