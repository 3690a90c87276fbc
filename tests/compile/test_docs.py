"""The docs tell the truth: the API page is generated from the code, and the README's example runs."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import numpy as np
import pytest

import flowdsl

pytestmark = pytest.mark.compile
ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_resolves():
    for name in flowdsl.__all__:
        assert getattr(flowdsl, name) is not None, name


def test_api_page_is_generated_from_the_code():
    render = runpy.run_path(str(ROOT / "scripts" / "gen_api_docs.py"))["render"]
    assert (ROOT / "docs" / "api.md").read_text() == render(), "docs/api.md is stale: python scripts/gen_api_docs.py"


@pytest.mark.sim
def test_readme_example_runs_on_the_simulator():
    import flowdsl.sim

    block = re.search(r"## A kernel\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    results = flowdsl.sim.spawn(namespace["main"], nranks=3, seed=1)
    expected = np.repeat(np.arange(3, dtype=np.float32), 1024)
    for result in results:
        np.testing.assert_array_equal(result, expected)


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


@pytest.mark.sim
def test_notebook_code_cells_run():
    import json

    notebook = json.loads((ROOT / "notebooks" / "rmsnorm_fused.ipynb").read_text())
    namespace: dict = {}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), "rmsnorm_fused.ipynb", "exec"), namespace)  # noqa: S102
