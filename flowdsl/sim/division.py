"""Division by zero in simulated kernel code, as numba-cuda compiles it: its error model, not Python's.

numba-cuda compiles a kernel with NumPy's error model, or with Python's when the kernel is made with
``debug=True`` (``numba.cuda.compiler``: ``flags.error_model``). Under NumPy's a division by zero goes on: a
float gives inf or NaN, an integer ``//`` or ``%`` gives 0. Under Python's it raises ``ZeroDivisionError``
with numba's message ("division by zero", "integer division by zero", "modulo by zero", "integer modulo by
zero"), whatever the operands' types. Run as Python, the same code would raise for Python ints and floats
(a thread index, a literal) and go on for NumPy scalars (an array's elements) in either mode: so the
simulator runs each kernel's and device function's ``/``, ``//`` and ``%`` (and ``/=``, ``//=``, ``%=``)
through :func:`model`'s functions, rewriting the function's source once. Device functions keep NumPy's
model, as numba-cuda compiles them with their own options (``debug`` off). Half precision
(``float16``, numba-cuda's ``__hdiv``) has no zero check in either model; complex division is left to Python
and NumPy. A function whose source is not at hand (made by ``exec``) runs as Python runs it.
"""

from __future__ import annotations

import ast
import inspect
import operator
import textwrap
import types

import numpy as np

__all__ = ["code_with_model", "model", "NAMES"]

#: The names the rewritten code calls, each bound in the function's simulated globals (:func:`model`).
NAMES = {ast.Div: "__flowdsl_truediv__", ast.FloorDiv: "__flowdsl_floordiv__", ast.Mod: "__flowdsl_mod__"}

_INTEGRAL = (int, np.integer)  # bool is an int
_MODELLED = (int, float, np.integer, np.floating)


def _integral(v) -> bool:
    return isinstance(v, (*_INTEGRAL, np.bool_))


def _numpy_model(op, a, b):
    """``a op b`` for a zero ``b`` under NumPy's error model: inf or NaN for floats, 0 for integer ``//`` and
    ``%``, in the type numba gives (Python operands: computed as NumPy's 64-bit types, returned as Python's)."""
    with np.errstate(all="ignore"):
        if isinstance(a, np.generic) or isinstance(b, np.generic):
            return op(a, b)
        if _integral(a) and _integral(b):
            return float(op(np.float64(a), np.float64(b))) if op is operator.truediv else 0
        return float(op(np.float64(a), np.float64(b)))


def _divide(op, float_message, int_message, raising):
    def divide(a, b):
        if b == 0 and isinstance(b, _MODELLED) and isinstance(a, _MODELLED) and \
                not isinstance(a, np.float16) and not isinstance(b, np.float16):
            if raising:
                raise ZeroDivisionError(int_message if _integral(a) and _integral(b) else float_message)
            return _numpy_model(op, a, b)
        return op(a, b)
    return divide


def model(debug: bool) -> dict:
    """``{name: function}`` for the rewritten code's globals: Python's error model (``debug``) or NumPy's."""
    return {NAMES[ast.Div]: _divide(operator.truediv, "division by zero", "division by zero", debug),
            NAMES[ast.FloorDiv]: _divide(operator.floordiv, "division by zero", "integer division by zero", debug),
            NAMES[ast.Mod]: _divide(operator.mod, "modulo by zero", "integer modulo by zero", debug)}


class _Rewrite(ast.NodeTransformer):
    """``a / b`` -> ``__flowdsl_truediv__(a, b)`` (and ``//``, ``%``); ``t /= b`` -> ``t = ...(t, b)``, a
    subscript's or attribute's object and index evaluated once, as the augmented assignment does."""

    def __init__(self):
        self.temps = 0

    def visit_BinOp(self, node):
        self.generic_visit(node)
        name = NAMES.get(type(node.op))
        if name is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], []), node)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        name = NAMES.get(type(node.op))
        if name is None:
            return node
        target = node.target
        before = []
        if isinstance(target, ast.Subscript):
            obj, idx = self._temp(), self._temp()
            before = [ast.Assign([ast.Name(obj, ast.Store())], target.value),
                      ast.Assign([ast.Name(idx, ast.Store())], target.slice)]
            load = ast.Subscript(ast.Name(obj, ast.Load()), ast.Name(idx, ast.Load()), ast.Load())
            store = ast.Subscript(ast.Name(obj, ast.Load()), ast.Name(idx, ast.Load()), ast.Store())
        elif isinstance(target, ast.Attribute):
            obj = self._temp()
            before = [ast.Assign([ast.Name(obj, ast.Store())], target.value)]
            load = ast.Attribute(ast.Name(obj, ast.Load()), target.attr, ast.Load())
            store = ast.Attribute(ast.Name(obj, ast.Load()), target.attr, ast.Store())
        else:
            load, store = ast.Name(target.id, ast.Load()), ast.Name(target.id, ast.Store())
        call = ast.Call(ast.Name(name, ast.Load()), [load, node.value], [])
        out = [*before, ast.Assign([store], call)]
        for statement in out:
            ast.copy_location(statement, node)
            ast.fix_missing_locations(statement)
        return out

    def _temp(self) -> str:
        self.temps += 1
        return f"__flowdsl_division_{self.temps}__"


_CODES: dict = {}  # id(code) -> (code, rewritten code or None): one rewrite per function in a process


def code_with_model(fn: types.FunctionType) -> types.CodeType | None:
    """``fn``'s code with its ``/``, ``//`` and ``%`` calling :data:`NAMES` (bind them with :func:`model`), or
    None where it has none or its source is not at hand (then it runs as it is)."""
    hit = _CODES.get(id(fn.__code__))
    if hit is not None and hit[0] is fn.__code__:
        return hit[1]
    rewritten = _rewritten(fn)
    _CODES[id(fn.__code__)] = (fn.__code__, rewritten)
    return rewritten


def _rewritten(fn):
    code = fn.__code__
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    if not tree.body or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != code.co_name:
        return None  # a lambda, or a source that is not this function's definition
    if not any(isinstance(n, (ast.BinOp, ast.AugAssign)) and type(n.op) in NAMES for n in ast.walk(tree)):
        return None
    fdef = tree.body[0]
    fdef.decorator_list = []  # the function itself; its decorators made the kernel being simulated
    _Rewrite().visit(fdef)
    # The free variables become an enclosing function's locals, so that the compiled code takes the
    # original closure's cells, in the same order.
    outer = ast.FunctionDef(
        name="__flowdsl_enclosing__", args=ast.arguments([], [], None, [], [], None, []),
        body=[*(ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in code.co_freevars), fdef,
              ast.Return(ast.Name(fdef.name, ast.Load()))], decorator_list=[])
    module = ast.Module([outer], [])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, code.co_firstlineno - 1)  # the source starts at the code's first line
    try:
        compiled = compile(module, code.co_filename, "exec")
    except (SyntaxError, ValueError):
        return None
    enclosing = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    new = next((c for c in enclosing.co_consts if isinstance(c, types.CodeType) and c.co_name == code.co_name), None)
    if new is None or new.co_freevars != code.co_freevars:
        return None
    return new.replace(co_qualname=code.co_qualname)
