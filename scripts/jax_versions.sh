#!/usr/bin/env bash
# The JAX suites against other jax releases than the one scripts/setup.sh installs: for each jax minor release given
# (default: the oldest and the newest of pyproject.toml's range), a virtual environment build/venv-jax-<version>/ with
# that jax[cpu] and what the build and the tests need, shardkit built and installed into it against that jaxlib's XLA
# FFI headers, and test_jax.py, test_jax_shard_map.py, test_jax_eager.py, test_jax_ops.py, test_jax_pytree.py,
# test_jax_vma.py and test_jax_errors.py at 2 ranks (SHARDKIT_JAX_VERSIONS_RANKS="1 2" adds 1, where the paths of a
# size-1 mesh axis run: tiled psum_scatter and all_to_all over one rank), with one dtype of each kind
# (SHARDKIT_TEST_WIDE_SWEEP=0: the dtypes are handled by shardkit, JAX's internals by kind; scripts/test.sh sweeps every
# dtype at 2 ranks on the main environment's jax, and SHARDKIT_TEST_WIDE_SWEEP=1 here does too); and, outside mpirun,
# test_package_layout.py (the JAX layer, loaded at `import jax`, starts none of that release's backends; the package's
# imports point one way). Non-zero if any run fails. Idempotent: an environment that holds the asked-for jax is kept,
# and shardkit is rebuilt (incrementally, in the environment's own build folder) only when its sources changed.
#
# shardkit is built in each environment rather than copied from the main build: a handler built with a newer jaxlib's
# headers is refused by an older jaxlib ("the handler's API version (0.3) is incompatible with the framework's API
# version (0.2)", jax 0.10's headers under jaxlib 0.8). These builds leave CUDA and NCCL out (the suites run on the
# CPU; the main build compiles the XLA:GPU handler).
#
# jax 0.11 and later need Python 3.12 or newer: their environments are made with $PYTHON312, else the first of
# python3.12 / python3.13 on PATH, else a pyenv 3.12 / 3.13 (this image's Debian has Python 3.11 only). Where none is
# found the run fails and says so: a version asked for is never skipped.
#
#   scripts/jax_versions.sh              # 0.8 and 0.11 (the oldest and the newest of the range, latest patch of
#                                        # each), and 0.10 where the main environment lacks it (scripts/test.sh runs
#                                        # the suites on the main environment's jax at 1-4 ranks)
#   scripts/jax_versions.sh 0.9 0.10.1   # a minor release (its latest patch) or an exact release
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

