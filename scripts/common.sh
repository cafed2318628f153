# Shared by the scripts in this folder: repository root, build folder, and how to launch MPI jobs here.
# shellcheck shell=bash

SHARDKIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARDKIT_BUILD_DIR="${SHARDKIT_BUILD_DIR:-$SHARDKIT_ROOT/build}"
SHARDKIT_JOBS="${SHARDKIT_JOBS:-$(nproc 2>/dev/null || echo 2)}"
# ctest's parallel level: its slots count half cores (cmake/ShardkitTesting.cmake), so the tests that compute fill
# SHARDKIT_JOBS cores and one that only waits (for a timeout, a killed rank) runs beside them.
SHARDKIT_CTEST_JOBS=$(( 2 * SHARDKIT_JOBS + 1 ))

# mpirun flags for this machine: Open MPI refuses root without two variables, and refuses more ranks than cores
# without --oversubscribe.
shardkit_mpirun_setup() {
  SHARDKIT_MPIRUN=(mpirun)
  if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    SHARDKIT_MPIRUN+=(--oversubscribe --bind-to none)
    if [ "$(id -u)" = 0 ]; then
      export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
  fi
}

# Configures and builds the CMake project into $SHARDKIT_BUILD_DIR. Extra arguments go to the configure step.
shardkit_build() {
  cmake -S "$SHARDKIT_ROOT" -B "$SHARDKIT_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$SHARDKIT_BUILD_DIR" -j "$SHARDKIT_JOBS"
}
