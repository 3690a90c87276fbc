"""The docs tell the truth: the API reference covers every public name, and every Python block of
README.md and docs/*.md runs as written.

A block runs in a fresh namespace (on the simulator, where it launches kernels). A block that
defines pytest tests (``def test_...``) is run by pytest in a directory outside the repository,
as a user's test file would be, with warnings as errors. A block that needs a GPU is listed in
:data:`NEEDS_A_GPU` with the reason; it runs in ``test_gpu_block_runs`` where there is a GPU.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import flowdsl

pytestmark = pytest.mark.compile
ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Blocks that cannot run without a GPU (or torchrun), by id, each with why. Nothing else is skipped.
NEEDS_A_GPU = {
    # torch.cuda.graph capture needs a CUDA device (and torch).
    "docs/collectives.md § Streams and CUDA graphs #1": "torch CUDA-graph capture needs a GPU",
    "README.md § In a model #1": "a tensor-parallel layer on CUDA tensors",
    "docs/torch.md § In a PyTorch model #1": "CUDA tensors on flowdsl.init()'s GPU",
}


def python_blocks() -> dict[str, str]:
    """``{id: source}`` of every fenced ``python`` block; the id is ``file § heading #n``."""
    blocks = {}
    for path in DOC_FILES:
        heading, count, block, in_fence = "", 0, None, False
        for line in path.read_text().splitlines(keepends=True):
            if block is not None:
                if line.startswith("```"):
                    blocks[f"{path.relative_to(ROOT)} § {heading} #{count}"] = "".join(block)
                    block = None
                else:
                    block.append(line)
            elif line.startswith("```"):
                in_fence = not in_fence
                if in_fence and line.strip() == "```python":
                    count, block, in_fence = count + 1, [], False
            elif not in_fence and line.startswith("#"):
                heading, count = line.lstrip("#").strip(), 0
    return blocks


BLOCKS = python_blocks()


def test_every_public_name_resolves():
    for name in flowdsl.__all__:
        assert getattr(flowdsl, name) is not None, name


def test_import_flowdsl_reaches_the_submodules_lazily():
    """``import flowdsl`` is enough for ``flowdsl.sim`` etc., and does not import them itself."""
    code = ("import sys, flowdsl; lazy = ('flowdsl.sim', 'flowdsl.collectives', 'flowdsl.testing'); "
            "assert not [m for m in lazy if m in sys.modules], [m for m in lazy if m in sys.modules]; "
            "assert flowdsl.sim.spawn and flowdsl.collectives.all_reduce and flowdsl.testing.run_ranks; "
            "from flowdsl import flow; assert flow.kernel is flowdsl.kernel and flow.device is flowdsl.device; "
            "assert {'sim', 'collectives', 'testing', 'flow'} <= set(dir(flowdsl))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        flowdsl.nonexistent  # noqa: B018


def _reference_pages() -> dict[str, str]:
    """``{identifier: page}`` of every ``::: identifier`` in docs/reference/ (the site renders them)."""
    return {match.group(1): page.name for page in sorted((ROOT / "docs" / "reference").glob("*.md"))
            for match in re.finditer(r"^::: (\S+)", page.read_text(), re.M)}


def test_the_api_reference_covers_every_public_name():
    """Every module of ``flowdsl.__all__`` (and enums, errors) has a reference page linked from docs/api.md
    and the site's nav; every other public name is on the flowdsl page or on its module's page."""
    pages = _reference_pages()
    modules = [f"flowdsl.{name}" for name in flowdsl.__all__ if inspect.ismodule(getattr(flowdsl, name))]
    modules += ["flowdsl.enums", "flowdsl.errors"]
    api, nav = (ROOT / "docs" / "api.md").read_text(), (ROOT / "mkdocs.yml").read_text()
    for module in modules:
        assert module in pages, f"{module} has no reference page: add docs/reference/<name>.md with '::: {module}'"
        assert f"(reference/{pages[module]})" in api, f"docs/api.md does not link reference/{pages[module]}"
        assert f"reference/{pages[module]}" in nav, f"mkdocs.yml's nav lacks reference/{pages[module]}"
    on_top_page = re.search(r"members: \[(.*)\]", (ROOT / "docs" / "reference" / "flowdsl.md").read_text()).group(1)
    on_top_page = {name.strip() for name in on_top_page.split(",")}
    for name in set(flowdsl.__all__) - {"__version__"}:
        obj = getattr(flowdsl, name)
        if inspect.ismodule(obj):
            continue
        documented_by = [m for m in modules if name in getattr(importlib.import_module(m), "__all__", ())]
        assert name in on_top_page or documented_by, (
            f"flowdsl.{name} is on no reference page: add it to the members of docs/reference/flowdsl.md")


def test_the_communicators_are_in_the_reference():
    pages = _reference_pages()
    assert "flowdsl.sim.host.SimComm" in pages  # the simulator's communicator: what main(comm) gets there
    assert "Communicator" in (ROOT / "docs" / "reference" / "flowdsl.md").read_text()


def test_the_gpu_list_names_blocks_that_exist():
    stale = sorted(set(NEEDS_A_GPU) - set(BLOCKS))
    assert not stale, f"NEEDS_A_GPU names blocks no page has (renamed heading?): {stale}. Known: {sorted(BLOCKS)}"


def _run_block(block_id: str, source: str, tmp_path: Path) -> None:
    if re.search(r"^def test_", source, re.M):
        test_file = tmp_path / "test_from_docs.py"
        test_file.write_text(source)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider",
                               str(test_file)], capture_output=True, text=True, cwd=tmp_path, env=_env())
        assert proc.returncode == 0, f"{block_id}: pytest failed on it:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
        return
    namespace = {"__name__": "__docs__"}
    try:
        exec(compile(source, block_id, "exec"), namespace)  # noqa: S102 - our own docs
    except Exception as exc:
        exc.add_note(f"{block_id} does not run as written. Fix the block (a runnable program, small sizes on "
                     "the simulator), or, if it needs a GPU, list it in NEEDS_A_GPU with the reason.")
        raise