versions=("$@")
PYTHON="${PYTHON:-python3}"
if [ ${#versions[@]} -eq 0 ]; then
  versions=(0.8 0.11)
  # 0.10 is the newest that Python 3.11 installs: what scripts/setup.sh puts in the main environment, where
  # scripts/test.sh runs these suites at 1-4 ranks already. An environment of its own only where the main one lacks it.
  main_jax=$("$PYTHON" -c "import jax; print(jax.__version__)" 2>/dev/null || true)
  if [[ "$main_jax" != 0.10.* ]]; then
    versions+=(0.10)
  else
    echo "jax_versions: jax $main_jax is the main environment's (scripts/test.sh ran its suites): not again"
  fi
fi

# The Python that makes the environment of jax version $1 (printed), or none (status 1).
python_for() {
  local minor="${1#0.}"
  minor="${minor%%.*}"
  if [ "$minor" -lt 11 ]; then
    echo "$PYTHON"
    return
  fi
  local candidates=("${PYTHON312:-}" python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[23]*/bin/python3)
  local c
  for c in "${candidates[@]}"; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null && "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
      command -v "$c"
      return
    fi
  done
  return 1
}
TEST_FILES=(test_jax.py test_jax_shard_map.py test_jax_eager.py test_jax_ops.py test_jax_pytree.py test_jax_vma.py
            test_jax_errors.py)
# What `pip install --no-build-isolation .` and the JAX suites need besides jax (pyproject.toml's build requirements).
VENV_PACKAGES=(numpy pytest mpi4py ml_dtypes nanobind scikit-build-core apache-tvm-ffi)
# Unoptimised (-O0, assertions still off as in a release): these suites exercise JAX's side on small arrays, and the
# builds were the largest part of this script's run.
BUILD_SETTINGS=(-C cmake.define.SHARDKIT_CUDA=OFF -C cmake.define.SHARDKIT_NCCL=OFF
                -C "cmake.define.CMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG")

# What the installed shardkit was built from: the sources (as scripts/setup.sh's stamp) and the build settings.
stamp=$(cd "$SHARDKIT_ROOT" && find CMakeLists.txt pyproject.toml cmake core launch collectives sharding bindings \
          -type f -not -name '*.pyc' -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)
stamp="$stamp ${BUILD_SETTINGS[*]}"

# Makes (or keeps) the environment for jax version $1 and builds shardkit into it (or keeps the one built).
prepare() {
  local version="$1" venv="$SHARDKIT_ROOT/build/venv-jax-$1"
  local spec="jax[cpu]==$version"
  if [[ "$version" =~ ^[0-9]+\.[0-9]+$ ]]; then
    spec="jax[cpu]==$version.*"
  fi
  local py="$venv/bin/python" base
  if ! base=$(python_for "$version"); then
    echo "jax_versions: jax $version needs Python 3.12 or newer, and none was found (set PYTHON312)" >&2
    return 1
  fi
  if [ ! -f "$venv/jax-spec" ] || [ "$(cat "$venv/jax-spec")" != "$spec" ] || ! "$py" -c "import jax" 2>/dev/null; then
    local t=$SECONDS
    echo "jax_versions: making $venv ($spec)"
    rm -rf "$venv"
    "$base" -m venv "$venv"
    "$py" -m pip install -q --disable-pip-version-check "$spec" "${VENV_PACKAGES[@]}"
    echo "$spec" > "$venv/jax-spec"
    echo "jax_versions: made $venv in $(( SECONDS - t )) s"
  fi
  if [ ! -f "$venv/shardkit-sources.sha1" ] || [ "$(cat "$venv/shardkit-sources.sha1")" != "$stamp" ] \
     || ! (cd / && "$py" -c "import shardkit") 2>/dev/null; then
    local t=$SECONDS
    echo "jax_versions: building shardkit in $venv"
    "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
      -C build-dir="$venv/build" "${BUILD_SETTINGS[@]}" "$SHARDKIT_ROOT"
    echo "$stamp" > "$venv/shardkit-sources.sha1"
    echo "jax_versions: built shardkit in $(( SECONDS - t )) s"
  fi
}

shardkit_mpirun_setup
export SHARDKIT_CHECK=1 SHARDKIT_TIMEOUT_S="${SHARDKIT_TIMEOUT_S:-60}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export SHARDKIT_TEST_WIDE_SWEEP="${SHARDKIT_TEST_WIDE_SWEEP:-0}"
failed=()
for version in "${versions[@]}"; do
  start=$SECONDS
  prepare "$version"
  py="$SHARDKIT_ROOT/build/venv-jax-$version/bin/python"
  installed=$("$py" -c "import jax, jaxlib; print(f'jax {jax.__version__}, jaxlib {jaxlib.__version__}')")
  # The layer must find its handlers (built with this jaxlib's headers), or the suites would skip as "no JAX layer".
  (cd / && "$py" -c "import shardkit; assert shardkit._core._jax_ffi_targets(), 'built without jaxlib headers'")
  echo "jax_versions: $installed, the package's layout (outside mpirun)"
  if ! (cd "$SHARDKIT_ROOT/tests/python" && "$py" -m pytest -q -p no:cacheprovider test_package_layout.py); then
    failed+=("$installed: test_package_layout.py")
  fi
  for np_ in ${SHARDKIT_JAX_VERSIONS_RANKS:-2}; do
    echo "jax_versions: $installed, $np_ rank(s)"
    if ! (cd "$SHARDKIT_ROOT/tests/python" &&
          "${SHARDKIT_MPIRUN[@]}" -np "$np_" "$py" -m pytest -q -p no:cacheprovider "${TEST_FILES[@]}"); then
      failed+=("$installed at $np_ rank(s)")
    fi
  done
  echo "jax_versions: $installed done in $(( SECONDS - start )) s"
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'jax_versions: FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "jax_versions: passed (${versions[*]}) in $SECONDS s"
