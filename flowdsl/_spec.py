"""What a primitive asks of its arguments, written once beside its stub and read by every layer.

A primitive's stub (``flowdsl/lsa.py`` ...) declares, in ``@primitive(...)``, the kind of each
argument that is checked (:class:`Arg`), the support-library function it calls (``extern``, the
C name stem; a coop primitive adds ``__<coop kind>``), that function's C signature (``c=``, a
:class:`CFunction`: its row of the extern table, declared once, by the first stub that calls it)
and the target it needs (:class:`Gate`).
Its defaults are the stub's own. From that one :class:`Spec`:

* the numba typing checks each argument's type (``flowdsl/lowering/checks.py``: "``op`` requires
  ``what``, got ``type``") and gates the target (``flowdsl.lowering.target.require``);
* the lowering names the C function it calls (``flowdsl.lowering.declarations.extern``);
* the extern table (``flowdsl/lowering/externs.py``: ``EXTERNS``, and the C headers generated from
  it) gathers each spec's :class:`CFunction` rows, each row's oldest NCCL, archs and CUDA those of
  the spec's gate;
* the simulator checks each argument's value (``flowdsl/sim/checks.py``), with the same words
  followed by the fix (:meth:`Spec.refusal`: "``name`` requires ``what``, got ``type``");
* a primitive that is one C call (``returns=`` set: :data:`RESULTS`) is lowered from the spec alone
  (``flowdsl/lowering/generic.py``): each argument crosses the C ABI as its kind says, the result
  comes back as ``returns`` says.

An argument may narrow its kind: the element types an array may have (``dtypes``), the members an
enum argument may be (``choices``) and whether it must be a compile-time constant (``constant``,
which only the GPU's typing can tell). Both layers refuse the first two with
:meth:`Spec.refusal_dtype` and :meth:`Spec.refusal_choice`.

No numba here: the simulator and ``import flowdsl`` read specs too.
"""

from __future__ import annotations

import enum
import inspect
import sys
from dataclasses import dataclass, field, replace

from .enums import MemoryOrder, RedOp, ThreadScope
from .errors import FlowDSLError

__all__ = ["Arg", "Gate", "Spec", "CFunction", "C_COMM", "C_WIN", "C_TEAM", "SPECS", "spec_of", "ALL_ARCHS",
           "COMM", "COOP", "WINDOW", "TEAM", "TEAMS", "INT", "ORDER", "ARRAY", "SHARED_ARRAY",
           "LSA_SESSION", "GIN_CONTEXT", "REMOTE", "LOCAL", "CFT_SESSION", "CFT_BARRIER_SESSION", "ENUM", "NAMED_KINDS",
           "SCOPE", "CONSTANT_ORDER", "FENCE_ORDER", "RED_OP", "MULTIMEM_VIEW", "MULTIMEM_OP", "MULTIMEM_GATE", "RESULTS", "MEM_ARRAY", "INTEGER_ELEMENTS", "ARITHMETIC_ELEMENTS", "VECTOR_ELEMENTS",
           "NUMPY_ALLOCATING", "numpy_allocation_refusal", "numpy_allocation_allowed"]

#: Targets the support library is built for, oldest first.
ALL_ARCHS = ("sm_80", "sm_90", "sm_100")


@dataclass(frozen=True)
class Arg:
    """One checked argument: its kind (a key both layers know), how errors name it, and the fix.

    Attributes:
        kind: ``"comm"``, ``"coop"``, ``"window"``, ``"team"``, ``"int"``, ``"order"``, ``"array"``, ...
        what: The phrase errors use ("a device communicator").
        fix: What the simulator's error tells the user to pass instead.
        dtypes: The element types an array may have (NumPy names, as numba names them too); empty: any.
        choices: The enum members the argument may be; empty: any.
        constant: Whether the GPU needs the value when it compiles (a literal such as
            ``ThreadScope.DEVICE``, not a run-time variable).
    """

    kind: str
    what: str
    fix: str = ""
    dtypes: tuple[str, ...] = ()
    choices: tuple = ()
    constant: bool = False

    def but(self, what: str | None = None, fix: str | None = None, **narrowed) -> "Arg":
        """This kind, named or narrowed differently for one argument (``WINDOW.but("a source window")``,
        ``ARRAY.but(dtypes=("int32",))``)."""
        return replace(self, what=self.what if what is None else what, fix=self.fix if fix is None else fix,
                       **narrowed)


