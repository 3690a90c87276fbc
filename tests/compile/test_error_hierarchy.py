"""Every exception flowdsl defines or raises derives from ``flowdsl.FlowDSLError``.

The classes are found by importing every module of the package; the raises by reading every
module's source, so that a bare ``raise RuntimeError(...)`` cannot slip in.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path

import pytest

import flowdsl
from flowdsl import FlowDSLError

pytestmark = pytest.mark.compile

PACKAGE = Path(flowdsl.__file__).parent

#: Built-in exceptions a module may still raise, and why: (module path, exception) -> reason.
ALLOWED_BUILTIN_RAISES = {
    ("flowdsl/__init__.py", "AttributeError"): "module __getattr__ protocol",
    ("flowdsl/errors.py", "AttributeError"): "module __getattr__ protocol",
    ("flowdsl/flow.py", "AttributeError"): "module __getattr__ protocol (flow.kernel)",
    ("flowdsl/gin.py", "AttributeError"): "module __getattr__ protocol (gin.barrier, renamed by team)",
    ("flowdsl/lowering/backend.py", "AttributeError"): "module __getattr__ protocol",
    ("flowdsl/sim/races.py", "AttributeError"): "__getattr__ protocol (a record array's fields by name)",
    ("flowdsl/sim/host.py", "AttributeError"): "__getattr__ protocol (a simulated kernel code's private names)",
    ("flowdsl/sim/division.py", "ZeroDivisionError"): "the user kernel's own exception, as numba-cuda raises it "
                                                      "under debug=True (not a refusal of flowdsl's)",
    ("flowdsl/_launch_params.py", "AssertionError"): "an internal invariant (a packer exists for every packed type)",
    ("flowdsl/collectives/check.py", "AssertionError"): "compare() is an assertion helper for tests, as numpy.testing",
    ("flowdsl/runtime/memory.py", "NotImplementedError"): "an abstract method, overridden by every resource",
    # Left to the restructuring of lowering/ and sim/ (issue 15):
    ("flowdsl/lowering/externs.py", "KeyError"): "a table lookup, to become a UsageError",
    ("flowdsl/sim/host.py", "TypeError"): "to become a sim UsageError",
}

_BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                       if isinstance(value, type) and issubclass(value, BaseException)}


#: Modules for PyTorch users, importable only where torch is installed (the CI venv of tests/with_torch has it).
_NEED_TORCH = ("flowdsl.torch", "flowdsl.examples.tp_mlp")


def _modules():
    names = ["flowdsl"]
    has_torch = importlib.util.find_spec("torch") is not None
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="flowdsl."):
        if info.name != "flowdsl.__main__" and (has_torch or info.name not in _NEED_TORCH):
            names.append(info.name)
    return names


def test_every_exception_class_defined_in_flowdsl_derives_from_flowdsl_error():
    defined = {}
    for name in _modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__.startswith("flowdsl") and not issubclass(value, Warning)):
                defined[f"{value.__module__}.{value.__qualname__}"] = value
    assert len(defined) > 20, sorted(defined)  # the walk reached the simulator's and the runtime's errors
    stray = sorted(name for name, cls in defined.items() if not issubclass(cls, FlowDSLError))
    assert stray == [], f"exception classes that do not derive from FlowDSLError: {stray}"


def test_typing_errors_keep_numbas_base():
    from numba.core.errors import NumbaTypeError

    from flowdsl.lowering.target import FeatureUnavailableError

    assert issubclass(FeatureUnavailableError, NumbaTypeError) and issubclass(FeatureUnavailableError, FlowDSLError)
    assert issubclass(flowdsl.DeviceOnlyError, RuntimeError) and issubclass(flowdsl.DeviceOnlyError, FlowDSLError)


def _builtin_raises(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in _BUILTIN_EXCEPTIONS:
                yield target.id, node.lineno


def test_flowdsl_raises_no_bare_builtin_exception():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for name, line in _builtin_raises(path):
            if (rel, name) not in ALLOWED_BUILTIN_RAISES:
                found.append(f"{rel}:{line}: raise {name}")
    assert found == [], ("raise a flowdsl error (flowdsl/errors.py: UsageError is also a ValueError, "
                         f"the others RuntimeErrors) instead of: {found}")


def test_a_device_primitive_called_on_the_host_is_a_flowdsl_error():
    with pytest.raises(FlowDSLError, match="device"):
        flowdsl.lsa.barrier(None, None, 0)
