#!/usr/bin/env bash
# The test command: installs what is missing, configures (CUDA compiled wherever nvcc is), builds, and runs ctest.
# Extra arguments go to ctest, e.g. `scripts/test.sh -L mpi` or `scripts/test.sh -R dlpack`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$SHARDKIT_ROOT/scripts/setup.sh"
shardkit_build -DSHARDKIT_TESTS=ON -DSHARDKIT_EXAMPLES=ON
shardkit_mpirun_setup
start=$(date +%s)
ctest --test-dir "$SHARDKIT_BUILD_DIR" -j "$SHARDKIT_JOBS" --output-on-failure "$@"
echo "test.sh: ctest passed in $(( $(date +%s) - start )) s"
