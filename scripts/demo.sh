#!/usr/bin/env bash
# The main demo: installs what is missing, builds, and runs the distributed matrix multiplication under mpirun on
# this machine's GPUs, or its cores (host memory over MPI) when it has none. Every algorithm runs on its own input
# layout, is checked against a one-rank BLAS product, and is timed.
#   NP=4 SIZE=4096 scripts/demo.sh      (defaults: GPUs or cores; SIZE 2048)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

"$SHARDKIT_ROOT/scripts/setup.sh"
shardkit_build -DSHARDKIT_EXAMPLES=ON
shardkit_mpirun_setup
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
NP="${NP:-$([ "${gpus:-0}" -gt 0 ] && echo "$gpus" || nproc)}"
SIZE="${SIZE:-2048}"
echo "demo: mpirun -np $NP distributed_matmul --size $SIZE --algo all --repeat 3"
"${SHARDKIT_MPIRUN[@]}" -np "$NP" "$SHARDKIT_BUILD_DIR/examples/distributed_matmul/distributed_matmul" \
  --size "$SIZE" --algo all --repeat 3 --check
