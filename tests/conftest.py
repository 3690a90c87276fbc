"""Test groups by what they need: ``compile`` (CPU), ``sim`` (CPU), ``gpu``, ``multigpu``.

GPU tests skip with the reason when no GPU (or no NCCL device API) is usable,
so ``pytest`` runs everything the machine can.

With pytest-xdist installed (the ``test`` extra) on a machine without a GPU, the
tests are spread over one process per CPU, as if ``-n auto`` had been given; ``-n 0``
runs them in this process, ``-n N`` in N processes. With a GPU they run in one
process unless ``-n`` says otherwise: the GPU tests share the GPU (and the several-GPU
tests every GPU of the machine).
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_addoption(parser):
    parser.addoption("--seq-seed", type=int, default=None,
                     help="seed of the call sequences (tests/sim/test_call_sequences.py; default: the CI seed, "
                          "flowdsl.collectives.sequences.CI_SEED; also FLOWDSL_SEQ_SEED)")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``-n auto`` by default when pytest-xdist is installed (not in its workers, not under --pdb,
    not on a GPU machine)."""
    if (config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None) is None
            and not hasattr(config, "workerinput") and not config.getoption("usepdb", False)
            and len(os.sched_getaffinity(0)) > 1 and gpu_count() == 0):
        config.option.numprocesses = "auto"
        if config.option.dist == "no":
            config.option.dist = "worksteal"  # a few tests take minutes: idle workers take over queued ones


@functools.cache
def gpu_count() -> int:
    try:
        from cuda.bindings import driver

        if int(driver.cuInit(0)[0]) != 0:
            return 0
        err, count = driver.cuDeviceGetCount()
        return count if int(err) == 0 else 0
    except Exception:  # noqa: BLE001 - no driver at all
        return 0


def pytest_collection_modifyitems(config, items):
    count = gpu_count()
    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU: no CUDA driver or device on this machine "
                                     "(run scripts/gpu_all.sh on a GPU machine)")
    few_gpus = pytest.mark.skip(reason=f"needs 2 or more GPUs, this machine has {count}")
    for item in items:
        if "gpu" in item.keywords and count == 0:
            item.add_marker(no_gpu)
        if "multigpu" in item.keywords and count < 2:
            item.add_marker(few_gpus)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session compiles into its own kernel cache, so tests never read a stale cubin.

    Under pytest-xdist each worker has its own base temp directory, hence its own cache.
    """
    if "FLOWDSL_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "flowdsl-cache"))
