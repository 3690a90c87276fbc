"""The one table of support-library functions, gathered from the primitives' specs, and what comes of it.

Every function the lowering calls in ``prebuilt/`` is one :class:`Extern` row
in :data:`EXTERNS`. A primitive's row is declared by its stub, in its spec
(``@primitive(extern=..., c=CFunction(...))``: :class:`flowdsl._spec.CFunction`);
this module adds the name and, from the spec's gate, the oldest NCCL, archs and
CUDA, and keeps only the rows no single primitive owns (:data:`INTERNAL`). Rows
are ordered by :func:`row_order`'s key (library, module, the stub's place in
its module), so the generated headers do not depend on import order. From this
table come: the numba declarations (``declarations.py``), the C prototype header ``prebuilt/include/flowdsl_support.h``
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

from .. import cft, coop, gin, lsa, team, wait  # their specs declare the rows
from .._spec import C_COMM, SPECS, CFunction, Spec
from ..enums import CoopKind
from ..errors import FlowDSLError

__all__ = ["Extern", "EXTERNS", "INTERNAL", "MODULES", "row_order", "C_TYPES", "COOP_SUFFIX", "REMOTE_VARIANTS",
           "PAYLOAD_SUFFIX", "CFT_SINCE", "CFT_ARCHS", "CFT_CUDA", "LIBRARIES", "COOP_API", "symbols", "render_header", "by_name"]

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


#: CFT needs NCCL 2.31, Blackwell (sm_100) and CUDA 13.3 (flowdsl.cft.GATE).
CFT_SINCE = cft.GATE.nccl
CFT_ARCHS = cft.GATE.archs
CFT_CUDA = cft.GATE.cuda
LIBRARIES = ("support", "gin", "cft")
#: GIN remote actions and put_value's payload suffixes (their rows' variants: flowdsl.gin).
REMOTE_VARIANTS = gin.REMOTE_VARIANTS
PAYLOAD_SUFFIX = gin.PAYLOAD_SUFFIX
#: The stub modules whose specs declare rows, in the order their rows are listed within a library (a module not
#: listed here comes after these, by name). Importing them registers their specs.
MODULES = (wait, coop, team, lsa, gin, cft)
_MODULE_ORDER = tuple(module.__name__ for module in MODULES)

#: Rows that belong to no single primitive: support calls the lowering makes itself (the device communicator's
#: fields, ``comm.rank`` ...). They come first in their library. A primitive's row is in its spec (``c=``).
INTERNAL = tuple(Extern(name, ret, args, doc) for name, ret, args, doc in (
    ("flowdsl_comm_rank", "int", (C_COMM,), "World rank of this device communicator."),
    ("flowdsl_comm_nranks", "int", (C_COMM,), "Number of world ranks."),
    ("flowdsl_comm_lsa_rank", "int", (C_COMM,), "Rank within this rank's LSA team."),
    ("flowdsl_comm_lsa_size", "int", (C_COMM,), "Number of ranks in this rank's LSA team."),
    ("flowdsl_comm_gin_context_count", "int", (C_COMM,),
     "GIN contexts a kernel may use (ncclDevComm::ginContextCount)."),
))


def _row(spec: Spec, c: CFunction) -> Extern:
    """The row of ``spec``'s C function ``c``: its oldest NCCL, archs and CUDA those of the spec's gate (``c.archs``:
    a C function that every build defines, whatever arch its caller needs)."""
    for key in (c.ret, *(key for key, _ in c.args)):
        if key not in C_TYPES:
            raise FlowDSLError(f"{spec.name}'s C function uses the C type {key!r}, which the extern table has not: "
                               f"use one of {sorted(C_TYPES)}")
    if c.library not in LIBRARIES:
        raise FlowDSLError(f"{spec.name}'s C function is in library {c.library!r}: use one of {LIBRARIES}")
    return Extern(c.name or spec.extern, c.ret, tuple(c.args), c.doc, coop=c.coop, since=spec.gate.nccl,
                  archs=spec.gate.archs if c.archs is None else c.archs, variants=tuple(c.variants),
                  library=c.library, cuda=spec.gate.cuda)


def row_order() -> list[tuple[tuple, Extern]]:
    """Every row with its sort key, in order. The key: the row's library (:data:`LIBRARIES`' order); then
    :data:`INTERNAL` rows (in their order), then each primitive's module (:data:`MODULES`' order, then others by
    name); then where the stub that declares the row is defined in its module; then the row's place in the
    stub's ``c=``. So the headers' order is the stubs' order, whatever imported them first."""
    keyed = [((LIBRARIES.index(ext.library), -1, "", i, 0), ext) for i, ext in enumerate(INTERNAL)]
    place: dict[str, int] = {}
    for spec in SPECS.values():
        module = spec.name.rpartition(".")[0]
        place[module] = place.get(module, -1) + 1
        rank = _MODULE_ORDER.index(module) if module in _MODULE_ORDER else len(_MODULE_ORDER)
        for j, c in enumerate(spec.c):
            ext = _row(spec, c)
            keyed.append(((LIBRARIES.index(ext.library), rank, module, place[module], j), ext))
    keyed.sort(key=lambda pair: pair[0])
    seen: dict[tuple, str] = {}
    for _, ext in keyed:
        for symbol in ext.symbols():
            if symbol in seen:
                raise FlowDSLError(f"Two rows declare the C function {symbol}: declare a C function once, in the "
                                   "first stub that calls it (c=), and name only extern= in the others")
            seen[symbol] = ext.name
    return keyed


#: Every support-library function: :data:`INTERNAL` and every spec's rows, in :func:`row_order`'s order.
EXTERNS: tuple[Extern, ...] = tuple(ext for _, ext in row_order())


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

    Rows follow the table's order (:func:`row_order`); consecutive rows of one oldest NCCL release share one
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
