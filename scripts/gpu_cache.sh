#!/usr/bin/env bash
# The collectives library compiled here, on a CPU machine, for the GPU machine: a kernel disk cache whose keys
# are the ones the GPU image computes, packed as .gpucache.tar.xz to carry there. scripts/gpu_all.sh unpacks it
# into the cache before its precompile, which then loads what it finds instead of compiling it (the whole
# library took 300 s of the GPU machine's 16 CPUs, device time).
#
# A key (flowdsl/_cache.py, kernel_key) holds the versions of what compiles a kernel: Python major.minor,
# numba, numba-cuda, llvmlite, NumPy and nvJitLink major.minor, besides flowdsl's sources and the target.
# The pins below are the GPU image's, as it printed them (2026-12-06): Python 3.12, numba 0.68.0, numba-cuda
# 0.30.4, llvmlite 0.50.0, NumPy 2.4.6 (the carried wheel), NVVM and nvJitLink 13.0 (LTO-IR from a newer NVVM
# does not link there). A kernel whose key differs is compiled on the GPU machine as before: the precompile's
# "N already cached" says how many matched.
#
#   usage: bash scripts/gpu_cache.sh [python3.12] [--dtypes ...]   -> .gpucache.tar.xz
#   then:  run(..., carry=[".whl", ".gpucache.tar.xz"])   (both ignored by git; .whl: scripts/gpu-wheels.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3.12}
shift || true
VENV=.gpuvenv
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q -e . "numba==0.68.0" "numba-cuda==0.30.4" "llvmlite==0.50.0" "numpy==2.4.6" \
    "nvidia-nvvm==13.0.*" "nvidia-nvjitlink==13.0.*"
fi
"$VENV/bin/python" -c "import sys; from flowdsl import _cache; assert sys.version_info[:2] == (3, 12), sys.version; \
print('key versions:', _cache._versions())"
rm -rf .gpucache
start=$SECONDS
FLOWDSL_CACHE_DIR=$PWD/.gpucache "$VENV/bin/python" -m flowdsl precompile --arch sm_90 --nccl 2.28.9 "$@" \
  2>&1 | tr '\r' '\n' | tail -1
tar -cJf .gpucache.tar.xz -C .gpucache .
echo "$(ls .gpucache/kernels/*.cubin | wc -l) kernels in $((SECONDS - start)) s; .gpucache.tar.xz: $(du -h .gpucache.tar.xz | cut -f1)"
