#!/usr/bin/env bash
# Rebuild every checked-in support build (prebuilt/build/) and its manifest.
# Needs nvcc and network access to PyPI (it downloads the exact NCCL wheels for their headers).
# The CFT builds need CUDA >= 13.3: `--cft` installs the pinned nvcc wheels from PyPI into
# $FLOWDSL_CFT_TOOLKIT (default ~/.cache/flowdsl/cuda-13.3) and builds with them.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m flowdsl.lowering.externs > prebuilt/include/flowdsl_support.h
python -m flowdsl.lowering.externs cft > prebuilt/include/flowdsl_cft.h
python -m flowdsl.runtime.support_build --all
python -m flowdsl.runtime.support_build --cft
