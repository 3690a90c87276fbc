"""The one table of support-library functions, and what is generated from it.

Every function the lowering calls in ``prebuilt/`` is one :class:`Extern` row
in :data:`EXTERNS`. From this table come: the numba declarations
(``declarations.py``), the C prototype header ``prebuilt/include/flowdsl_support.h``
(:func:`render_header`), and the test that every symbol exists in every built
LTO-IR. A row with ``coop=True`` stands for one C function per coop kind,
named ``<name>__<kind>``, whose first argument is the packed coop word.
GIN's put, put_value and signal take the coop kind and word as arguments
instead (one function for every coop; see ``prebuilt/src/flowdsl_gin.cu``).
Rows of ``library="gin"`` make the GIN library (``flowdsl_gin.h``,
``prebuilt/src/flowdsl_gin.cu``), built once per GIN backend and linked only
into kernels that use GIN. Rows of ``library="cft"`` make a separate support
library (``flowdsl_cft.h``, ``prebuilt/src/flowdsl_cft.cu``), built with a CUDA
>= 13.3 nvcc for sm_100 and linked only into kernels that use :mod:`flowdsl.cft`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .. import cft, coop, gin, lsa, team, wait  # noqa: F401 - their specs give the rows' gates
from .._spec import ALL_ARCHS, SPECS, Gate, spec_of
from ..enums import CoopKind

__all__ = ["Extern", "EXTERNS", "C_TYPES", "COOP_SUFFIX", "REMOTE_VARIANTS", "PAYLOAD_SUFFIX", "CFT_SINCE",
           "CFT_ARCHS", "CFT_CUDA", "LIBRARIES", "COOP_API", "symbols", "render_header", "by_name"]

#: Table C type key -> C spelling. Only pointers and scalars cross the C ABI.
C_TYPES = {
    "void": "void",
    "int": "int",
    "uint32": "uint32_t",
    "size_t": "size_t",
    "uint64": "uint64_t",
    "ptr": "void*",
    "devcomm": "const ncclDevComm*",
    "window": "ncclWindow_t",
    "int_out": "int*",
    "u64_out": "uint64_t*",
    "order": "int",  # cuda::memory_order
    # A team crosses the ABI as its three fields.
    "team": ("int", "int", "int"),
}

COOP_SUFFIX = {
    CoopKind.THREAD: "thread",
    CoopKind.WARP: "warp",
    CoopKind.LANES: "lanes",
    CoopKind.WARP_SPAN: "warp_span",
    CoopKind.CTA: "cta",
}


@dataclass(frozen=True)
class Extern:
    """One support-library function.

    Attributes:
        name: C symbol (``flowdsl_`` + the NCCL Device API name in snake_case).
        ret: C type key of the result.
        args: ``(type key, argument name)`` pairs.
        doc: What it does, in one line; copied into the header.
        coop: One function per coop kind, with a leading ``uint32_t coop`` word.
        since: Oldest NCCL release whose device API has it.
        archs: Targets it is built for.
        library: ``"support"`` (every build), ``"gin"`` (the GIN builds, one per backend) or ``"cft"``
            (the separate CFT builds).
        cuda: Oldest CUDA toolkit (nvcc for the build, nvJitLink for the link) it needs.
    """

    name: str
    ret: str
    args: tuple[tuple[str, str], ...]
    doc: str
    coop: bool = False
    since: tuple[int, int, int] = (2, 28, 9)
    archs: tuple[str, ...] = ("sm_80", "sm_90", "sm_100")
    #: One C function per variant ``(suffix, since)``, named ``<name>__<suffix>[__<coop>]``.
    variants: tuple[tuple[str, tuple[int, int, int]], ...] = ()
    library: str = "support"
    cuda: tuple[int, int] = (13, 0)

    def c_params(self) -> list[str]:
        params = ["uint32_t coop"] if self.coop else []
        for key, arg in self.args:
            spelled = C_TYPES[key]
            if isinstance(spelled, tuple):
                params += [f"{t} {arg}_{f}" for t, f in zip(spelled, ("nranks", "rank", "stride"))]
            else:
                params.append(f"{spelled} {arg}")
        return params

    def symbols(self, nccl_version: tuple[int, int, int] | None = None) -> list[str]:
        stems = [self.name] if not self.variants else [
            f"{self.name}__{suffix}" for suffix, since in self.variants
            if nccl_version is None or nccl_version >= since]
        if not self.coop:
            return stems
        return [f"{stem}__{suffix}" for stem in stems for suffix in COOP_SUFFIX.values()]

    def variant_since(self, symbol: str) -> tuple[int, int, int]:
        """Oldest NCCL release that has ``symbol`` (a variant may be newer than the row)."""
        coops = [""] + [f"__{suffix}" for suffix in COOP_SUFFIX.values()] if self.coop else [""]
        for suffix, since in self.variants:
            if symbol in (f"{self.name}__{suffix}{coop}" for coop in coops):
                return max(since, self.since)
        return self.since


def _gate_of(name: str) -> Gate:
    """The gate of the primitive whose spec calls ``name``."""
    return next((s.gate for s in SPECS.values() if s.extern == name), Gate())


def _e(name, ret, args, doc, **kw):
    """A row whose oldest NCCL, archs and CUDA are those of the primitive that calls it (``archs=``: a C
    function that every build defines, whatever arch its caller needs)."""
    gate = _gate_of(name)
    kw = {"since": gate.nccl, "archs": gate.archs, "cuda": gate.cuda, **kw}
    return Extern(name, ret, tuple(args), doc, **kw)


def _gin(name, ret, args, doc, **kw):
    return _e(name, ret, args, doc, library="gin", **kw)


def _cft(name, ret, args, doc, **kw):
    return _e(name, ret, args, doc, library="cft", **kw)


#: CFT needs NCCL 2.31, Blackwell (sm_100) and CUDA 13.3 (flowdsl.cft.GATE).
CFT_SINCE = cft.GATE.nccl
CFT_ARCHS = cft.GATE.archs
CFT_CUDA = cft.GATE.cuda
LIBRARIES = ("support", "gin", "cft")

_COMM = ("devcomm", "comm")
_WIN = ("window", "win")
_TEAM = ("team", "team")
_REMOTE = [("uint32", "signal"), ("window", "signal_win"), ("size_t", "signal_offset"), ("uint64", "value")]
_TO_PEER = [_COMM, ("int", "ctx"), _TEAM, ("int", "peer")]
_PUT_ARGS = [("window", "dst"), ("size_t", "dst_offset"), ("window", "src"), ("size_t", "src_offset"),
             ("size_t", "bytes")]
#: The coop as arguments: its kind (flowdsl.enums.CoopKind) and its packed word.
_COOP_ARGS = [("int", "coop_kind"), ("uint32", "coop")]
#: put_value payload sizes: the suffix of each function.
PAYLOAD_SUFFIX = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
#: GIN remote actions: (kind, oldest NCCL with it), from the actions' specs (flowdsl.gin): legacy
#: kinds exist since 2.28; strong, weak and VA signals are used from 2.32.
REMOTE_VARIANTS = (("none", Gate().nccl),) + tuple(
    (name, spec_of(getattr(gin, name)).gate.nccl) for name in gin.__all__ if name.endswith(("_inc", "_add"))
    and name != "counter_inc")


def _gin_ids(what: str) -> tuple[Extern, ...]:
    """The rows of a GIN signal's or counter's (``what``) read, bounded wait and reset: alike but for the name."""
    ident, name = ("uint32", what), what.capitalize()
    return (
        _gin(f"flowdsl_gin_read_{what}", "uint64", [_COMM, ("int", "ctx"), ident, ("int", "bits"), ("order", "order")],
             f"ncclGin::read{name}."),
        _gin(f"flowdsl_gin_wait_{what}", "void", [_COMM, ("int", "ctx"), ident, ("uint64", "least"), ("int", "bits"),
                                                  ("order", "order")], f"ncclGin::wait{name}, bounded.", coop=True),
        _gin(f"flowdsl_gin_reset_{what}", "void", [_COMM, ("int", "ctx"), ident], f"ncclGin::reset{name}."),
    )


EXTERNS: tuple[Extern, ...] = (
    # Device communicator fields.
    _e("flowdsl_comm_rank", "int", [_COMM], "World rank of this device communicator."),
    _e("flowdsl_comm_nranks", "int", [_COMM], "Number of world ranks."),
    _e("flowdsl_comm_lsa_rank", "int", [_COMM], "Rank within this rank's LSA team."),
    _e("flowdsl_comm_lsa_size", "int", [_COMM], "Number of ranks in this rank's LSA team."),
    _e("flowdsl_comm_gin_context_count", "int", [_COMM], "GIN contexts a kernel may use (ncclDevComm::ginContextCount)."),
    # Bounded waits (flowdsl.wait): the timer and the device communicator's wait record (its last word).
    _e("flowdsl_wait_check", "uint64", [("ptr", "record"), ("uint64", "state"), ("int", "what"), ("int", "peer"),
                                        ("uint32", "index"), ("uint64", "expected"), ("uint64", "seen")],
       "One check of a bounded wait (flowdsl.wait.poll): the wait's next state, or all ones to give up."),
    # Coops.
    _e("flowdsl_coop_sync", "void", [], "Barrier among the coop's threads.", coop=True),
    _e("flowdsl_coop_thread_rank", "int", [], "This thread's index in the coop.", coop=True),
    _e("flowdsl_coop_size", "int", [], "Number of threads in the coop.", coop=True),
    # Teams: results are written as (nranks, rank, stride) through `out`.
    _e("flowdsl_team_world", "void", [_COMM, ("int_out", "out")], "ncclTeamWorld."),
    _e("flowdsl_team_lsa", "void", [_COMM, ("int_out", "out")], "ncclTeamLsa."),
    _e("flowdsl_team_rail", "void", [_COMM, ("int_out", "out")], "ncclTeamRail."),
    _e("flowdsl_team_rank_to_world", "int", [_COMM, _TEAM, ("int", "rank")], "ncclTeamRankToWorld."),
    _e("flowdsl_team_rank_to_lsa", "int", [_COMM, _TEAM, ("int", "rank")], "ncclTeamRankToLsa."),
    _e("flowdsl_team_rank_is_member", "int", [("team", "a"), ("team", "b"), ("int", "b_peer")],
       "ncclTeamRankIsMember (0 or 1)."),
    _e("flowdsl_team_rank_to_team", "int", [("team", "a"), ("team", "b"), ("int", "b_peer")],
       "ncclTeamRankToTeam."),
    _e("flowdsl_team_inner_factor", "void", [_TEAM, ("int", "inner_size"), ("int_out", "out")],
       "ncclTeamInnerFactor."),
    _e("flowdsl_team_outer_factor", "void", [_TEAM, ("int", "inner_size"), ("int_out", "out")],
       "ncclTeamOuterFactor."),
    _e("flowdsl_team_rank_in_difference", "int", [("team", "parent"), ("team", "subset"), ("int", "index")],
       "ncclTeamRankInDifference."),
    # Window pointers (byte offsets).
    _e("flowdsl_get_local_pointer", "ptr", [_WIN, ("size_t", "offset")], "ncclGetLocalPointer."),
    _e("flowdsl_get_lsa_pointer", "ptr", [_WIN, ("size_t", "offset"), ("int", "lsa_peer")], "ncclGetLsaPointer."),
    _e("flowdsl_get_peer_pointer", "ptr", [_WIN, ("size_t", "offset"), ("int", "peer")], "ncclGetPeerPointer."),
    _e("flowdsl_get_team_pointer", "ptr", [_WIN, ("size_t", "offset"), _TEAM, ("int", "peer")],
       "ncclGetPeerPointer with a team."),
    _e("flowdsl_get_lsa_multimem_pointer", "ptr", [_WIN, ("size_t", "offset"), _COMM],
       "ncclGetLsaMultimemPointer, or null when the communicator has no multimem (lsaMultimem not asked for).",
       archs=ALL_ARCHS),  # pointer arithmetic: every arch builds it; the multimem instructions need sm_90
    # LSA barrier sessions on the LSA team; each call opens and closes a session.
    _e("flowdsl_lsa_barrier_arrive", "void", [_COMM, ("uint32", "index"), ("order", "order")],
       "ncclLsaBarrierSession::arrive.", coop=True),
    _e("flowdsl_lsa_barrier_wait", "void", [_COMM, ("uint32", "index"), ("order", "order")],
       "ncclLsaBarrierSession::wait, bounded (flowdsl.wait).", coop=True),
    _e("flowdsl_lsa_barrier_sync", "void", [_COMM, ("uint32", "index"), ("order", "order")],
       "ncclLsaBarrierSession::sync, its wait bounded.", coop=True),
    # GIN (the "gin" library, one build per backend). One function per remote action (and counted or
    # not, and payload size): see REMOTE_VARIANTS. put, put_value and signal take the coop as arguments.
    _gin("flowdsl_gin_put", "void", _COOP_ARGS + _TO_PEER + _PUT_ARGS + _REMOTE,
         "ncclGin::put with a remote action.", variants=REMOTE_VARIANTS),
    _gin("flowdsl_gin_put", "void", _COOP_ARGS + _TO_PEER + _PUT_ARGS + _REMOTE + [("uint32", "counter")],
         "ncclGin::put with a remote action and a counter.",
         variants=tuple((f"{kind}__counted", since) for kind, since in REMOTE_VARIANTS)),
    _gin("flowdsl_gin_put_value", "void", _COOP_ARGS + _TO_PEER + [("window", "dst"), ("size_t", "dst_offset"),
                                                                   ("uint64", "payload")] + _REMOTE,
         "ncclGin::putValue of a 1, 2, 4 or 8-byte payload (the suffix).",
         variants=tuple((f"{kind}__{size}", since) for kind, since in REMOTE_VARIANTS
                   for size in PAYLOAD_SUFFIX.values())),
    _gin("flowdsl_gin_signal", "void", _COOP_ARGS + _TO_PEER + _REMOTE, "ncclGin::signal.",
         variants=REMOTE_VARIANTS[1:]),
    _gin("flowdsl_gin_get", "void", [_COMM, ("int", "ctx"), _TEAM, ("int", "peer"), ("window", "remote"),
                                     ("size_t", "remote_offset"), ("window", "local"), ("size_t", "local_offset"),
                                     ("size_t", "bytes")], "ncclGin::get.", coop=True),
    _gin("flowdsl_gin_flush", "void", [_COMM, ("int", "ctx"), ("order", "order")], "ncclGin::flush.", coop=True),
    *_gin_ids("signal"),
    *_gin_ids("counter"),
    _gin("flowdsl_gin_rail_barrier_sync", "void", [_COMM, ("int", "ctx"), ("uint32", "index"), ("order", "order")],
         "ncclGinBarrierSession (rail team)::sync, bounded.", coop=True),
    _gin("flowdsl_gin_world_barrier_sync", "void", [_COMM, ("int", "ctx"), ("uint32", "index"), ("order", "order")],
         "ncclGinBarrierSession (world team)::sync, bounded.", coop=True),
    _gin("flowdsl_hybrid_barrier_sync", "void", [_COMM, ("int", "ctx"), ("uint32", "index"), ("order", "order")],
         "ncclBarrierSession (world: LSA inside, GIN across)::sync, bounded.", coop=True),
    _gin("flowdsl_hybrid_lsa_barrier_sync", "void", [_COMM, ("int", "ctx"), ("uint32", "index"), ("order", "order")],
         "ncclBarrierSession (world)::lsaBarrier().sync, bounded.", coop=True),
    _gin("flowdsl_hybrid_gin_barrier_sync", "void", [_COMM, ("int", "ctx"), ("uint32", "index"), ("order", "order")],
         "ncclBarrierSession (world)::ginBarrier().sync, bounded.", coop=True),
    # CFT (the separate "cft" library): teams, logical endpoints, sessions, counted writes, barriers.
    _cft("flowdsl_cft_team", "void", [_COMM, ("int_out", "out")], "ncclTeamCft (flat)."),
    _cft("flowdsl_cft_le_info", "void", [_COMM, _WIN, ("size_t", "offset"), _TEAM, ("int", "peer"),
                                         ("u64_out", "out")],
         "ncclGetCftLeInfo: out[0] = LE id, out[1] = LE offset."),
    _cft("flowdsl_cft_peer_le_info", "void", [_COMM, _WIN, ("size_t", "offset"), ("int", "peer"),
                                              ("u64_out", "out")],
         "ncclGetPeerLeInfo (world peer): out[0] = LE id, out[1] = LE offset."),
    _cft("flowdsl_cft_read_counter", "uint64", [_WIN, ("size_t", "offset"), ("order", "order")],
         "Load of the u64 counter at a byte offset of the local counted window (no fabric fence)."),
    _cft("flowdsl_cft_session_open", "void", [("ptr", "session")],
         "ncclCft constructor: initialises the session's mbarrier in shared memory.", coop=True),
    _cft("flowdsl_cft_session_close", "void", [("ptr", "session")],
         "ncclCft destructor: invalidates the session's mbarrier.", coop=True),
    _cft("flowdsl_cft_put", "void", [("ptr", "session"), ("uint32", "le_id"), ("size_t", "le_offset"),
                                     ("ptr", "src"), ("uint32", "bytes")], "ncclCft::put.", coop=True),
    _cft("flowdsl_cft_put_counted", "void", [("ptr", "session"), ("uint32", "le_id"), ("size_t", "le_offset"),
                                             ("size_t", "counter_offset"), ("ptr", "src"), ("uint32", "bytes")],
         "ncclCft::putCounted.", coop=True),
    _cft("flowdsl_cft_get", "void", [("ptr", "session"), ("uint32", "le_id"), ("size_t", "le_offset"),
                                     ("ptr", "dst"), ("uint32", "bytes")], "ncclCft::get.", coop=True),
    _cft("flowdsl_cft_submit", "void", [("ptr", "session")], "ncclCft::submit.", coop=True),
    _cft("flowdsl_cft_flush", "uint32", [("ptr", "session")],
         "ncclCft::flush; 0, or 0x100 | the fabric's report.", coop=True),
    _cft("flowdsl_cft_flush_smem", "void", [("ptr", "session")], "ncclCft::flushSmem.", coop=True),
    _cft("flowdsl_cft_wait_counted", "void", [_COMM, ("ptr", "session"), _WIN, ("size_t", "offset"),
                                              ("uint64", "expected"), ("order", "order"), ("int", "consumer")],
         "ncclCft::waitCounted, bounded (waits, then fences fabric -> consumer).", coop=True),
    _cft("flowdsl_cft_mem_fence", "void", [("order", "order"), ("int", "producer"), ("int", "consumer"),
                                           ("int", "scope")], "ncclMemFence.", coop=True),
    _cft("flowdsl_cft_barrier_arrive", "void", [_COMM, ("uint32", "index"), ("order", "order"),
                                                ("int", "producer"), ("int", "consumer")],
         "ncclCftBarrierSession::arrive.", coop=True),
    _cft("flowdsl_cft_barrier_wait", "void", [_COMM, ("uint32", "index"), ("order", "order"),
                                              ("int", "producer"), ("int", "consumer")],
         "ncclCftBarrierSession::wait, bounded.", coop=True),
    _cft("flowdsl_cft_barrier_sync", "void", [_COMM, ("uint32", "index"), ("order", "order"),
                                              ("int", "producer"), ("int", "consumer")],
         "ncclCftBarrierSession::sync, its wait bounded.", coop=True),
)


def by_name(name: str) -> Extern:
    """The row called ``name`` (KeyError if there is none)."""
    for ext in EXTERNS:
        if ext.name == name:
            return ext
    raise KeyError(name)


def symbols(nccl_version: tuple[int, int, int] | None = None, arch: str | None = None,
            library: str = "support") -> list[str]:
    """Every C symbol the table asks of a build of ``library`` for ``nccl_version`` and ``arch``."""
    out = []
    for ext in EXTERNS:
        if ext.library != library:
            continue
        if nccl_version is not None and nccl_version < ext.since:
            continue
        if arch is not None and arch not in ext.archs:
            continue
        out += ext.symbols(nccl_version)
    return out


def _nccl_code(version: tuple[int, int, int]) -> int:
    """``NCCL_VERSION_CODE`` of ``version``."""
    return version[0] * 10000 + version[1] * 100 + version[2]


#: The header macro that declares a coop row's functions (one per coop kind) and their C function type.
COOP_API = "FLOWDSL_COOP_API"


def _coop_api_macro() -> list[str]:
    """The definition of :data:`COOP_API` (in headers with coop rows): one line a row instead of five prototypes."""
    decls = "; ".join(f"FLOWDSL_API NAME##_fn NAME##__{suffix}" for suffix in COOP_SUFFIX.values())
    return [f"// {COOP_API}(RET, NAME, PARAMS): the C function type NAME_fn, and a function of it per coop kind,",
            f"// NAME__{', NAME__'.join(COOP_SUFFIX.values())} (PARAMS begin with the coop word).",
            f"#define {COOP_API}(RET, NAME, PARAMS) typedef RET NAME##_fn PARAMS; {decls}", ""]


def _declarations(ext: Extern) -> list[str]:
    """The header lines declaring ``ext``'s functions: one prototype, one :data:`COOP_API` line for a
    row of one function per coop kind, or, for a row of variants, their C function type once and the
    functions (those of one NCCL release a line)."""
    ret, params = C_TYPES[ext.ret], ", ".join(ext.c_params()) or "void"
    symbols = ext.symbols()
    if len(symbols) == 1:
        return [f"FLOWDSL_API {ret} {symbols[0]}({params});"]
    if ext.coop and not ext.variants:
        return [f"{COOP_API}({ret}, {ext.name}, ({params}));"]
    tails = {suffix.partition("__")[2] for suffix, _ in ext.variants}
    fn = f"{ext.name}{'__' + tails.pop() if len(tails) == 1 and '' not in tails else ''}_fn"
    lines = [f"typedef {ret} {fn}({params});"]
    for since in sorted({ext.variant_since(sym) for sym in symbols}):
        line = " ".join(f"FLOWDSL_API {fn} {sym};" for sym in symbols if ext.variant_since(sym) == since)
        lines += [f"#if NCCL_VERSION_CODE >= {_nccl_code(since)}", line, "#endif"] if since > ext.since else [line]
    return lines


def render_header(library: str = "support") -> str:
    """The C prototype header of ``library`` for ``prebuilt/``, generated from :data:`EXTERNS`.

    Rows follow the table's order; consecutive rows of one oldest NCCL release share one
    ``#if NCCL_VERSION_CODE`` guard."""
    command = "python -m flowdsl.lowering.externs" + ("" if library == "support" else f" {library}")
    rows = [ext for ext in EXTERNS if ext.library == library]
    lines = [
        f"// Generated by `{command}` from flowdsl/lowering/externs.py.",
        "// Do not edit: change the table and regenerate.",
        "#pragma once",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <nccl_device.h>",
        "",
        "#define FLOWDSL_API extern \"C\" __device__",
        "",
        *(_coop_api_macro() if any(ext.coop and not ext.variants for ext in rows) else []),
    ]
    for i, ext in enumerate(rows):
        guard = ext.since > (2, 28, 9)
        if guard and (i == 0 or rows[i - 1].since != ext.since):
            lines.append(f"#if NCCL_VERSION_CODE >= {_nccl_code(ext.since)}")
        lines.append(f"// {ext.doc} (NCCL >= {'.'.join(map(str, ext.since))})")
        lines += _declarations(ext)
        if guard and (i == len(rows) - 1 or rows[i + 1].since != ext.since):
            lines.append("#endif")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - used by prebuilt/build.sh
    sys.stdout.write(render_header(*sys.argv[1:2]))
