#!/usr/bin/env bash
# Checks shardkit on a machine with a GPU, and prints a summary table:
#   1. builds with CUDA and NCCL (build-gpu/, for this GPU's architecture) and the Python package;
#   2. runs the `gpu` tests (CUDA arrays, kernels, cuBLAS, the collectives suite on GPU buffers over NCCL, sharded
#      arrays on the GPU) at one rank, and at 2 and 4 ranks on the one GPU where the NCCL in use allows several
#      ranks per GPU (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1);
#   3. exchanges GPU arrays with CuPy, JAX and PyTorch through DLPack (scripts/gpu_dlpack_check.py);
#   4. runs shardkit inside jax.jit on JAX's GPU backend (scripts/gpu_jax_check.py: the CUDA FFI handlers);
#   5. measures GEMM through shardkit against cuBLAS alone (bench_gemm);
#   6. runs the collectives suite on GPU buffers in checked mode over NCCL at one rank;
#   7. runs the Python suite under the machine's own Python, NumPy and JAX, at one rank and at two sharing a GPU;
#   8. runs the collectives suite on GPU buffers at 2 and 4 ranks: over NCCL where it allows that many ranks, else
#      with ranks sharing a GPU, which NCCL refuses, so MPI carries the GPU buffers through pinned staging.
# SHARDKIT_GPU_BUDGET_S=<s> keeps the whole check within that time (steps that would not fit are reported skipped);
# SHARDKIT_GPU_SKIP="gemm nccl" leaves steps out (tests dlpack jax gemm nccl python python2 staging);
# SHARDKIT_GPU_LOG_DIR=<dir> gets the logs (one .tgz) and the summary after every step.
#
# Without network access, bring the packages along in a bundle folder (made on a connected machine by
# scripts/gpu_bundle.sh) and point SHARDKIT_BUNDLE at it: Debian packages in $SHARDKIT_BUNDLE/debs are unpacked
# (dpkg -x, no root needed) and Python wheels in $SHARDKIT_BUNDLE/wheels installed with pip --no-index.
#   SHARDKIT_BUNDLE=.bundle scripts/gpu_check.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SHARDKIT_GPU_BUILD_DIR:-$ROOT/build-gpu}"
BUNDLE="${SHARDKIT_BUNDLE:-}"
PYTHON="${PYTHON:-python3}"
JOBS="${SHARDKIT_JOBS:-$(nproc)}"
LOG_DIR="${SHARDKIT_GPU_LOG_DIR:-}"
declare -a SUMMARY=()
status=0
# Each line is printed as it is known, too: a check cut short by its caller's time limit still shows what ran.
note() {
  SUMMARY+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")")
  echo "gpu_check: ${SUMMARY[-1]}"
  [ "$2" = FAIL ] && status=1
  save_logs
  return 0
}
# With SHARDKIT_GPU_LOG_DIR, the logs so far are packed there after each step (one file: a lent machine's caller
# may take back only a few), and the summary written beside them.
save_logs() {
  [ -n "$LOG_DIR" ] || return 0
  mkdir -p "$LOG_DIR"
  tar czf "$LOG_DIR/gpu_check_logs.tgz" "$BUILD".*.log "$BUILD".*.json 2>/dev/null
  printf '%s\n' "${SUMMARY[@]}" >"$LOG_DIR/gpu_check_summary.txt"
}
# With SHARDKIT_GPU_BUDGET_S, the whole check keeps within that many seconds (a lent machine's time is short): each
# step after the build gets the time left, less a margin, and is reported skipped when too little is left.
T0=$(date +%s)
BUDGET="${SHARDKIT_GPU_BUDGET_S:-0}"
# SHARDKIT_GPU_SKIP="gemm nccl ..." leaves those steps out (names: tests dlpack jax gemm nccl python python2 staging).
SKIP=" ${SHARDKIT_GPU_SKIP:-} "
# step_time <the step's own limit in s> [step name]: prints the limit to use, or nothing when the budget is spent
# or the step is skipped.
step_time() {
  [ -n "${2:-}" ] && [[ "$SKIP" == *" $2 "* ]] && return 0
  [ "$BUDGET" -gt 0 ] || { echo "$1"; return; }
  local left=$(( BUDGET - ($(date +%s) - T0) - 10 ))
  [ "$left" -ge 20 ] || return 0
  echo $(( left < $1 ? left : $1 ))
}
# skipped <label>: the summary line of a step that step_time gave no time.
skipped() { note "$1" skipped "out of time (SHARDKIT_GPU_BUDGET_S=$BUDGET) or SHARDKIT_GPU_SKIP"; }
# copy_keeping <from> <to>: copies a tree without replacing any file already there.
copy_keeping() { cp -a --update=none "$1/." "$2" 2>/dev/null || cp -an "$1/." "$2"; }

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU here (nvidia-smi finds none). Run it on a machine with one; CPU checks: scripts/test.sh"
  exit 2
