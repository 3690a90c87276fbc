"""Primitives lowered from their spec alone (``returns=``: flowdsl/lowering/generic.py): the team primitives
compile with positional and keyword arguments and refuse a wrong argument in the spec's words; a new one-call
primitive needs only its stub (here reusing an existing C function) to compile; a kind without a C mapping and
``returns`` without ``extern`` are refused naming the fix. Compile only."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

import flowdsl
from flowdsl import team
from flowdsl._spec import ALL_ARCHS, C_COMM, COMM, SPECS, TEAM, CFunction, Gate, make_spec, spec_of
from flowdsl._stubs import PRIMITIVES, primitive
from flowdsl.errors import FlowDSLError

pytestmark = pytest.mark.compile


def _compile(fn, *args):
    return flowdsl.kernel(fn).compile(flowdsl.FlowKernel.argtypes_for(*args, nccl="2.28.9"), arch="sm_90",
                                      nccl="2.28.9")


def test_the_team_primitives_are_lowered_from_their_specs():
    assert {name: spec_of(stub).returns for name, stub in PRIMITIVES.items() if name.startswith("flowdsl.team.")} \
        == {"flowdsl.team.world": "team", "flowdsl.team.lsa": "team", "flowdsl.team.rail": "team",
            "flowdsl.team.rank_to_world": "value", "flowdsl.team.rank_to_lsa": "value",
            "flowdsl.team.rank_is_member": "bool", "flowdsl.team.rank_to_team": "value",
            "flowdsl.team.inner_factor": "team", "flowdsl.team.outer_factor": "team",
            "flowdsl.team.rank_in_difference": "value"}


def test_keywords_and_the_specs_refusal_hold_for_a_generated_lowering():
    def by_keyword(comm, out):
        out[0] = team.rank_to_world(comm, rank=1, team=team.lsa(comm))

    assert len(_compile(by_keyword, "devcomm", np.zeros(1, np.int32)).function_symbols()) == 1

    def wrong(comm, out):
        out[0] = team.rank_to_world(comm, 3, 1)

    with pytest.raises(flowdsl.KernelTypingError, match=r"flowdsl.team.rank_to_world requires a team, got int64"):
        _compile(wrong, "devcomm", np.zeros(1, np.int32))


def test_a_new_one_call_primitive_needs_only_its_stub():
    from flowdsl.lowering.generic import lower_from_spec

    @primitive(extern="flowdsl_team_rank_to_lsa", returns="value", comm=COMM, team=TEAM)
    def lsa_rank_of(comm, team, rank):
        """A second name for ``team.rank_to_lsa``: a primitive made by its stub alone."""

    try:
        lower_from_spec(lsa_rank_of)

        def k(comm, out):
            out[0] = lsa_rank_of(comm, team.world(comm), 0)

        assert len(_compile(k, "devcomm", np.zeros(1, np.int32)).function_symbols()) == 1
    finally:
        PRIMITIVES.pop(spec_of(lsa_rank_of).name)
        SPECS.pop(spec_of(lsa_rank_of).name)


def test_what_a_spec_cannot_lower_is_refused_naming_the_fix():
    from flowdsl._spec import WINDOW
    from flowdsl.lowering.generic import lower_from_spec

    def body(win):
        """A window has no C mapping of its own (its pointer depends on the call)."""

    stub = primitive(body, extern="flowdsl_get_local_pointer", returns="value", win=WINDOW)
    try:
        with pytest.raises(FlowDSLError, match=r"Cannot lower .*body from its spec: its argument win is of kind "
                                               r"'window', which has no C mapping .*C_ARGUMENTS\)\. Add one, or "
                                               r"write its lowering by hand"):
            lower_from_spec(stub)
    finally:
        PRIMITIVES.pop(spec_of(stub).name)
        SPECS.pop(spec_of(stub).name)
    with pytest.raises(FlowDSLError, match=r"returns='value': a primitive lowered from its spec calls extern="):
        make_spec(body, returns="value", win=WINDOW)


# ---- every stub has its lowering, simulation and extern row ------------------------------------------

def test_every_stub_has_a_lowering_a_simulation_and_its_extern_rows():
    """numba-cuda's typing resolves each stub to an overload (an unbound stub is "Cannot determine Numba
    type"), the simulator implements it, and the C name its spec calls is a row of the extern table (or, for a
    session opener such as cft.barrier, the stem of its methods' rows ``<extern>_<method>``)."""
    importlib.import_module("flowdsl.lowering.bindings")  # binds every stub
    import flowdsl.sim as sim
    from flowdsl.lowering import externs
    from flowdsl.lowering.backend import resolve_stub

    rows = {row.name for row in externs.EXTERNS}
    unlowered = [name for name, stub in sorted(PRIMITIVES.items()) if not resolve_stub(stub)]
    unsimulated = sorted(set(PRIMITIVES) - set(sim.SEMANTICS))
    no_row = [f"{name}: {spec_of(name).extern}" for name in sorted(PRIMITIVES) if spec_of(name).extern
              and spec_of(name).extern not in rows and not any(r.startswith(spec_of(name).extern + "_") for r in rows)]
    assert (unlowered, unsimulated, no_row) == ([], [], [])