COMM = Arg("comm", "a device communicator", "Pass the DevComm from comm.device_communicator()")
COOP = Arg("coop", "a coop (flowdsl.coop.cta(), .warp(), ...)", "Pass flowdsl.coop.cta(), .warp(), ...")
WINDOW = Arg("window", "a window (from comm.register(buf))", "Pass a window from comm.register()")
TEAM = Arg("team", "a team", "Pass flowdsl.team.world(comm), team.lsa(comm) or team.rail(comm)")
TEAMS = TEAM.but("teams")
#: An integer; errors read "``name`` to be an integer".
INT = Arg("int", "an integer", "Pass an integer")
ORDER = Arg("order", "a flowdsl.MemoryOrder", "Pass a flowdsl.MemoryOrder")
ARRAY = Arg("array", "an array", "Pass an array (a window view, cuda.shared.array or cuda.local.array)")
SHARED_ARRAY = Arg("shared_array", "a shared-memory array (a cuda.shared.array)", "Pass a cuda.shared.array")
LSA_SESSION = Arg("lsa_session", "a barrier session (from flowdsl.lsa.barrier)",
                  "Open one with flowdsl.lsa.barrier(comm, coop, index)")
GIN_CONTEXT = Arg("gin_context", "a GIN context", "Make one with flowdsl.gin.context(comm, index)")
REMOTE = Arg("remote", "a signal action (flowdsl.gin.strong_signal_inc(id), ...)",
             "Pass flowdsl.gin.strong_signal_inc(id) or another signal action")
LOCAL = Arg("local", "local=flowdsl.gin.counter_inc(counter)", "Pass flowdsl.gin.counter_inc(id)")
CFT_SESSION = Arg("cft_session", "a CFT session (flowdsl.cft.session(comm, coop, storage))",
                  "Open one with flowdsl.cft.session(comm, coop, storage)")
CFT_BARRIER_SESSION = Arg("cft_barrier_session", "a CFT barrier session (from flowdsl.cft.barrier)",
                          "Open one with flowdsl.cft.barrier(comm, coop, index)")
#: A flowdsl enum member or an int (``ENUM.but("a flowdsl.cft.MemProxyType")``).
ENUM = Arg("enum", "an enum member", "Pass one of its members")
#: A reduction operator: a run-time value, or a constant that the GPU compiles in (so its range is not
#: a typing check: numba retries a refused constant as a run-time value).
RED_OP = ENUM.but("a flowdsl.RedOp", "Pass flowdsl.RedOp.SUM, PROD, MAX, MIN, AVG or PREMULSUM")
#: A number of 4 or 8 bytes (a warp shuffle's and a coop broadcast's operand).
WORD = Arg("word", "a number of 4 or 8 bytes (int32, uint32, int64, uint64, float32 or float64)",
           "Pass a value of one of those types")
#: A multimem view: the multicast address of an LSA team's window (NVLink SHARP), which only
#: ``flowdsl.mem``'s multimem operations take (a plain load or store of it is undefined in PTX).
MULTIMEM_VIEW = Arg("multimem", "a multimem view (from flowdsl.lsa.multimem_view)",
                    "Make one with flowdsl.lsa.multimem_view(comm, win) on a device communicator made with "
                    "lsa_multimem=True")
#: The reductions PTX's multimem.ld_reduce and multimem.red have for arithmetic (which element types take
#: which is :func:`flowdsl.mem.multimem_refusal`), chosen when the kernel compiles.
MULTIMEM_OP = RED_OP.but(fix="Pass flowdsl.RedOp.SUM, MAX or MIN", choices=(RedOp.SUM, RedOp.MAX, RedOp.MIN),
                         constant=True)
#: Kinds whose refusals name the argument: "requires ``name`` to be ``what``".
NAMED_KINDS = ("int", "order", "enum", "shared_array", "scope", "word")
#: How a primitive lowered from its spec gives the C function's result: ``"value"`` as it is, ``"bool"`` as
#: ``result != 0``, ``"team"`` a team the C function writes into three ints (its last argument).
RESULTS = ("value", "bool", "team", "none")
#: Every argument kind a spec may name. Each layer that checks arguments (the GPU's typing,
#: ``lowering/checks.py``; the simulator, ``sim/checks.py``) keeps a :class:`KindRegistry` of them.
KINDS = ("comm", "coop", "window", "team", "int", "order", "enum", "scope", "array", "shared_array", "lsa_session",
         "gin_context", "remote", "local", "cft_session", "cft_barrier_session", "word", "multimem")


