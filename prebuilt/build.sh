#!/usr/bin/env bash
# Rebuild every checked-in support build (prebuilt/build/) and its manifest.
# Needs nvcc and network access to PyPI (it downloads the exact NCCL wheels for their headers).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m flowdsl.lowering.externs > prebuilt/include/flowdsl_support.h
python -m flowdsl.runtime.support_build --all
