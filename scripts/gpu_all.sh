#!/usr/bin/env bash
# Everything GPU-side in one call: install carried wheels (.whl/, listed in scripts/gpu-wheels.txt: the
# GPU machine has no network), build the collectives library, run the GPU tests (compile and simulator
# tests run in CI), the demo, compute-sanitizer and the benchmarks, and print a summary table last. With
# two or more GPUs it also runs the multi-GPU tests (tests/multigpu, under torchrun), seeded call sequences
# (SEQ_SEEDS=s1,s2: more seeds than the tests' one), compute-sanitizer over them, and the multi-GPU sweep
# against NCCL and PyTorch SymmetricMemory. Stage notebooks executes notebooks/ (their GPU cells included)
# and leaves them, outputs and figures saved, in $OUT/notebooks.
#   usage: bash scripts/gpu_all.sh [pytest -k expression]
# Stage coldstart times the library's warm load (benchmarks/cache_load.py --gpu) and the first collectives of
# fresh processes, cold and warm (benchmarks/cold_compile.py --gpu); BEFORE_TREE=path adds the same for another
# checkout (an earlier commit), side by side.
# Stage channel runs benchmarks/flow_channel_bench.py: Flow's loopback per channel beside ../shared/bench/protocols_ref.cu,
# which must travel in an ignored folder (FLOW_REF=path, default .bench/protocols_ref.cu).
#   STAGES="precompile tests multigpu sanitize bench channel compat launch coldstart sweep notebooks" picks stages
#   (default: all); GPU_TESTS="tests/gpu/test_lsa_gpu.py ..." runs some GPU test files only;
#   stage compat runs numba-cuda's own tests through @flowdsl.kernel (scripts/numba_cuda_compat.py --target gpu); BENCH_ARGS go to
#   benchmarks/collectives_bench.py, MULTIGPU_BENCH_ARGS (e.g. --quick) to benchmarks/multigpu_bench.py.
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
if [ -f .gpucache.tar.xz ]; then  # the library compiled on a CPU machine (scripts/gpu_cache.sh): loaded, not compiled
  mkdir -p "$FLOWDSL_CACHE_DIR" && tar -xJf .gpucache.tar.xz -C "$FLOWDSL_CACHE_DIR"
fi
export NCCL_NVLS_ENABLE=0   # never NVLink multicast on shared machines
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/flowdsl-out}
STAGES=${STAGES:-precompile tests multigpu sanitize bench channel compat launch coldstart sweep notebooks}
mkdir -p "$OUT"
NGPUS=$(nvidia-smi -L | wc -l)
has() { [[ " $STAGES " == *" $1 "* ]]; }
quiet() { grep -v '^W1\|^\*\*\*\*\|OMP_NUM_THREADS'; }   # torchrun's banner lines
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import flowdsl, numba_cuda, numpy, cupy; from flowdsl.runtime.nccl import loaded_version as v; \
print('flowdsl', flowdsl.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, \
'cupy', cupy.__version__, 'nccl', '.'.join(map(str, v())))" | tee "$OUT/versions.txt"
# The collectives library, one worker per CPU (the tests and benchmarks then load it from disk). 510 kernels
# took 498 s on 16 CPUs (H100 machine, 2026-12-07): a call that runs only some tests leaves the stage out, and
# its tests compile the kernels they use.
if has precompile; then
  start=$SECONDS
  python3 -m flowdsl precompile 2>&1 | tr '\r' '\n' | tail -1 | tee "$OUT/precompile.txt"
  echo "wall $((SECONDS - start)) s on $(nproc) CPUs" | tee -a "$OUT/precompile.txt"
fi
if has tests; then
  # GPU_TESTS: the test paths (default: all); the whole GPU suite takes more than one 10-minute call.
  python3 -m pytest ${GPU_TESTS:-tests} -m "gpu and not multigpu" -q -p no:cacheprovider --junitxml="$OUT/junit.xml" \
    ${1:+-k "$1"} 2>&1 | tee "$OUT/pytest.log" | tail -40
  python3 -m flowdsl demo --tokens 64 --hidden 1024 2>&1 | tee "$OUT/demo.log"
fi
if has multigpu && [ "$NGPUS" -ge 2 ]; then
  # Each test launches torchrun over every GPU (tests/multigpu/test_collectives_multigpu.py).
  timeout "${MULTIGPU_TIMEOUT:-1200}" python3 -m pytest tests/multigpu -m multigpu -q -p no:cacheprovider \
    --junitxml="$OUT/junit-multigpu.xml" \
    2>&1 | tee "$OUT/pytest-multigpu.log" | tail -30
  # Seeded call sequences on every GPU beyond the CI seed the tests ran: SEQ_SEEDS (default three random
  # ones), one summary line (tests/multigpu/sequences_worker.py; a failure reruns on the simulator).
  timeout 900 python3 -m torch.distributed.run --standalone --nproc_per_node="$NGPUS" \
    tests/multigpu/sequences_worker.py --seeds "${SEQ_SEEDS:-$RANDOM,$RANDOM,$RANDOM}" --summary "$OUT/sequences.txt" \
    2>&1 | quiet | tee "$OUT/sequences.log" | tail -8
