"""Helpers for writing multi-rank tests of flowdsl programs on the CPU simulator, and for running a
notebook's program on every GPU of this machine (:func:`run_on_gpus`).

Example (a test file; ``@pytest.mark.sim`` too if your pytest configuration
registers a ``sim`` marker)::

    from flowdsl.examples import allgather_lsa
    from flowdsl.testing import assert_ranks_close, for_seeds, run_ranks

    @for_seeds(8)
    def test_allgather(seed):
        assert_ranks_close(run_ranks(allgather_lsa.run, nranks=4, seed=seed))
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["run_ranks", "for_seeds", "run_seeds", "assert_ranks_close", "run_on_gpus", "gpu_script"]


def run_ranks(main: Callable[[Any], Any], nranks: int = 4, seed: int = 0, nodes: int = 1,
              **options) -> list:
    """Run ``main(comm)`` on ``nranks`` simulated ranks; return the results by rank.

    Args:
        main: The host program of one rank.
        nranks: Number of simulated ranks.
        seed: Scheduler seed (the same seed replays the same interleaving).
        nodes: Number of simulated nodes (the LSA team is a node).
        **options: Passed to :func:`flowdsl.sim.spawn`.
    """
    from flowdsl import sim
    return sim.spawn(main, nranks=nranks, seed=seed, nodes=nodes, **options)


def for_seeds(n: int, start: int = 0):
    """Pytest decorator: run the test once per seed ``start .. start+n-1`` (argument ``seed``).

    Each seed is its own test case (``test_x[seed=3]``), so a failure names the
    seed that reproduces it.
    """
    import pytest
    return pytest.mark.parametrize("seed", list(range(start, start + n)),
                                   ids=[f"seed={s}" for s in range(start, start + n)])


def run_seeds(main: Callable[[Any], Any], nranks: int = 4, seeds: Iterable[int] = range(8),
              nodes: int = 1, progress: bool | None = None, **options) -> dict:
    """Run ``main`` under every seed; return ``{seed: results}``.

    An exception names the seed that raised it (as a note, and in simulator
    errors' messages).

    Args:
        progress: Draw a progress bar with an ETA over the seeds on stderr; default:
            when stderr is a terminal.
    """
    from ._progress import ProgressBar  # noqa: PLC0415

    seeds = list(seeds)
    bar = ProgressBar(len(seeds), f"run_seeds {getattr(main, '__name__', 'main')} x{nranks} ranks",
                      enabled=progress)
    out = {}
    try:
        for done, s in enumerate(seeds):
            bar.update(done, f"seed {s}")
            try:
                out[s] = run_ranks(main, nranks=nranks, seed=s, nodes=nodes, **options)
            except Exception as e:
                e.add_note(f"flowdsl.testing.run_seeds: failed with seed={s}")
                raise
        bar.update(len(seeds), "done")
    finally:
        bar.close()
    return out


def assert_ranks_close(results, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Assert every rank's ``(result, reference)`` pair matches (``numpy.testing.assert_allclose``)."""
    import numpy as np
    for rank, (result, ref) in enumerate(results):
        np.testing.assert_allclose(result, ref, rtol=rtol, atol=atol, err_msg=f"rank {rank}")


_GPU_MAIN = """
if __name__ == "__main__":
    import json, sys
    import torch.distributed as dist
    dist.init_process_group("gloo")
    barrier = dist.barrier
    with flowdsl.init(group=dist.group.WORLD) as comm:
        result = {call}
        if comm.rank == 0:
            import cupy
            gpu = cupy.cuda.runtime.getDeviceProperties(comm.device)["name"].decode()
            with open(sys.argv[1], "w") as f:
                json.dump({{"nranks": comm.nranks, "gpu": gpu, "result": result}}, f)
    dist.destroy_process_group()
"""


def gpu_script(*definitions, call: str, cells=()) -> str:
    """The script :func:`run_on_gpus` runs: for each of ``cells`` (functions or kernels made in a notebook)
    the whole cell that made it, with the imports and device functions it needs; the source of each of
    ``definitions``; then a main that evaluates ``call`` on every rank."""
    import inspect  # noqa: PLC0415
    import linecache  # noqa: PLC0415

    whole = ["".join(linecache.getlines(getattr(c, "py_func", c).__code__.co_filename)) for c in cells]
    parts = [*whole, *(inspect.getsource(getattr(d, "py_func", d)) for d in definitions)]
    future = sorted({line for part in parts for line in part.splitlines() if line.startswith("from __future__")})
    body = ["\n".join(line for line in part.splitlines() if not line.startswith("from __future__")) for part in parts]
    return "\n\n".join([*future, "import flowdsl", *body]) + _GPU_MAIN.format(call=call)  # future imports first


def run_on_gpus(*definitions, call: str, cells=(), timeout: float = 1100):
    """Run ``call`` on every GPU of this machine, one rank per GPU under ``torchrun``, and return rank 0's
    ``{"nranks", "gpu", "result"}`` (``result``: what ``call`` returned, JSON-serialisable); None, with the
    reason printed, where there is no GPU or no PyTorch.

    ``definitions``: the functions ``call`` needs (their source), ``cells``: functions or kernels whose whole
    notebook cell it needs (IPython keeps each cell's text), written into the script by :func:`gpu_script`.
    ``call``: an expression over them and ``comm`` (this rank's communicator) and
    ``barrier`` (``torch.distributed.barrier``), e.g. ``"benchmark(comm, line_up=barrier)"``. NVLink
    multicast stays off. A failure raises, naming the script it ran.
    """
    import importlib.util  # noqa: PLC0415
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from .errors import FlowDSLError  # noqa: PLC0415

    gpus = _gpu_count()
    if not gpus:
        print("No GPU here: skipping the GPU cells (the results above are the simulator's).")
        return None
    if importlib.util.find_spec("torch") is None:
        print(f"{gpus} GPU(s), but no PyTorch: skipping the GPU cells (they start one process per GPU with torchrun).")
        return None
    workdir = Path(tempfile.mkdtemp(prefix="flowdsl_gpus_"))
    script = workdir / "run.py"
    script.write_text(gpu_script(*definitions, call=call, cells=cells))
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",  # no NVLink multicast
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
                           str(script), str(workdir / "result.json")], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        print(proc.stdout[-4000:], proc.stderr[-8000:])
        raise FlowDSLError(f"The GPU run failed (exit {proc.returncode}); its script is {script}")
    return json.loads((workdir / "result.json").read_text())


def _gpu_count() -> int:
    try:
        import cupy  # noqa: PLC0415

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy, no driver or no device
        return 0
