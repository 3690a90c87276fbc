"""The test tree shadows no package: a folder of tests named after one (``tests/torch``) is a namespace package of
that name wherever ``tests/`` lands on ``sys.path`` (pytest-xdist's workers), so ``import torch`` found it without
PyTorch installed, and ``pytest.importorskip`` did not skip."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_folder_is_named_after_an_importable_package():
    packages = set(sys.stdlib_module_names) | set(metadata.packages_distributions()) | {
        "torch", "numba", "cupy", "nccl", "cuda", "numpy", "greenlet", "flowdsl", "triton"}
    folders = {p.name for p in TESTS.rglob("*") if p.is_dir() and not p.name.startswith((".", "__"))}
    assert not folders & packages, f"test folders named after packages: {sorted(folders & packages)}; rename them"