class KindRegistry:
    """What one layer knows of each argument kind (the GPU's typing: a numba type class; the
    simulator: a check of a value), registered explicitly, once per kind, by the module that
    defines the kind's values (numba-cuda's typing and lowering ``Registry`` is the model)."""

    def __init__(self, layer: str, initial: dict):
        self.layer, self._table = layer, {}
        for kind, entry in initial.items():
            self.register(kind, entry)

    def register(self, kind: str, entry) -> None:
        if kind not in KINDS:
            raise FlowDSLError(f"Cannot register argument kind {kind!r} for {self.layer}: it is not one of "
                               f"flowdsl._spec.KINDS. Add it there first")
        if kind in self._table:
            raise FlowDSLError(f"Cannot register argument kind {kind!r} for {self.layer} twice")
        self._table[kind] = entry

    def __getitem__(self, kind: str):
        entry = self._table.get(kind)
        if entry is None:
            raise FlowDSLError(f"{self.layer} knows no argument kind {kind!r}: the module that defines its values "
                               "registers it (import it before checking)")
        return entry

    def __contains__(self, kind: str) -> bool:
        return kind in self._table

    def kinds(self) -> tuple[str, ...]:
        return tuple(self._table)

# flowdsl.mem's operations are single PTX instructions: each takes only the element types, orders and
# scopes that instruction has, chosen when the kernel is compiled.
#: ``ld``/``st`` with an order, ``atom.exch`` and ``atom.cas``: 4- and 8-byte integers.
INTEGER_ELEMENTS = ("int32", "uint32", "int64", "uint64")
#: ``atom.add`` and ``red.add``: those and 4- and 8-byte floats.
ARITHMETIC_ELEMENTS = INTEGER_ELEMENTS + ("float32", "float64")
#: 16-byte vectors: those and the narrow types packed four registers wide.
VECTOR_ELEMENTS = ARITHMETIC_ELEMENTS + ("int8", "uint8", "int16", "uint16", "float16")
MEM_ARRAY = ARRAY.but("an array (a window view or device array)",
                      "Pass a window view (flowdsl.lsa.local_view(win)) or a device array")
SCOPE = Arg("scope", "a flowdsl.ThreadScope", "Pass one of flowdsl.ThreadScope.SYSTEM, DEVICE, BLOCK",
            choices=(ThreadScope.SYSTEM, ThreadScope.DEVICE, ThreadScope.BLOCK), constant=True)
#: An atomic's order, known when the kernel is compiled (PTX has no ``consume``).
CONSTANT_ORDER = ORDER.but(choices=(MemoryOrder.RELAXED, MemoryOrder.ACQUIRE, MemoryOrder.RELEASE,
                                    MemoryOrder.ACQ_REL, MemoryOrder.SEQ_CST), constant=True)
#: A fence's order: one that orders something.
FENCE_ORDER = CONSTANT_ORDER.but(choices=CONSTANT_ORDER.choices[1:])


@dataclass(frozen=True)
class Gate:
    """The target a primitive needs: oldest NCCL, oldest compute capability, oldest linking CUDA."""

    nccl: tuple[int, int, int] = (2, 28, 9)
    min_cc: tuple[int, int] | None = None
    cuda: tuple[int, int] = (13, 0)

    @property
    def archs(self) -> tuple[str, ...]:
        """The support library's targets this gate allows."""
        if self.min_cc is None:
            return ALL_ARCHS
        return tuple(a for a in ALL_ARCHS if (int(a[3:-1]), int(a[-1])) >= self.min_cc)

    @property
    def gates(self) -> bool:
        """Whether it asks more than every build has."""
        return self != Gate()


#: Multimem instructions (``multimem.ld_reduce``, ``.st``, ``.red``) exist from sm_90 (Hopper) on.
MULTIMEM_GATE = Gate(min_cc=(9, 0))


@dataclass(frozen=True)
class CFunction:
    """A support-library C function a primitive calls: its row of the extern table
    (``flowdsl.lowering.externs.Extern``, which adds the name and, from the spec's gate, the oldest NCCL,
    archs and CUDA). Argument and result types are the table's C type keys (``externs.C_TYPES``:
    ``"devcomm"``, ``"window"``, ``"int"``, ...); no lowering is imported here.

    Attributes:
        ret: C type key of the result.
        args: ``(type key, argument name)`` pairs.
        doc: What it does, in one line; copied into the header.
        coop: One function per coop kind, with a leading ``uint32_t coop`` word.
        variants: One C function per ``(suffix, oldest NCCL)``, named ``<name>__<suffix>[__<coop>]``.
        library: ``"support"``, ``"gin"`` or ``"cft"`` (the header and build it belongs to).
        archs: Targets every build defines it for, where that is not the gate's (``None``: the gate's).
        name: The C name, where that is not the spec's ``extern`` (a second function the primitive calls).
    """

    ret: str
    args: tuple[tuple[str, str], ...]
    doc: str
    coop: bool = False
    variants: tuple[tuple[str, tuple[int, int, int]], ...] = ()
    library: str = "support"
    archs: tuple[str, ...] | None = None
    name: str | None = None