fi
if has sanitize; then
  # Memory and shared-memory race checks (warm kernel cache: no compile under the tool). API errors
  # are off: NCCL probes the driver at start (cuMemCreate, kernel images) and expects refusals.
  : > "$OUT/sanitizer.txt"
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 python3 scripts/sanitize_examples.py \
      > "$OUT/sanitizer-$tool.log" 2>&1
    echo "compute-sanitizer $tool, 1 GPU: exit $? ($(grep -h 'SUMMARY' "$OUT/sanitizer-$tool.log" | tail -1))" \
      | tee -a "$OUT/sanitizer.txt"
  done
  # The planted hangs (a bounded wait that gives up and records why, abort from a thread) and launches
  # replayed from CUDA graphs, under memcheck: the tests themselves check the results.
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q \
    -p no:cacheprovider tests/gpu/test_timeouts_gpu.py tests/gpu/test_launch_replay_gpu.py \
    > "$OUT/sanitizer-memcheck-tests.log" 2>&1
  echo "compute-sanitizer memcheck, timeout and replay tests, 1 GPU: exit $? ($(grep -h 'SUMMARY' \
    "$OUT/sanitizer-memcheck-tests.log" | tail -1); $(grep -E '[0-9]+ passed' "$OUT/sanitizer-memcheck-tests.log" \
    | tail -1))" | tee -a "$OUT/sanitizer.txt"
  if [ "$NGPUS" -ge 2 ]; then
    for tool in memcheck racecheck synccheck; do
      timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node="$NGPUS" --no-python \
        compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 \
        python3 tests/multigpu/collectives_worker.py --small > "$OUT/sanitizer-$tool-multigpu.log" 2>&1
      echo "compute-sanitizer $tool, $NGPUS GPUs: exit $? ($(grep -h 'SUMMARY' "$OUT/sanitizer-$tool-multigpu.log" \
        | sort | uniq -c | tr '\n' ' '))" | tee -a "$OUT/sanitizer.txt"
    done
  fi
fi
if has bench; then
  if [ -f benchmarks/lsa_bench.py ]; then
    python3 benchmarks/lsa_bench.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -30
  fi
  python3 benchmarks/collectives_bench.py ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 \
    | tee "$OUT/collectives_bench.log" | tail -45
fi
if has channel; then  # Flow per channel beside the CUDA C++ reference of NCCL's protocol designs (same GPU, same call)
  python3 benchmarks/flow_channel_bench.py --ref "${FLOW_REF:-.bench/protocols_ref.cu}" --json "$OUT/channel.json" \
    2>&1 | tee "$OUT/channel.log" | tail -30
fi
if has compat; then  # numba-cuda's own test suite through @flowdsl.kernel beside plain numba-cuda, on this GPU
  timeout "${COMPAT_TIMEOUT:-900}" python3 scripts/numba_cuda_compat.py --target gpu --modules all \
    --jobs "$(( $(nproc) / 3 > 0 ? $(nproc) / 3 : 1 ))" --json "$OUT/compat.json" > "$OUT/compat.log" 2>&1
  tail -1 "$OUT/compat.log"
fi
if has launch; then  # host cost of launches and of a repeated small collective, against CuPy's RawKernel
  python3 benchmarks/launch_bench.py --json "$OUT/launch.json" 2>&1 | tee "$OUT/launch_bench.log" | tail -12
fi
if has coldstart; then  # the library precompiled above: its warm load; then cold caches of their own
  python3 benchmarks/cache_load.py --gpu --runs 5 2>&1 | tee "$OUT/coldstart.log" | tail -1
  for tree in ${BEFORE_TREE:-} "$PWD"; do
    python3 benchmarks/cold_compile.py --runs 2 --gpu --tree "$tree" 2>&1 | tee -a "$OUT/coldstart.log"
  done
fi
if has sweep && [ "$NGPUS" -ge 2 ]; then
  # The cost per call of check_collectives=True (the signatures all-gathered before each launch).
  python3 -m torch.distributed.run --standalone --nproc_per_node="$NGPUS" benchmarks/check_collectives_bench.py \
    --json "$OUT/check_collectives.json" 2>&1 | quiet | tee "$OUT/check_collectives.log" | tail -16
  # The several-GPU sweep against NCCL and SymmetricMemory: its tables, then its GOALS block.
  python3 -m torch.distributed.run --standalone --nproc_per_node="$NGPUS" benchmarks/multigpu_bench.py \
    ${MULTIGPU_BENCH_ARGS:-} --json "$OUT/multigpu.json" --plot "$OUT/multigpu.png" 2>&1 | quiet \
    | tee "$OUT/multigpu_bench.log" | tail -150
fi
if has notebooks; then
  # Headless (nbclient + ipykernel, carried as wheels: scripts/gpu-wheels.txt); the GPU cells run the fused
  # kernel's benchmark under torchrun on every GPU. Copy $OUT/notebooks/*.ipynb over notebooks/ to commit them.
  if python3 -c "import nbclient, nbformat, ipykernel" 2>/dev/null; then
    python3 scripts/run_notebooks.py --out "$OUT/notebooks" 2>&1 | grep -v 'Kernel is running over TCP' \
      | tee "$OUT/notebooks.log"
  else
    echo "notebooks: skipped, nbclient/nbformat/ipykernel missing: carry the wheels of scripts/gpu-wheels.txt in .whl/" \
      | tee "$OUT/notebooks.log"
  fi
fi
python3 scripts/summary.py "$OUT"