def _env() -> dict:
    """This environment, with the repository first on the import path (as an installed flowdsl would be)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.mark.sim
@pytest.mark.parametrize("block_id", [b for b in BLOCKS if b not in NEEDS_A_GPU])
def test_block_runs_as_written(block_id, tmp_path, monkeypatch):
    if re.search(r"^import torch", BLOCKS[block_id], re.M):
        pytest.importorskip("torch", reason=f"{block_id} needs PyTorch (pip install -e '.[test,torch]'; CI runs "
                                            "it in the venv of tests/with_torch)")
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    _run_block(block_id, BLOCKS[block_id], tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("block_id", sorted(NEEDS_A_GPU))
def test_gpu_block_runs(block_id, tmp_path, monkeypatch):
    if "import torch" in BLOCKS[block_id]:
        pytest.importorskip("torch", reason=f"{block_id} needs torch (pip install 'flowdsl[torch]')")
    monkeypatch.chdir(tmp_path)
    _run_block(block_id, BLOCKS[block_id], tmp_path)


@pytest.mark.sim
@pytest.mark.parametrize("nranks,nodes", [(1, 1), (4, 1), (4, 2)])
def test_flow_guide_example_runs_on_the_simulator(nranks, nodes):
    import flowdsl.sim

    text = (ROOT / "docs" / "flow.md").read_text()
    block = re.search(r"## A worked example[^\n]*\n.*?```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "docs/flow.md", "exec"), namespace)  # noqa: S102 - our own docs
    results = flowdsl.sim.spawn(namespace["main"], nranks=nranks, nodes=nodes, seed=nranks,
                                gin_delivery="reordered" if nodes > 1 else "ordered")
    assert results == [True] * nranks


def test_the_guides_multimem_table_is_flowdsl_mems():
    """docs/index.md's table of multimem forms says what flowdsl/mem.py's table (PTX's) says, row by row."""
    from flowdsl import mem
    from flowdsl._spec import VECTOR_ELEMENTS

    def ops(table, dtype):
        return ", ".join(op.name for op in table[dtype]) if dtype in table else "—"

    rows = [f"| {'bfloat16 (uint16 bits)' if d == 'uint16' else d} | {ops(mem.MULTIMEM_SCALAR_OPS, d)} | "
            f"{ops(mem.MULTIMEM_VECTOR_OPS, d)} | {'yes' if d in mem.MULTIMEM_STORE_ELEMENTS else '—'} | "
            f"{'yes' if d in mem.MULTIMEM_STORE_VECTOR_ELEMENTS else '—'} |" for d in VECTOR_ELEMENTS]
    guide = (ROOT / "docs" / "index.md").read_text()
    table = guide[guide.index("| elements | `multimem_ld_reduce`"):].split("\n\n", 1)[0].splitlines()[2:]
    assert table == rows