#: The C arguments most rows share: the device communicator, a window, a team (three ints in C).
C_COMM = ("devcomm", "comm")
C_WIN = ("window", "win")
C_TEAM = ("team", "team")


@dataclass(frozen=True)
class Spec:
    """One primitive: its name, its parameters (names and defaults, from the stub), the kinds of the
    checked ones, the C function stem it calls and its gate."""

    name: str
    params: tuple[inspect.Parameter, ...]
    args: dict = field(default_factory=dict)
    extern: str | None = None
    gate: Gate = Gate()
    #: One of :data:`RESULTS` when the primitive is one call of ``extern`` and lowered from this spec.
    returns: str | None = None
    #: The rows of the extern table this primitive declares (its C functions; empty where another stub
    #: declares ``extern``'s row, or it calls none).
    c: tuple[CFunction, ...] = ()

    @property
    def short(self) -> str:
        """``lsa.barrier`` for ``flowdsl.lsa.barrier``."""
        return self.name.removeprefix("flowdsl.")

    @property
    def signature(self) -> str:
        """The stub's parameters as a call reads them: ``(comm, coop, index)``."""
        return str(inspect.Signature([p.replace(annotation=inspect.Parameter.empty, default=_Shown.of(p.default))
                                      for p in self.params]))

    @property
    def called_as(self) -> str:
        """What every argument refusal ends with: the stub's signature, so the whole call is in the message."""
        return f" (the call is {self.name}{self.signature})"

    def refusal_arity(self, reason: str) -> str:
        """How every layer refuses a call whose arguments the stub's parameters do not bind (``reason`` is
        Python's: "too many positional arguments", "missing a required argument: 'index'")."""
        return (f"{self.name}: {reason}. Pass {self.name}{self.signature}, as its stub says (every argument "
                "the GPU's typing needs)")

    def default(self, param: str):
        """The stub's default of ``param`` (``inspect.Parameter.empty`` when it has none)."""
        return next(p.default for p in self.params if p.name == param)

    def refusal(self, param: str, got) -> str:
        """How every layer refuses argument ``param`` of type ``got``, the fix after it: the GPU's typing error
        and the simulator's ("flowdsl.lsa.sync requires a barrier session ..., got int64. Pass ...")."""
        arg = self.args[param]
        what = f"{param} to be {arg.what}" if arg.kind in NAMED_KINDS else arg.what
        return f"{self.name} requires {what}, got {got}. {arg.fix}{self.called_as}"

    def refusal_dtype(self, param: str, got: str) -> str:
        """How every layer refuses an array ``param`` of elements ``got`` its instruction lacks."""
        return (f"{self.name} requires elements of {', '.join(self.args[param].dtypes)}, got {got}. "
                f"{self.fix_dtype(param)}{self.called_as}")

    def refusal_choice(self, param: str, got: int) -> str:
        """How every layer refuses argument ``param`` (an enum member, or an int of a few values) of value ``got``
        outside its choices."""
        choices = self.args[param].choices
        enum_type = type(choices[0])
        members = getattr(enum_type, "_value2member_map_", {})
        got_name = enum_type(got).name if got in members else str(got)
        listed = ", ".join(_choice(c) for c in choices)
        wanted = listed if hasattr(choices[0], "name") else f"to be one of {listed}"  # members by name; ints read so
        return f"{self.name} requires {param} {wanted}, got {got_name}. {self.fix_choice(param)}{self.called_as}"

    def refusal_constant(self, param: str, got) -> str:
        """The GPU's typing refusal of a run-time value for ``param``, which it must know when it compiles."""
        first = self.args[param].choices[0]
        example = f"{_enum_path(type(first))}.{first.name}" if hasattr(first, "name") else str(first)
        return f"{self.name} requires {param} to be a compile-time constant such as {example}, got {got}{self.called_as}"

    def fix_choice(self, param: str) -> str:
        """What to pass instead of a value outside ``param``'s choices."""
        choices = self.args[param].choices
        if not hasattr(choices[0], "name"):
            return f"Pass one of {', '.join(map(str, choices))}"
        return f"Pass one of {_enum_path(type(choices[0]))}.{', '.join(c.name for c in choices)}"

    def fix_dtype(self, param: str) -> str:
        """What to pass instead of an array of other elements."""
        return f"Pass an array of {', '.join(self.args[param].dtypes)} elements"


