"""Module docstrings say what a module is for; they keep no hand-written list of its contents.

The API reference lists each module's members from its ``__all__``; a "Contents:" paragraph
beside it drifts (it had, in 13 modules).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import flowdsl

pytestmark = pytest.mark.compile

PACKAGE = Path(flowdsl.__file__).parent

def test_no_module_docstring_lists_its_contents():
    listed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "Contents:" in doc:
            listed.append(rel)
    assert listed == [], f"drop the 'Contents:' paragraph of {listed}: the API reference lists __all__"
