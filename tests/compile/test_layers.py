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


def _package_edges(function_level: bool):
    """{module: modules of the package it imports}: those it imports when it is imported, or (``function_level``)
    those its functions import too."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo, found = list(ast.parse(path.read_text()).body), set()
        while todo:
            node = todo.pop()
            if not function_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            todo.extend(ast.iter_child_nodes(node))
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
                module = ".".join(filter(None, [base, node.module]))
                subs = {f"{module}.{a.name}" for a in node.names} & set(modules)
                found |= subs or {module}  # `from . import lsa` imports flowdsl.lsa, not flowdsl's __init__ again
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def _cycles(edges):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_when_modules_are_imported():
    """Importing any module of the package never comes back to a module still being imported."""
    edges = _package_edges(function_level=False)
    assert edges["flowdsl.lowering.lsa"] >= {"flowdsl.lsa", "flowdsl.lowering.types"}  # the walk sees imports
    assert _cycles(edges) == []
    assert _cycles({**edges, "flowdsl.errors": {"flowdsl.lowering.lsa"}}) != []  # and would see a cycle


#: The one import allowed to close a cycle (from inside a function, at first use), and why.
CYCLE_ALLOWED = {
    ("flowdsl.flow", "flowdsl"): "flow.kernel is flowdsl.kernel: the DSL's namespace offers the kernel decorator, "
                                 "whose compiler lowers flowdsl.flow",
}


def test_no_import_cycle_even_through_imports_in_functions():
    """A lower layer reaches a higher one only through what the higher one installs (a device function's
    dispatcher API, the binder of device functions), never by importing it, even at first use."""
    edges = _package_edges(function_level=True)
    assert set(CYCLE_ALLOWED) <= {(a, b) for a, bs in edges.items() for b in bs}, "an allowed import is gone"
    for a, b in CYCLE_ALLOWED:
        edges[a].discard(b)
    assert _cycles(edges) == []
