"""The notebooks run headless, each in a fresh kernel, on the simulator, and say what they should.

``scripts/run_notebooks.py`` executes them (the same function as here); the kernel sees no GPU, so the GPU
cells must print that they skip. Each notebook is one test, so the two run in parallel under pytest-xdist.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
#: Seconds a cell may take here: the slowest (two seeds of the fused kernel on 4 ranks) takes about 5.
CELL_TIMEOUT = 120

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need pip install -e '.[test]' (nbformat)")
pytest.importorskip("nbclient", reason="the notebook tests need pip install -e '.[test]' (nbclient)")
pytest.importorskip("ipykernel", reason="the notebook tests need pip install -e '.[test]' (ipykernel)")
run_notebooks = runpy.run_path(str(ROOT / "scripts" / "run_notebooks.py"))


def _read(name: str):
    # Warnings are errors here: a cell without an id would fail the read (MissingIDFieldWarning).
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    return notebook


def _run(name: str, monkeypatch) -> dict[str, str]:
    """Execute notebook ``name`` with no GPU visible; ``{cell id: its text output}`` of the code cells."""
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    notebook = _read(name)
    env = run_notebooks["kernel_environment"](CUDA_VISIBLE_DEVICES="")
    run_notebooks["execute"](notebook, NOTEBOOKS, CELL_TIMEOUT, env)
    outputs = {}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o.output_type == "error"], cell.id
            outputs[cell.id] = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    return outputs


def _gpu_cells(notebook) -> list[str]:
    return [c.id for c in notebook.cells if c.cell_type == "code" and c.source.startswith("# GPU\n")]


def test_rmsnorm_notebook_runs_on_the_simulator(monkeypatch):
    out = _run("rmsnorm_fused.ipynb", monkeypatch)
    worst = re.search(r"max error over 2 seeds x 4 simulated ranks: (\S+) \(tolerance 1e-05\)", out["simulate"])
    assert worst, out["simulate"]
    assert 0 < float(worst.group(1)) < 1e-5  # float32 against float64: small, never exactly 0
    for dtype in ("float32", "float16", "bfloat16"):  # the half-precision cell checks each within its rounding
        assert re.search(rf"{dtype}: max \|fused - NumPy \(float64\)\| over 4 simulated ranks", out["half-precision"])
    diagnosis = out["planted-bug"]
    assert "The simulator's diagnosis (DataRaceError)" in diagnosis, diagnosis
    assert "data race" in diagnosis and "seed=0" in diagnosis, diagnosis
    # Both accesses: the buggy kernel's read of a peer's row, the peer's partial_sums write.
    assert "of kernel 'rmsnorm_reduce_scatter_no_first_barrier'" in diagnosis, diagnosis
    assert "write by rank" in diagnosis and "of kernel 'partial_sums'" in diagnosis, diagnosis
    assert out["gpu-run"].startswith("No GPU here: skipping the GPU cells"), out["gpu-run"]
    assert out["gpu-plot"].startswith("No GPU results to plot"), out["gpu-plot"]


def test_flow_notebook_runs_on_the_simulator(monkeypatch):
    out = _run("flow_collective.ipynb", monkeypatch)
    assert "equal to NumPy's rank-order sum, bit for bit, on every rank" in out["simulate"], out["simulate"]
    differs = re.search(r"ring all-reduce: (\d+) of 2000 elements differ", out["simulate"])
    assert differs and int(differs.group(1)) > 0, out["simulate"]
    for protocol in ("SIMPLE", "LL128", "LL"):  # the steps cell ran every protocol at every size
        assert re.search(rf"{protocol}: 512 floats \d+ steps, .*4096 floats \d+ steps", out["steps"]), out["steps"]
    diagnosis = out["planted-deadlock"]
    assert "The simulator's diagnosis (WaitTimeoutError)" in diagnosis, diagnosis
    # The cycle of credit waits: each rank waits on its right neighbour.
    for rank in range(4):
        assert re.search(rf"wait on rank {rank} gave up .* waited for flow credit .* from peer rank {(rank + 1) % 4}",
                         diagnosis), diagnosis


@pytest.mark.parametrize("name, cell", [("rmsnorm_fused.ipynb", "half-precision"), ("flow_collective.ipynb", "steps")])
def test_each_notebook_draws_a_plot_on_a_cpu(name, cell):
    """A plot from the simulator, in the committed outputs (which the runner made on a CPU)."""
    code = {c.id: c for c in _read(name).cells if c.cell_type == "code"}
    assert not code[cell].source.startswith("# GPU\n")
    assert any("image/png" in o.get("data", {}) for o in code[cell].outputs), f"{name}: {cell} drew no plot"


def test_gpu_cells_are_marked():
    assert _gpu_cells(_read("rmsnorm_fused.ipynb")) == ["gpu-run", "gpu-plot"]
    assert _gpu_cells(_read("flow_collective.ipynb")) == []


@pytest.mark.parametrize("name", ["rmsnorm_fused.ipynb", "flow_collective.ipynb"])
def test_committed_notebooks_hold_their_outputs(name):
    """The committed notebooks were executed from top to bottom (scripts/run_notebooks.py) and hold no error."""
    code = [c for c in _read(name).cells if c.cell_type == "code"]
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{name}: run python scripts/run_notebooks.py ({counts})"
    assert not [c.id for c in code if any(o.output_type == "error" for o in c.outputs)], name
    assert all(c.outputs for c in code if c.id in ("simulate", "planted-bug", "planted-deadlock")), name


def _rows_of(comm, line_up=None):  # a benchmark as a notebook defines one
    return [{"rank": comm.rank}]


def test_the_gpu_cells_script_holds_the_definitions_and_the_call(capsys):
    """The notebook's GPU cell calls ``flowdsl.testing.run_on_gpus``: its script carries the definitions (a
    kernel's whole cell, functions' own source) and evaluates the call on every rank; without a GPU it says so
    and returns None."""
    from flowdsl.testing import gpu_script, run_on_gpus

    script = gpu_script(_rows_of, call="_rows_of(comm, line_up=barrier)", cells=[run_on_gpus])
    assert "def _rows_of(comm, line_up=None):" in script and "result = _rows_of(comm, line_up=barrier)" in script
    assert "def run_on_gpus(" in script and "def gpu_script(" in script  # a cell: its whole file here
    compile(script, "run.py", "exec")  # a script Python takes
    assert run_on_gpus(_rows_of, call="_rows_of(comm)") is None
    assert capsys.readouterr().out.startswith("No GPU here: skipping the GPU cells")
