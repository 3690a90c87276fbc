"""The simulator's side of every primitive's spec (:mod:`flowdsl._spec`): argument values checked by kind.

A primitive's implementation calls :func:`check` with the stub's name, the operation's words for the
error and its arguments in the stub's order. Each argument the spec names is checked by its kind
(:data:`KIND_CHECKS`: whether a value is of that kind; the GIN module adds its own), and errors read
"Cannot ``op``: ``name`` ``value`` is not ``what``. ``fix``", the same ``what`` the GPU's typing
errors use. Omitted optional arguments are not checked; checks of value (ranges, ids, which rank's
window) stay with each implementation.
"""

from __future__ import annotations

import inspect

from .._spec import spec_of
from .coop import Coop
from .errors import UsageError
from .memory import Window
from .scheduler import sim_error
from .team import Team

__all__ = ["check", "KIND_CHECKS"]

#: Argument kind -> whether a value is of that kind.
KIND_CHECKS = {
    "comm": lambda v: hasattr(getattr(v, "group", None), "inbox"),
    "coop": lambda v: isinstance(v, Coop),
    "window": lambda v: isinstance(v, Window),
    "team": lambda v: isinstance(v, Team),
}


def check(name: str, op: str, *values) -> None:
    """Check the values of primitive ``name``'s arguments against its spec (see the module's doc)."""
    spec = spec_of(name)
    for param, value in zip(spec.params, values):
        arg = spec.args.get(param.name)
        if arg is None or arg.kind not in KIND_CHECKS or (value is None and param.default is not inspect.Parameter.empty):
            continue
        if not KIND_CHECKS[arg.kind](value):
            raise sim_error(UsageError, f"Cannot {op}: {param.name} {value!r} is not {arg.what}. {arg.fix}")
