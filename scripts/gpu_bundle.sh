#!/usr/bin/env bash
# Makes the offline bundle scripts/gpu_check.sh needs on a GPU machine without network access, on a connected
# Debian/Ubuntu x86-64 machine: Open MPI's Debian packages (with their library dependencies, downloaded, not
# installed) and the Python wheels the build needs. Then copy the folder along and run
#   SHARDKIT_BUNDLE=<folder> scripts/gpu_check.sh
# Usage: scripts/gpu_bundle.sh [folder (default .bundle)] [python version of the GPU machine (default 3.12)]
set -euo pipefail
OUT="${1:-.bundle}"
PYVER="${2:-3.12}"
mkdir -p "$OUT/debs" "$OUT/wheels"
OUT="$(cd "$OUT" && pwd)"

# Open MPI and the libraries it links that a minimal CUDA image may lack.
debs=(openmpi-bin openmpi-common libopenmpi-dev libopenmpi3 libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7
      libhwloc15 libhwloc-plugins libfabric1 libpsm2-2 libpsm-infinipath1 libucx0 libibverbs1 librdmacm1
      libnl-3-200 libnl-route-3-200 libxnvctrl0 libnuma1 libopenblas0-pthread libopenblas-pthread-dev
      libopenblas-dev libblas3 liblapack3 libgfortran5 libscalapack-openmpi2.2 libscalapack-openmpi-dev
      libgtest-dev googletest
      # Linked by libopen-pal, OpenBLAS and MPI's components, and absent from some minimal images (each is left out
      # on a machine that has it: gpu_check.sh keeps the machine's own).
      libudev1 libquadmath0 libuuid1 libatomic1 libpciaccess0 libmunge2 libltdl7)
(cd "$OUT/debs" && apt-get download "${debs[@]}")

# Debian's maintainer scripts make the unversioned names (mpirun, mpicc, libblas.so.3, cblas.h, ...) through
# update-alternatives, which `dpkg -x` never runs: record them (link -> target, as on this machine) for gpu_check.sh.
: >"$OUT/links.txt"
while read -r link; do
  target=$(readlink -f "$link")
  if dpkg -S "$target" 2>/dev/null | grep -qE '^(openmpi-bin|libopenmpi-dev|libopenmpi3|libopenblas0-pthread|libopenblas-pthread-dev):'; then
    echo "$link $target" >>"$OUT/links.txt"
  fi
done < <(find /usr/bin /usr/lib/x86_64-linux-gnu /usr/include -maxdepth 2 -type l -lname '/etc/alternatives/*' 2>/dev/null)

# Wheels for the build and the checks (nanobind, scikit-build-core, the DLPack header, mpi4py, pytest).
python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$OUT/wheels" nanobind scikit-build-core apache-tvm-ffi mpi4py pytest pluggy iniconfig packaging pathspec
echo "bundle ready in $OUT: $(ls "$OUT/debs" | wc -l) Debian packages, $(ls "$OUT/wheels" | wc -l) wheels"