def test_extern_rows_are_gathered_from_the_specs_in_the_documented_order():
    """Each row of the extern table is a spec's ``c=`` (or one of externs.INTERNAL): a new primitive's row needs no
    edit of externs.py, and the headers list the rows by externs.row_order's key, whatever imported the stubs."""
    from flowdsl.lowering import externs

    declared = sorted([c.name or spec.extern for spec in SPECS.values() for c in spec.c]
                      + [row.name for row in externs.INTERNAL])
    assert declared == sorted(row.name for row in externs.EXTERNS)
    keys = [key for key, _ in externs.row_order()]
    assert keys == sorted(keys) and [row for _, row in externs.row_order()] == list(externs.EXTERNS)
    row = externs.by_name("flowdsl_lsa_barrier_sync")
    assert row.coop and (row.since, row.archs, row.cuda) == (Gate().nccl, Gate().archs, Gate().cuda)
    assert externs.by_name("flowdsl_get_lsa_multimem_pointer").archs == ALL_ARCHS  # c=CFunction(archs=...)


def test_a_c_function_declared_twice_is_refused():
    from flowdsl.lowering import externs

    def twice(comm):
        pass

    row = CFunction("int", (C_COMM,), "Twice.")
    spec = make_spec(twice, extern="flowdsl_test_twice", c=(row, row), comm=COMM)
    try:
        with pytest.raises(FlowDSLError, match="Two rows declare the C function flowdsl_test_twice"):
            externs.row_order()
    finally:
        SPECS.pop(spec.name)
    assert spec.c == (row, row)


def test_the_completeness_check_finds_a_stub_without_lowering():
    from flowdsl.lowering.backend import resolve_stub

    def unbound(comm):
        """Nobody lowers this."""
    unbound.__module__ = "flowdsl.unlowered"
    stub = primitive(unbound)
    try:
        assert not resolve_stub(stub)
    finally:
        PRIMITIVES.pop(stub.__flowdsl_primitive__)
        SPECS.pop(stub.__flowdsl_primitive__)


def _lowered_methods():
    """{(type name, method): the lowering's function} of every method flowdsl gives a numba type."""
    importlib.import_module("flowdsl.lowering.bindings")  # binds every stub
    from flowdsl.lowering.backend import overloaded_methods

    return {(typ.__name__, attr): fn for typ, attr, fn in overloaded_methods() if fn.__module__.startswith("flowdsl.")}


def _params(fn, skip_first=False):
    import inspect

    return [(p.name, p.kind, p.default) for p in list(inspect.signature(fn).parameters.values())[int(skip_first):]]


def _lowering_differs(stub, fn, skip_first=False) -> bool:
    """Whether lowering ``fn`` takes other parameters than ``stub``: a lowering's default is the stub's, or
    None where the stub's default is an enum member (left out: the lowering reads the member from the spec,
    ``checks.stub_default``, as numba compiles a left-out argument from the typer's default)."""
    spec = spec_of(stub)

    def same(lowered, stubs):
        (name, kind, default), (_, _, stub_default) = lowered, stubs
        return default == stub_default or (default is None and name in spec.args
                                           and spec.args[name].kind in ("order", "enum", "scope"))

    lowered, stubbed = _params(fn, skip_first), _params(stub, skip_first)
    return ([(n, k) for n, k, _ in lowered] != [(n, k) for n, k, _ in stubbed]
            or not all(same(a, b) for a, b in zip(lowered, stubbed)))


