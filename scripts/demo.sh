#!/usr/bin/env bash
# The main demo: installs what is missing, builds, and runs the example under mpirun on this machine's cores
# (or GPUs). Set NP to choose the number of ranks.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$SHARDKIT_ROOT/scripts/setup.sh"
shardkit_build -DSHARDKIT_EXAMPLES=ON
shardkit_mpirun_setup
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
NP="${NP:-$([ "${gpus:-0}" -gt 0 ] && echo "$gpus" || nproc)}"
echo "demo: mpirun -np $NP hello"
"${SHARDKIT_MPIRUN[@]}" -np "$NP" "$SHARDKIT_BUILD_DIR/examples/hello/hello"
