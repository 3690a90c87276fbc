"""Layers stay layers: every import of the package, read from the source (function-level ones too).

The simulator (``sim/``) runs what the GPU path runs without its runtime or compiler, so it imports
neither ``runtime/`` nor ``lowering/``: what both host sides need lives in ``host/`` (checks, what
``stream=`` means, the wait limit), which imports neither side. The compiler's layer (``lowering/``)
knows nothing of the runtime or the simulator, and the runtime nothing of the simulator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import flowdsl

pytestmark = pytest.mark.compile

PACKAGE = Path(flowdsl.__file__).parent

#: layer -> the layers it may not import.
FORBIDDEN = {
    "sim": ("runtime", "lowering"),
    "host": ("runtime", "lowering", "sim", "collectives"),
    "lowering": ("runtime", "sim", "collectives"),
    "runtime": ("sim", "collectives"),
}


def _imports(path: Path):
    """(imported module, line) of every import in ``path``, relative ones resolved."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, [base, node.module]))
            yield module, node.lineno
            for alias in node.names:  # `from .. import runtime` names a module too
                yield f"{module}.{alias.name}", node.lineno


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "flowdsl" else None


def test_no_layer_imports_one_it_may_not():
    crossings = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for module, line in _imports(path):
                if _layer(module) in forbidden:
                    crossings.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert crossings == [], "layers crossed:\n" + "\n".join(crossings)


def test_the_walk_sees_relative_imports():
    """The check above would pass on a walk that resolved nothing: here it must find known imports."""
    found = {module for module, _ in _imports(PACKAGE / "sim" / "host.py")}
    assert "flowdsl.host.checks" in found and "flowdsl.errors" in found
    found = {module for module, _ in _imports(PACKAGE / "runtime" / "communicator.py")}
    assert "flowdsl.runtime.nccl" in found and "flowdsl.host.streams" in found


def test_every_argument_kind_is_registered_once_by_each_layer():
    """Each kind a spec names is known to the GPU's typing and to the simulator, through their
    registries (a module registering a kind twice, or an unknown one, raises at import)."""
    import flowdsl._spec as spec
    import flowdsl.sim  # noqa: F401 - registers the simulator's kinds
    from flowdsl import cft, gin, lsa  # noqa: F401 - the stubs of every kind
    from flowdsl._stubs import PRIMITIVES
    from flowdsl.lowering import cft as _cft, gin as _gin  # noqa: F401 - register their kinds
    from flowdsl.lowering.checks import KIND_TYPES
    from flowdsl.sim.checks import KIND_CHECKS

    named = {arg.kind for name in PRIMITIVES for arg in spec.spec_of(name).args.values()}
    assert named <= set(spec.KINDS)
    assert set(KIND_TYPES.kinds()) == set(spec.KINDS) and set(KIND_CHECKS.kinds()) == set(spec.KINDS)
    with pytest.raises(flowdsl.FlowDSLError, match="Cannot register argument kind 'coop' for the simulator twice"):
        KIND_CHECKS.register("coop", lambda v: True)
