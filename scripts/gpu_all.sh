#!/usr/bin/env bash
# Everything GPU-side in one call: install carried wheels (the GPU machine has no network),
# build the collectives library, run the GPU tests (compile and simulator tests run in CI), the
# demo, compute-sanitizer and the benchmarks (LSA, collectives), and print a summary table last.
#   usage: bash scripts/gpu_all.sh [pytest -k expression]
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
export FLOWDSL_CACHE_DIR=${FLOWDSL_CACHE_DIR:-/tmp/flowdsl-cache}
export NCCL_NVLS_ENABLE=0   # never NVLink multicast on shared machines
OUT=${OUT:-/tmp/flowdsl-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import flowdsl, numba_cuda, numpy, cupy; from flowdsl.runtime.nccl import loaded_version as v; \
print('flowdsl', flowdsl.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, \
'cupy', cupy.__version__, 'nccl', '.'.join(map(str, v())))" | tee "$OUT/versions.txt"
# The collectives library, one worker per CPU (the tests and benchmarks then load it from disk).
start=$SECONDS
python3 -m flowdsl precompile 2>&1 | tr '\r' '\n' | tail -1 | tee "$OUT/precompile.txt"
echo "wall $((SECONDS - start)) s on $(nproc) CPUs" | tee -a "$OUT/precompile.txt"
python3 -m pytest tests -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit.xml" ${1:+-k "$1"} 2>&1 | tee "$OUT/pytest.log" | tail -40
python3 -m flowdsl demo --tokens 64 --hidden 1024 2>&1 | tee "$OUT/demo.log"
# The same demo bootstrapped by torchrun (flowdsl.init reads RANK/WORLD_SIZE/LOCAL_RANK).
python3 -m torch.distributed.run --nproc_per_node=1 -m flowdsl demo --tokens 8 2>&1 | tail -2 | tee "$OUT/torchrun.log"
# Memory and shared-memory race checks of the examples (warm kernel cache: no compile under the tool).
# API errors are off: NCCL probes the driver at start (cuMemCreate, kernel images) and expects refusals.
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 python3 scripts/sanitize_examples.py > "$OUT/sanitizer-$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? ($(grep -h 'SUMMARY' "$OUT/sanitizer-$tool.log" | tail -1))" | tee -a "$OUT/sanitizer.txt"
done
if [ -f benchmarks/lsa_bench.py ]; then
  python3 benchmarks/lsa_bench.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -30
fi
python3 benchmarks/collectives_bench.py ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 | tee "$OUT/collectives_bench.log" | tail -45
python3 scripts/summary.py "$OUT"