class _Shown:
    """A default as a signature in a message shows it: an enum member by its class and name."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    @staticmethod
    def of(default):
        if isinstance(default, enum.Enum):
            return _Shown(f"{type(default).__name__}.{default.name}")
        return default



def _enum_path(cls) -> str:
    """How users name an enum class: ``flowdsl.MemoryOrder`` (flowdsl.enums' are exported at the top),
    ``flowdsl.cft.CftTeamMode`` (a module's own)."""
    module = cls.__module__
    return f"{'flowdsl' if module == 'flowdsl.enums' else module}.{cls.__name__}"


def _choice(c) -> str:
    """A choice as refusals name it: an enum member by its name, an int by its value."""
    return c.name if hasattr(c, "name") else str(c)


#: name -> spec of every primitive (also ``stub.__flowdsl_spec__``).
SPECS: dict[str, Spec] = {}


def make_spec(fn, extern: str | None = None, gate: Gate | None = None, returns: str | None = None,
              c: CFunction | tuple[CFunction, ...] = (), **args: Arg) -> Spec:
    """The spec of stub body ``fn``; every keyword in ``args`` must name one of its parameters."""
    params = tuple(inspect.signature(fn).parameters.values())
    unknown = set(args) - {p.name for p in params}
    if unknown:
        raise FlowDSLError(f"Cannot describe {fn.__name__}: it has no parameter {sorted(unknown)}. Name the stub's "
                           "own parameters in its spec")
    if returns is not None and (returns not in RESULTS or extern is None):
        raise FlowDSLError(f"Cannot describe {fn.__name__} with returns={returns!r}: a primitive lowered from its "
                           f"spec calls extern= and returns one of {RESULTS}")
    rows = (c,) if isinstance(c, CFunction) else tuple(c)
    if any((row.name or extern) is None for row in rows):
        raise FlowDSLError(f"Cannot describe {fn.__name__}: its C function has no name. Give extern= (or the "
                           "CFunction's name=)")
    spec = Spec(f"{fn.__module__}.{fn.__name__}", params, dict(args), extern, gate or Gate(), returns, rows)
    SPECS[spec.name] = spec
    return spec


def spec_of(stub_or_name) -> Spec:
    """The spec of a stub (or of its full name, ``"flowdsl.lsa.sync"``)."""
    if isinstance(stub_or_name, str):
        return SPECS[stub_or_name]
    return stub_or_name.__flowdsl_spec__


#: NumPy functions that make a new array: a GPU kernel cannot call them (numba's runtime, NRT, which allocates,
#: is not linked), and the simulator refuses them in kernel code in the same words.
NUMPY_ALLOCATING = frozenset({"zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like",
                              "array", "asarray", "arange", "linspace", "eye", "identity", "copy", "concatenate",
                              "stack", "hstack", "vstack", "tile", "repeat"})


def vector_write_refusal(name: str, attr: str) -> str:
    """How both paths refuse ``v.<attr> = ...`` of a numba-cuda vector ``v`` of type ``name`` (``float32x2``):
    numba-cuda types the store and has no code for it."""
    return (f"Cannot set .{attr} of a numba.cuda.{name}: vector values are read-only in numba-cuda. Build a new "
            f"one with numba.cuda.{name}(...)")


def numpy_allocation_refusal(name: str) -> str:
    """How both paths refuse ``numpy.<name>`` (one of :data:`NUMPY_ALLOCATING`) in kernel code."""
    return (f"Cannot type the call of {name} in a kernel: numpy.{name} makes a new array, which a GPU kernel "
            "cannot allocate without numba's runtime (NRT, off: NUMBA_CUDA_ENABLE_NRT=1 links it). Use "
            "cuda.local.array(shape, dtype) (per thread) or cuda.shared.array(shape, dtype) (per block), or pass "
            "the array in")


def numpy_allocation_allowed() -> bool:
    """Whether kernel code may make new NumPy arrays: numba's runtime is on (``NUMBA_CUDA_ENABLE_NRT``), so
    numba-cuda types the call and flowdsl links the runtime beside the kernel. Read from numba-cuda's live
    configuration where it is loaded (a kernel module's ``from numba import cuda`` loads it), else off."""
    config = sys.modules.get("numba.cuda.core.config")
    return bool(config is not None and getattr(config, "CUDA_ENABLE_NRT", False))