def test_every_lowering_takes_its_stubs_parameters():
    """Each ``@overload`` of a stub takes the stub's parameters and defaults (or None for an enum default, which
    the spec gives): a default restated in the lowering (``bits=64`` of gin.read_signal) cannot drift."""
    importlib.import_module("flowdsl.lowering.bindings")  # binds every stub
    from flowdsl.lowering.backend import overloaded_stubs

    pairs = list(overloaded_stubs())
    assert {stub for stub, _ in pairs} >= {flowdsl.gin.flush, flowdsl.gin.wait_signal, flowdsl.cft.fence,
                                           flowdsl.cft.barrier_sync, flowdsl.lsa.sync}
    differ = [f"{spec_of(stub).name}: lowering {fn.__name__}{_params(fn)}, stub {_params(stub)}"
              for stub, fn in pairs if _lowering_differs(stub, fn)]
    assert differ == []


def test_the_lowering_check_finds_a_restated_default():
    def read_signal(ctx, signal, bits=32, order=None):
        """A lowering that restated gin.read_signal's bits, then drifted."""

    assert _lowering_differs(flowdsl.gin.read_signal, read_signal)
    read_signal.__defaults__ = (64, None)
    assert not _lowering_differs(flowdsl.gin.read_signal, read_signal)
    read_signal.__defaults__ = (None, None)  # None stands only for an enum default, which the spec gives
    assert _lowering_differs(flowdsl.gin.read_signal, read_signal)


def test_every_session_method_takes_the_gpus_parameters_on_the_simulator():
    """A method of a session or coop (``gin.rail_barrier(...).sync(order)``) has no stub of its own: the
    simulator's class must take the parameters the GPU's typing takes, defaults included (its GIN barriers'
    ``sync`` defaulted ``order`` to SEQ_CST, so ``.sync()`` ran on the simulator and failed to compile). A
    method that is a stub's lowering too (``lsa.sync``, ``cft.barrier_sync``) takes the stub's parameters
    on both sides, and its simulator class forwards to the stub (``run``), whose defaults the spec holds."""
    from flowdsl.lowering.backend import overloaded_stubs
    from flowdsl.sim import cft, coop, gin, lsa

    simulated = {"CoopType": (coop.Coop,), "LsaBarrierSessionType": (lsa.BarrierSession,),
                 "GinBarrierSessionType": (gin.GinBarrierSession, gin.HybridBarrierSession),
                 "CftBarrierSessionType": (cft.CftBarrierSession,)}
    lowered = _lowered_methods()
    stub_of = {fn: stub for stub, fn in overloaded_stubs()}
    assert {t for t, _ in lowered} == set(simulated), "a lowered type's simulator classes are not listed"
    assert {(t, a) for (t, a), fn in lowered.items() if fn in stub_of} >= {
        ("CftBarrierSessionType", m) for m in ("arrive", "wait", "sync")}, "the CFT barrier's methods have specs"
    forwarding = [(inspect.Parameter.VAR_POSITIONAL, None), (inspect.Parameter.VAR_KEYWORD, None)]
    differ = []
    for (typ, attr), fn in sorted(lowered.items()):
        stub = stub_of.get(fn)
        if stub is not None and _lowering_differs(stub, fn, True):
            differ.append(f"{typ}.{attr}: GPU {_params(fn, True)}, stub {_params(stub, True)}")
        for cls in simulated[typ]:
            method = getattr(cls, attr, None)
            if method is None:
                differ.append(f"{cls.__name__} has no {attr}")
                continue
            sim_params = _params(method, True)
            if stub is not None:  # forwarded to the stub (whose parameters run() checks), or the stub's own
                if [(k, None) for _, k, _ in sim_params] != forwarding and sim_params != _params(stub, True):
                    differ.append(f"{cls.__name__}.{attr} takes {sim_params}: forward to {spec_of(stub).name}")
            elif sim_params != _params(fn, True):
                differ.append(f"{cls.__name__}.{attr}: simulator {sim_params}, GPU {_params(fn, True)}")
    assert differ == []


def test_an_enum_parameter_left_out_means_the_stubs_default():
    """What an omitted order, proxy or scope means is the stub's default (a member, in the spec), which the
    lowering reads (``checks.stub_default``) and the simulator's implementation is given when it registers
    (``sim.semantics.implements``): a ``None`` default left each layer to pick its own."""
    import enum
    import inspect

    vague = [f"{name}({p.name}=None)" for name, spec in sorted(SPECS.items()) for p in spec.params
             if p.name in spec.args and spec.args[p.name].kind in ("order", "enum", "scope") and p.default is None]
    assert vague == []
    defaults = {(name, p.name): p.default for name, spec in SPECS.items() for p in spec.params
                if p.name in spec.args and spec.args[p.name].kind in ("order", "enum", "scope")
                and p.default is not inspect.Parameter.empty}
    assert defaults and all(isinstance(d, enum.IntEnum) for d in defaults.values()), defaults