fi
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
NGPUS=$(nvidia-smi -L | grep -c "^GPU")
echo "gpu_check: $NGPUS GPU(s): $GPU_NAME"

# ---- offline bundle: Open MPI and friends from .deb files, Python wheels -------------------------------------------
# Whether dpkg has this package installed, under its name or the one Ubuntu 24.04's 64-bit time_t transition gave it
# (Debian's libopenmpi3 is Ubuntu's libopenmpi3t64).
machine_has() {
  local name
  for name in "$1" "${1}t64"; do
    dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "ok installed" && return 0
  done
  return 1
}
if [ -n "$BUNDLE" ]; then
  BUNDLE="$(cd "$BUNDLE" && pwd)"
  if ls "$BUNDLE"/debs/*.deb >/dev/null 2>&1; then
    # As root (a throwaway GPU machine), install into / as dpkg would: the packages the machine has stay as they are,
    # and no file of it is replaced. Else (or with SHARDKIT_BUNDLE_PREFIX=<dir>) unpack under a prefix and point the
    # tools at it (Open MPI relocated through OPAL_PREFIX: only for a machine with no MPI of its own).
    if [ "$(id -u)" = 0 ] && [ "${SHARDKIT_BUNDLE_PREFIX:-/}" = / ]; then
      prefix=""
    else
      prefix="${SHARDKIT_BUNDLE_PREFIX:-$BUNDLE/root}"
    fi
    stage="$BUNDLE/stage"
    mkdir -p "$stage"
    for deb in "$BUNDLE"/debs/*.deb; do
      # Installing into /: a package the machine already has (its own Open MPI, say) stays as it is.
      if [ -z "$prefix" ] && machine_has "$(dpkg-deb -f "$deb" Package)"; then
        echo "gpu_check: $(basename "$deb"): the machine has this package, kept"
        continue
      fi
      dpkg -x "$deb" "$stage"
    done
    mkdir -p "${prefix:-/}"
    # Older packages ship /lib, /bin or /sbin files; on a merged-/usr system those folders are links into /usr, and
    # cp cannot put a folder over a link: their files go under /usr.
    for top in lib bin sbin; do
      if [ -d "$stage/$top" ] && [ -L "${prefix:-}/$top" ]; then
        mkdir -p "${prefix:-}/usr/$top"
        copy_keeping "$stage/$top" "${prefix:-}/usr/$top"
        rm -rf "${stage:?}/$top"
      fi
    done
    copy_keeping "$stage" "${prefix:-/}"
    # The names update-alternatives makes on a real install (mpirun, mpicc, libblas.so.3, cblas.h, ...).
    if [ -f "$BUNDLE/links.txt" ]; then
      while read -r link target; do
        [ -e "$prefix$link" ] || [ -L "$prefix$link" ] || { mkdir -p "$(dirname "$prefix$link")"; ln -s "$prefix$target" "$prefix$link"; }
      done <"$BUNDLE/links.txt"
    fi
    if [ -z "$prefix" ]; then
      ldconfig
      # The bundle's launcher and compiler wrappers ahead of any other MPI the machine has.
      mkdir -p "$BUNDLE/bin"
      for tool in mpirun mpiexec mpicc mpicxx mpic++; do ln -sfn "$(readlink -f "/usr/bin/$tool.openmpi")" "$BUNDLE/bin/$tool"; done
      export PATH="$BUNDLE/bin:$PATH"
      echo "gpu_check: installed $(ls "$BUNDLE"/debs/*.deb | wc -l) Debian packages into / (existing files kept)"
    else
      arch_lib="$prefix/usr/lib/$(uname -m)-linux-gnu"
      export PATH="$prefix/usr/bin:$PATH"
      export LD_LIBRARY_PATH="$arch_lib:$arch_lib/openmpi/lib:$arch_lib/openblas-pthread:${LD_LIBRARY_PATH:-}"
      export OPAL_PREFIX="$prefix/usr"   # Open MPI relocated: it finds its components and help files here
      export PMIX_INSTALL_PREFIX="$arch_lib/pmix2"
      export CMAKE_PREFIX_PATH="$prefix/usr:${CMAKE_PREFIX_PATH:-}"
      export C_INCLUDE_PATH="$prefix/usr/include:$prefix/usr/include/$(uname -m)-linux-gnu:${C_INCLUDE_PATH:-}"
      export CPLUS_INCLUDE_PATH="$prefix/usr/include:$prefix/usr/include/$(uname -m)-linux-gnu:${CPLUS_INCLUDE_PATH:-}"
      echo "gpu_check: unpacked $(ls "$BUNDLE"/debs/*.deb | wc -l) Debian packages into $prefix"
    fi
  fi
  if ls "$BUNDLE"/wheels/*.whl >/dev/null 2>&1; then
    # Only what this Python lacks: a GPU image's own mpi4py, nanobind or pytest stay in charge.
    wheels=()
    for whl in "$BUNDLE"/wheels/*.whl; do
      name=$(basename "$whl" | cut -d- -f1)
      "$PYTHON" -m pip show -q "$name" >/dev/null 2>&1 || wheels+=("$whl")
    done
    if [ "${#wheels[@]}" -gt 0 ]; then
      "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$BUNDLE/site" "${wheels[@]}"
      export PYTHONPATH="$BUNDLE/site:${PYTHONPATH:-}"
    fi
    echo "gpu_check: installed ${#wheels[@]} of $(ls "$BUNDLE"/wheels/*.whl | wc -l) wheels into $BUNDLE/site"
  fi
else
  "$ROOT/scripts/setup.sh" || { echo "gpu_check: setup failed (offline? see SHARDKIT_BUNDLE)"; exit 1; }
fi
command -v mpirun >/dev/null || { echo "gpu_check: no mpirun (install Open MPI, or bring it in SHARDKIT_BUNDLE)"; exit 1; }
MPIRUN=(mpirun --oversubscribe --bind-to none)
# A GPU test that skips here (no device found, no NCCL communicator) is a failure, not a pass.
export SHARDKIT_REQUIRE_GPU=1
# Every dtype at every rank count in the C++ suites (CI sweeps six at 3 and 4 ranks): a real GPU is rare here.
export SHARDKIT_TEST_WIDE_SWEEP=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# ---- 1. build ----------------------------------------------------------------------------------------------------------
start=$(date +%s)
configure() {
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_CUDA=ON -DSHARDKIT_NCCL=ON \
    -DSHARDKIT_TESTS=ON -DSHARDKIT_EXAMPLES=ON -DCMAKE_CUDA_ARCHITECTURES=native \
    -DPython_EXECUTABLE="$(command -v "$PYTHON")" "$@" >>"$BUILD.configure.log" 2>&1
}
: >"$BUILD.configure.log"
# Without Python's headers the C++ checks still run: the build goes on without the Python package (reported FAIL).
if ! configure -DSHARDKIT_PYTHON=ON; then
  note "Python package" FAIL "configure failed with SHARDKIT_PYTHON=ON (see $BUILD.configure.log); C++ only"
  rm -f "$BUILD/CMakeCache.txt"
  configure -DSHARDKIT_PYTHON=OFF
fi
build_time=$(step_time 1200)
if grep -q "Build files have been written" "$BUILD.configure.log" \
   && timeout "${build_time:-1}" cmake --build "$BUILD" -j "$JOBS" >"$BUILD.build.log" 2>&1; then
  note "build (CUDA + NCCL + Python)" ok "$(( $(date +%s) - start )) s, $(grep -o 'NCCL=[01]' "$BUILD.configure.log" | head -1)"
else
  note "build (CUDA + NCCL + Python)" FAIL "see $BUILD.configure.log / $BUILD.build.log"
  tail -30 "$BUILD.build.log" 2>/dev/null || tail -30 "$BUILD.configure.log"
  if ! grep -q "Build files have been written" "$BUILD.configure.log"; then
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
  fi
  # What did build is still worth checking: build the rest past the failure (Makefiles: -k) and go on.
  build_time=$(step_time 600)
  timeout "${build_time:-1}" cmake --build "$BUILD" -j "$JOBS" -- -k >>"$BUILD.build.log" 2>&1
fi
export PYTHONPATH="$BUILD/python:${PYTHONPATH:-}"
NCCL_VERSION=$(sed -n 's/#define SHARDKIT_NCCL_VERSION_STRING "\(.*\)"/\1/p' "$BUILD/generated/shardkit/config.hpp")

# ---- 2. gpu tests --------------------------------------------------------------------------------------------------------
multi_rank=0
if [ -n "$NCCL_VERSION" ] && [ "$(printf '%s\n' "2.30.0" "$NCCL_VERSION" | sort -V | head -1)" = "2.30.0" ]; then
  multi_rank=1
  export NCCL_MULTI_RANK_GPU_ENABLE=1
fi
# The most ranks the GPU tests may use: one per GPU, or four on one GPU where NCCL allows several per GPU.
max_np=$(( NGPUS < 4 ? NGPUS : 4 )); [ "$multi_rank" = 1 ] && max_np=4
case "$max_np" in 1) exclude='np[234]$' ;; 2) exclude='np[34]$' ;; 3) exclude='np4$' ;; *) exclude='^$' ;; esac
# Several tests at once, on half the cores (ctest slots count half cores, cmake/ShardkitTesting.cmake): they share the
# GPU, as ranks of one job do.
if t=$(step_time 300 tests) && [ -n "$t" ]; then
  if timeout "$t" ctest --test-dir "$BUILD" -L gpu -E "$exclude" -j "$(( JOBS > 1 ? JOBS : 2 ))" --timeout 120 \
       --output-on-failure >"$BUILD.gpu-tests.log" 2>&1; then
    note "gpu tests (ctest -L gpu)" ok "$(grep -o '[0-9]*% tests passed.*' "$BUILD.gpu-tests.log" | tail -1)"
  else
    note "gpu tests (ctest -L gpu)" FAIL "$(grep -o '[0-9]*% tests passed.*' "$BUILD.gpu-tests.log" | tail -1); log: $BUILD.gpu-tests.log"
  fi
else
  skipped "gpu tests (ctest -L gpu)"
fi

# A check script under mpirun at one rank that prints one line per check, "<step> <check> ok|FAIL|skipped <detail>":
# py_check <step> <its own limit in s> <script> <label of its checks> <label of the whole>.
py_check() {
  local step=$1 limit=$2 script=$3 label=$4 whole=$5 t rc
  if ! t=$(step_time "$limit" "$step") || [ -z "$t" ]; then
    skipped "$whole"
    return
  fi
  timeout "$t" "${MPIRUN[@]}" -np 1 "$PYTHON" "$ROOT/scripts/$script" >"$BUILD.$step.log" 2>&1
  rc=$?
  while read -r _ check result detail; do note "$label$check" "$result" "$detail"; done < <(grep "^$step " "$BUILD.$step.log")
  # A check that dies after printing some of its lines is a failure too, whatever those lines said.
  [ "$rc" = 0 ] || note "$whole" FAIL "exit $rc; log: $BUILD.$step.log"
}

# ---- 3. DLPack with CuPy, JAX, PyTorch on the GPU ------------------------------------------------------------------------
py_check dlpack 180 gpu_dlpack_check.py "DLPack " "DLPack exchange"

# ---- 4. shardkit inside jax.jit on JAX's GPU backend (XLA's CUDA FFI handlers) ---------------------------------------
py_check jax 240 gpu_jax_check.py "JAX on GPU: " "JAX on GPU"

# ---- 5. GEMM through shardkit vs cuBLAS ----------------------------------------------------------------------------------
if t=$(step_time 150 gemm) && [ -n "$t" ]; then
  if timeout "$t" "$BUILD/examples/benchmarks/gemm/bench_gemm" --json "$BUILD.gemm.json" >"$BUILD.gemm.log" 2>&1; then
    cat "$BUILD.gemm.log"
    worst=$(awk '$1 ~ /^[0-9]+$/ {print $5}' "$BUILD.gemm.log" | sort -g | head -1)
    best=$(awk '$1 ~ /^[0-9]+$/ && $2 == "bfloat16" {print $3}' "$BUILD.gemm.log" | sort -g | tail -1)
    host=$(sed -n "s/^# host time per call at n=64 float32 ([^)]*): //p" "$BUILD.gemm.log")
    note "GEMM: shardkit vs cuBLAS" ok \
      "worst median ratio $worst (cuBLAS time / shardkit time); bf16 up to $best TF/s; host per call: $host"
  else
    note "GEMM: shardkit vs cuBLAS" FAIL "log: $BUILD.gemm.log"
  fi
else
  skipped "GEMM: shardkit vs cuBLAS"
fi

# ---- 6. the collectives suite on GPU buffers in checked mode over NCCL at one rank ---------------------------------
# gpu_collectives <ranks> <step name> <label>: the collectives suite on GPU buffers in checked mode at that many ranks.
gpu_collectives() {
  local np=$1 step=$2 label=$3 t
  t=$(step_time 300 "$step")
  if [ -z "$t" ]; then
    skipped "$label"
    return
  fi
  if SHARDKIT_TEST_BUFFERS=cuda SHARDKIT_CHECK=1 SHARDKIT_TIMEOUT_S=120 timeout "$t" \
       "${MPIRUN[@]}" -np "$np" "$BUILD/tests/collectives/collectives_tests" >"$BUILD.$step-np$np.log" 2>&1; then
    note "$label" ok "$(grep -c '\[       OK \]' "$BUILD.$step-np$np.log") tests passed on GPU buffers"
  else
    note "$label" FAIL "log: $BUILD.$step-np$np.log"
  fi
}
gpu_collectives 1 nccl "NCCL collectives, 1 rank"

# ---- 7. the Python suite under this machine's Python, NumPy and JAX: at one rank (step "python"), and at two ranks
# sharing the GPU (step "python2": each JAX process then allocates GPU memory as it needs it, not 75% of it up front).
for np in 1 2; do
  step=python; [ "$np" = 2 ] && step=python2
  if t=$(step_time 300 "$step") && [ -n "$t" ]; then
    (cd "$ROOT/tests/python" && XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$t" "${MPIRUN[@]}" -np "$np" \
       -x XLA_PYTHON_CLIENT_PREALLOCATE "$PYTHON" -m pytest -q -p no:cacheprovider --color=no --maxfail=10 \
       --tb=short -rf . >"$BUILD.python-np$np.log" 2>&1)
    py_status=$?
    py_line=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* =+$' "$BUILD.python-np$np.log" | tail -1)
    if [ "$py_status" = 0 ]; then
      note "Python suite, $np rank(s)" ok "$py_line"
    else
      note "Python suite, $np rank(s)" FAIL "exit $py_status: $py_line; log: $BUILD.python-np$np.log"
    fi
  else
    skipped "Python suite, $np rank(s)"
  fi
done

# ---- 8. the collectives suite on GPU buffers in checked mode at 2 and 4 ranks (the longest steps: last) ------------
# On NCCL where it allows that many ranks here; else with the ranks sharing the GPUs, where shardkit finds that NCCL
# refuses such a communicator and MPI carries the GPU buffers through pinned staging (step name "staging").
for np in 2 4; do
  if [ "$multi_rank" = 1 ] || [ "$NGPUS" -ge "$np" ]; then
    gpu_collectives "$np" nccl "NCCL collectives, $np ranks"
  else
    gpu_collectives "$np" staging "GPU buffers over MPI, $np ranks, $NGPUS GPU(s)"
  fi
done

echo
echo "==================== gpu_check summary: $GPU_NAME, NCCL ${NCCL_VERSION:-none} ===================="
printf '%s\n' "${SUMMARY[@]}"
exit $status
