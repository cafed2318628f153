#!/usr/bin/env bash
# Installs what shardkit needs to build and test, from Debian packages and PyPI only, and only what is missing.
# Safe to run again: a second run installs nothing.
set -euo pipefail

# Debian packages: compilers and CMake, Open MPI, OpenBLAS, ScaLAPACK, GoogleTest, nlohmann/json (checkpoint
# metadata), clang with its runtime libraries (libFuzzer, sanitizers) for scripts/fuzz.sh, and iproute2 (ip, tc) for
# the simulated hosts of scripts/multihost.sh.
DEB_PACKAGES=(g++ cmake make openmpi-bin libopenmpi-dev libopenblas-dev libscalapack-openmpi-dev libgtest-dev
              nlohmann-json3-dev
              clang libclang-rt-14-dev iproute2)
# PyPI packages (import name=pip name): build tools, the test runner, the type checker of the typed API
# (tests/python/test_typing.py), the frameworks the tests exchange arrays with, and matplotlib for
# scripts/plot_bench.py and `shardkit-trace merge --png`; mpi4jax is the baseline of
# examples/benchmarks/jax_overhead.py; tensorstore and zarr are the other readers a checkpoint is tested with
# (tests/python/test_checkpoint.py); optax is the optimiser whose state examples/jax/train_mlp.py checkpoints, and
# what tests/python/test_optax.py checks sk.optax against; mkdocs builds the documentation site (scripts/docs.sh).
# apache-tvm-ffi ships the DLPack 1.x header (Debian's libdlpack-dev is 0.6, without versioned tensors).
PY_PACKAGES=(numpy=numpy pytest=pytest mypy=mypy mpi4py=mpi4py nanobind=nanobind scikit_build_core=scikit-build-core
             "jax=jax[cpu]>=0.8,<0.12" warp=warp-lang tvm_ffi=apache-tvm-ffi matplotlib=matplotlib ml_dtypes=ml_dtypes
             tensorstore=tensorstore zarr=zarr optax=optax mkdocs=mkdocs)
# Benchmark baselines (examples/benchmarks/jax_overhead.py): built from source (no wheel), so a failure to build one
# is reported and the benchmark runs without it, rather than failing the setup.
BASELINE_PY_PACKAGES=(mpi4jax=mpi4jax)

missing_debs=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing_debs+=("$p")
done
if [ ${#missing_debs[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing_debs[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing_debs[@]}"
fi

PYTHON="${PYTHON:-python3}"
missing_py=()
for entry in "${PY_PACKAGES[@]}"; do
  mod="${entry%%=*}"
  pkg="${entry#*=}"
  "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null \
    || missing_py+=("$pkg")
done
if [ ${#missing_py[@]} -gt 0 ]; then
  echo "setup: installing Python packages: ${missing_py[*]}"
  "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${missing_py[@]}"
fi
for entry in "${BASELINE_PY_PACKAGES[@]}"; do
  mod="${entry%%=*}"
  pkg="${entry#*=}"
  "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null && continue
  echo "setup: installing benchmark baseline $pkg"
  "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$pkg" \
    || echo "setup: warning: could not install $pkg (a benchmark baseline only; the benchmark runs without it)"
done
echo "setup: dependencies present"

# The shardkit Python package itself, for the tests and examples: `pip install .` (scikit-build-core, the same CMake
# project), rebuilt incrementally in build/pip and skipped when the installed one was built from these sources.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stamp_file="$ROOT/build/pip/installed-sources.sha1"
stamp=$(cd "$ROOT" && find CMakeLists.txt pyproject.toml cmake core launch collectives sharding bindings \
          -type f -not -name '*.pyc' -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] \
   && (cd / && "$PYTHON" -c "import shardkit" >/dev/null 2>&1); then
  echo "setup: shardkit package up to date"
else
  echo "setup: installing the shardkit Python package (pip install .)"
  "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-build-isolation --no-deps "$ROOT"
  mkdir -p "$(dirname "$stamp_file")"
  echo "$stamp" > "$stamp_file"
fi
