"""List the public surface of NCCL's device API from its headers, and render flowdsl's coverage of it.

A list has one public name a line, sorted, with its kind; there is one per NCCL release flowdsl has
support builds for (:data:`RELEASES`): ``docs/nccl_device_surface.txt`` of the newest,
``docs/nccl_device_surface-<release>.txt`` of each older one (a release's names differ: 2.32.3 has a C
API for LLVM IR, ``ncclGin_C``, that 2.32.6 dropped; 2.32.6 adds Flow). The entries:

* ``field ncclDevCommRequirements.lsaBarrierCount``: a field of the host's requirements struct that
  users set (all but ``size``, ``magic`` and ``version``, which NCCL's header marks "attributes that
  users should never touch");
* ``function ncclGinBarrier``: a free function declared ``NCCL_DEVICE_INLINE`` or
  ``NCCL_HOST_DEVICE_INLINE`` (callable on the device), its overloads as one name;
* ``type ncclLsaBarrierSession``: a struct, class, enum, typedef or ``using`` alias a public header
  defines. A typedef that only renames another type (``ncclTeam_t`` for ``ncclTeam``) is listed under
  the type it renames;
* ``method ncclGin::put``: a public member function of a listed type (not its constructors, destructor
  or operators), overloads as one name. A class template that one template-free ``using`` alias of
  its header names is listed by that alias (``ncclGin`` for ``ncclGin_BackendMask<...>``);
* ``value ncclGinFenceLevel::Put``: an enumerator of a listed enum, always written ``Enum::Name``.

Where they come from: the public headers are ``nccl_device/*.h`` beside ``nccl_device.h`` but for
:data:`NOT_DEVICE_API` (the host API, whose requirements struct gives the fields, the network
plugin's header, the Windows stub and NCCL's own utilities). A type defined elsewhere in the family
(``impl/``, ``gin/``) is public when a public declaration names it (a signature, a template
parameter, a default argument, a public data member, a typedef): ``ncclDevComm``,
``ncclFlowProtocol``, ``ncclGinOptFlags``. One step only: the types those types hold are not. The
host API's structs (:data:`HOST_TYPES`: the requirements structs, ``ncclCommProperties``) are not
types of the device API wherever they are defined (host.h, or core.h in NCCL 2.30, which has no
host.h); the fields come from wherever the family defines ``ncclDevCommRequirements``.

Internal names are left out: anything ending in ``_internal`` or starting with ``_``, private
members, base classes, namespaces (``nccl::utility``), macros, data members, and ``#if
defined(NCCL_OS_WINDOWS)`` branches. Both branches of any other ``#if`` are read (the device compile
with and without extended lambdas declares the same names).

The parser is a tokenizer and a walk over declarations, enough for NCCL's headers (no libclang).

Usage::

    python scripts/nccl_device_surface.py            # write the installed NCCL's list, and the page
    python scripts/nccl_device_surface.py --markdown # write docs/nccl-coverage.md from the committed lists
    python scripts/nccl_device_surface.py --check    # exit 1, naming the differences, if any is stale

``--include DIR`` reads the headers of another NCCL (its list is the one of DIR's release);
``--release 2.32.3`` downloads that release's wheel for its headers (as ``prebuilt/build.sh`` does).
tests/compile/test_nccl_coverage.py runs the same checks, and fails while an entry of any list has
neither a flowdsl name nor a refusal in :mod:`flowdsl._nccl_coverage`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "docs" / "nccl_device_surface.txt"
#: The releases with a committed list: those flowdsl has support builds for (support_build.SUPPORTED_VERSIONS),
#: the newest last (its list is LIST).
RELEASES = ("2.28.9", "2.32.3", "2.32.6")
PAGE = ROOT / "docs" / "nccl-coverage.md"

#: Headers of nccl_device/ that are not the device API, with why.
NOT_DEVICE_API = {
    "host.h": "the host API; only ncclDevCommRequirements' fields are listed from it",
    "net_device.h": "the network plugin's interface (its types count where the device API names them)",
    "gin_win_stub.h": "the Windows stub of gin.h (no GIN on Windows)",
    "utility.h": "NCCL's own helpers (namespace nccl::utility) and macros",
}
REQUIREMENTS_STRUCT = "ncclDevCommRequirements"
#: The host API's structs: host.h's, and core.h's in releases without host.h (2.30).
HOST_TYPES = re.compile(r"nccl\w*Requirements(_t)?$|ncclCommProperties(_t)?$")
#: The versioning header every NCCL struct starts with ("attributes that users should never touch").
NOT_USER_FIELDS = ("size", "magic", "version")
#: Macros that mark a function as callable on the device.
DEVICE_MARKS = {"NCCL_DEVICE_INLINE", "NCCL_HOST_DEVICE_INLINE", "__device__"}
#: Identifiers that a parenthesis follows without making a function.
NOT_CALLS = {"decltype", "alignas", "alignof", "sizeof", "noexcept", "__attribute__", "static_assert", "__align__"}


# ---- tokens ---------------------------------------------------------------------------------------

_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[A-Za-z_]\w*|\d[\w.]*|::|->|\.\.\.|\S')


def _without_comments(text: str) -> str:
    # A comment becomes a space (or its newlines, so that lines keep their numbers); strings stay.
    return _COMMENT_OR_STRING.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else
                                  " " + "\n" * m.group(0).count("\n"), text)


def _windows_only(kind: str, condition: str) -> bool | None:
    """True if the branch is compiled on Windows only, False if everywhere but Windows, None if neither."""
    condition = re.sub(r"\s+", "", condition)
    if (kind == "ifdef" and condition == "NCCL_OS_WINDOWS") or condition in ("defined(NCCL_OS_WINDOWS)",
                                                                             "definedNCCL_OS_WINDOWS"):
        return True
    if (kind == "ifndef" and condition == "NCCL_OS_WINDOWS") or condition in ("!defined(NCCL_OS_WINDOWS)",
                                                                              "!definedNCCL_OS_WINDOWS"):
        return False
    return None


def tokens(text: str) -> list[str]:
    """The C++ tokens of a header: comments, preprocessor lines and Windows-only branches removed."""
    lines = _without_comments(text).replace("\\\n", " ").splitlines()
    kept, branches = [], []  # branches: [windows_only, in the #else part] of each open #if
    for line in lines:
        directive = re.match(r"\s*#\s*(\w+)\s*(.*)", line)
        if directive:
            kind, rest = directive.groups()
            if kind in ("if", "ifdef", "ifndef"):
                branches.append([_windows_only(kind, rest), False])
            elif kind in ("else", "elif") and branches:
                branches[-1][1] = True
            elif kind == "endif" and branches:
                branches.pop()
            continue
        # A branch is dropped when it compiles on Windows only: the #if of a Windows condition, or
        # the #else of a non-Windows one.
        if any(windows is not None and windows != in_else for windows, in_else in branches):
            continue
        kept.append(line)
    return _TOKEN.findall("\n".join(kept))


def _close(toks: list[str], i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes ``toks[i]`` (an ``open_``), parentheses nested inside."""
    depth, parens = 0, 0
    while i < len(toks):
        t = toks[i]
        if open_ != "(" and t == "(":
            parens += 1
        elif open_ != "(" and t == ")":
            parens -= 1
        elif parens == 0 and t == open_:
            depth += 1
        elif parens == 0 and t == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_!r}")


def _statement(toks: list[str], i: int) -> tuple[list[str], int]:
    """``(tokens, next index)`` of the statement at ``i``: up to ``;``, or up to a function's body ``{...}``."""
    depth = 0
    j = i
    while j < len(toks):
        t = toks[j]
        if t in "([":
            depth += 1
        elif t in ")]":
            depth -= 1
        elif depth == 0 and t == ";":
            return toks[i:j], j + 1
        elif depth == 0 and t == "{":
            if "(" not in toks[i:j]:  # a variable's brace initialiser, not a body
                j = _close(toks, j, "{", "}")
                continue
            end = _close(toks, j, "{", "}")
            return toks[i:j], end + (end < len(toks) and toks[end] == ";")
        j += 1
    return toks[i:j], j


def _call_name(stmt: list[str]) -> tuple[str, bool] | None:
    """``(name, qualified)`` of the function a statement declares, or None if it declares none."""
    depth = 0
    for j, t in enumerate(stmt):
        if t == "operator" and depth == 0:
            return "operator", False
        if t == "(" and depth == 0 and j and re.match(r"[A-Za-z_]", stmt[j - 1]) and stmt[j - 1] not in NOT_CALLS:
            return stmt[j - 1], j >= 2 and stmt[j - 2] == "::"
        if t in "([":
            depth += 1
        elif t in ")]":
            depth -= 1
    return None


def _split_commas(toks: list[str]) -> list[list[str]]:
    """``toks`` cut at the commas outside brackets and template arguments."""
    parts, part, depth, angles = [], [], 0, 0
    for k, t in enumerate(toks):
        if t in "([{":
            depth += 1
        elif t in ")]}":
            depth -= 1
        elif t == "<" and k and re.match(r"[A-Za-z_]", toks[k - 1]):  # template arguments, not a shift
            angles += 1
        elif t == ">" and angles:
            angles -= 1
        if t == "," and depth == 0 and angles == 0:
            parts.append(part)
            part = []
        else:
            part.append(t)
    parts.append(part)
    return parts


def _declarator_names(stmt: list[str]) -> list[str]:
    """Names a data-member statement declares (``int a, b;``, ``uint32_t x:8, y:8;``, ``T* p;``), or the
    enumerators of an enum's body."""
    names = []
    for part in _split_commas(stmt):
        cut = next((k for k, t in enumerate(part) if t in ("[", ":", "=")), len(part))
        idents = [t for t in part[:cut] if re.match(r"[A-Za-z_]\w*$", t)]
        if idents:
            names.append(idents[-1])
    return names


def _identifiers(toks) -> set[str]:
    return {t for t in toks if re.match(r"[A-Za-z_]\w*$", t)}


# ---- declarations -----------------------------------------------------------------------------------

@dataclass
class TypeInfo:
    """A type a header defines (or only declares, ``defined`` False)."""

    name: str
    header: str
    defined: bool = False
    template: bool = False
    enumerators: list[str] = field(default_factory=list)
    methods: set[str] = field(default_factory=set)
    fields: list[str] = field(default_factory=list)
    #: For a typedef or using alias: the one type it renames, if it only renames one.
    renames: str | None = None
    #: For a template-free using alias: the class template it instantiates.
    instantiates: str | None = None


@dataclass
class HeaderDecls:
    """What one header declares: its types, its device functions, and the identifiers its public parts name."""

    header: str
    types: dict[str, TypeInfo] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)
    named: set[str] = field(default_factory=set)

    def type(self, name: str, **facts) -> TypeInfo:
        """The record of type ``name``, with ``facts`` added (``defined`` is kept once true)."""
        info = self.types.setdefault(name, TypeInfo(name, self.header))
        for key, value in facts.items():
            if key == "defined":
                info.defined = info.defined or value
            elif value:
                setattr(info, key, value)
        return info


def internal(name: str) -> bool:
    """Whether a name is one of NCCL's internals by its spelling."""
    return name.startswith("_") or name.endswith("_internal")


class _Walker:
    """Walks a header's tokens, recording declarations into a :class:`HeaderDecls`."""

    def __init__(self, toks: list[str], decls: HeaderDecls):
        self.toks, self.decls = toks, decls

    def scope(self, i: int, end: int, cls: TypeInfo | None = None, public: bool = True) -> None:
        """Record the declarations of ``toks[i:end]``: a namespace's (``cls`` None) or a class's members."""
        toks = self.toks
        template = False
        while i < end:
            t = toks[i]
            if t == ";":
                i += 1
            elif t in ("public", "private", "protected") and toks[i + 1] == ":":
                public, i = t == "public", i + 2
            elif t == "namespace":  # NCCL's helpers (nccl::utility): not the API
                i = _close(toks, toks.index("{", i), "{", "}")
            elif t == "template":
                close = _close(toks, i + 1, "<", ">")
                # A template's parameters (their types, their defaults) belong to what it declares next.
                self.template_names = _identifiers(toks[i + 2:close - 1])
                template, i = True, close
                continue
            elif t in ("static_assert", "friend"):
                i = _statement(toks, i)[1]
            elif t in ("struct", "class", "union") and self._is_definition(i):
                i = self.record(i, cls, public, template)
            elif t == "enum":
                i = self.enum(i, cls, public)
            elif t == "typedef":
                i = self.typedef(i, cls, public)
            elif t == "using" and toks[i + 2] == "=":
                i = self.using(i, cls, public, template)
            else:
                i = self.declaration(i, cls, public)
            template = False
            self.template_names = set()

    template_names: set = set()

    def _name(self, toks) -> None:
        """Record the identifiers of a public declaration's tokens (and of its template parameters)."""
        self.decls.named |= _identifiers(toks) | self.template_names

    def _past_attributes(self, j: int) -> int:
        """Index past ``alignas(...)`` (``struct alignas(64) ncclFlowConnState``) at ``j``."""
        while self.toks[j] in ("alignas", "__align__", "__attribute__"):
            j = _close(self.toks, j + 1, "(", ")")
        return j

    def _is_definition(self, i: int) -> bool:
        """Whether ``struct ...`` at ``i`` defines or declares a type (not a data member's elaborated type)."""
        j = self._past_attributes(i + 1)
        if re.match(r"[A-Za-z_]", self.toks[j]) and self.toks[j] not in ("final",):
            j += 1
            if self.toks[j] == "<":
                j = _close(self.toks, j, "<", ">")
        return self.toks[j] in ("{", ":", ";", "final")

    def record(self, i: int, cls, public: bool, template: bool) -> int:
        """``struct Name [<args>] [: bases] { members } [declarators];`` or ``struct Name;``."""
        toks = self.toks
        j = self._past_attributes(i + 1)
        name = None
        if re.match(r"[A-Za-z_]", toks[j]) and toks[j] != "final":
            name, j = toks[j], j + 1
            if toks[j] == "<":
                j = _close(toks, j, "<", ">")
        listed = name is not None and cls is None and public and not internal(name)
        if toks[j] == ";":  # a forward declaration
            if listed:
                self.decls.type(name, template=template)
            return j + 1
        body = toks.index("{", j)  # base classes (between j and body) are the implementation's
        end = _close(toks, body, "{", "}")
        if listed:  # the members of others (internal, nested, private) are not the API
            self._name(())
            self.scope(body + 1, end - 1, self.decls.type(name, defined=True, template=template),
                       public=toks[i] != "class")
        return _statement(toks, end)[1]  # past declarators after the body: ``struct {...} field;``

    def enum(self, i: int, cls, public: bool) -> int:
        """``enum [class] [Name] [: type] { enumerators } [declarators];``."""
        toks = self.toks
        j = i + 1
        if toks[j] in ("class", "struct"):
            j += 1
        name = toks[j] if re.match(r"[A-Za-z_]", toks[j]) else None
        while toks[j] not in ("{", ";"):
            j += 1
        if toks[j] == ";":
            return j + 1
        end = _close(toks, j, "{", "}")
        enumerators = _declarator_names(toks[j + 1:end - 1])
        stmt, after = _statement(toks, end)
        alias = _declarator_names(stmt)
        if cls is None and public:
            self._name(toks[j + 1:end - 1])
            for type_name in filter(None, [name, *alias]):
                if not internal(type_name):
                    self.decls.type(type_name, defined=True, enumerators=enumerators)
                    break
        return after

    def typedef(self, i: int, cls, public: bool) -> int:
        """``typedef target Name;``, or ``typedef struct|enum [Tag] { ... } Name;``."""
        toks = self.toks
        j = i + 1
        if toks[j] in ("struct", "union", "enum") and self._is_definition(j) and "{" in toks[j:j + 4]:
            tag = toks[j + 1] if toks[j + 1] != "{" else None
            body = toks.index("{", j)
            end = _close(toks, body, "{", "}")
            stmt, after = _statement(toks, end)
            alias = _declarator_names(stmt)[0]
            if cls is None and public:
                if toks[j] == "enum":
                    self._name(toks[body + 1:end - 1])
                    self.decls.type(tag or alias, defined=True, enumerators=_declarator_names(toks[body + 1:end - 1]))
                else:
                    info = self.decls.type(tag or alias, defined=True)
                    self.scope(body + 1, end - 1, info)
                if tag and alias != tag:
                    self.decls.type(alias, defined=True, renames=tag)
            return after
        stmt, after = _statement(toks, i)
        names = _declarator_names(stmt[1:])
        if cls is None and public and names:
            target = [t for t in stmt[1:-1] if t not in ("struct", "union", "enum", "const")]
            renames = target[0] if len(target) == 1 and re.match(r"[A-Za-z_]", target[0]) else None
            self.decls.type(names[-1], defined=True, renames=renames)
            self._name(stmt[1:-1])
        return after

    def using(self, i: int, cls, public: bool, template: bool) -> int:
        """``using Name = target;``."""
        stmt, after = _statement(self.toks, i)
        name, target = stmt[1], stmt[3:]
        if cls is None and public and not internal(name):
            renames = target[0] if len(target) == 1 else None
            instantiates = target[0] if not template and len(target) > 1 and target[1] == "<" else None
            self.decls.type(name, defined=True, template=template, renames=renames, instantiates=instantiates)
            self._name(target)
        return after

    def declaration(self, i: int, cls, public: bool) -> int:
        """A function (a method in a class) or a variable (a data member)."""
        stmt, after = _statement(self.toks, i)
        call = _call_name(stmt)
        if not public:
            return after
        if call is None:  # a variable or data member
            if cls is not None:
                names = [n for n in _declarator_names(stmt) if not internal(n)]
                if names and "static" not in stmt:
                    cls.fields += names
                    self._name(stmt)
            return after
        name, qualified = call
        if name == "operator" or qualified or internal(name) or "delete" in stmt:
            return after
        if cls is None:
            if DEVICE_MARKS & set(stmt):
                self.decls.functions.add(name)
                self._name(stmt)
        else:
            self._name(stmt)
            if name != cls.name:  # not a constructor or the destructor
                cls.methods.add(name)
        return after


def read_header(path: Path, header: str) -> HeaderDecls:
    """The declarations of one header file."""
    decls = HeaderDecls(header)
    walker = _Walker(tokens(path.read_text()), decls)
    try:
        walker.scope(0, len(walker.toks))
    except (ValueError, IndexError) as exc:  # a construct this walker does not know
        raise SystemExit(f"Cannot read the declarations of {path}: {exc!r}") from exc
    return decls


# ---- the surface ------------------------------------------------------------------------------------

def installed_include_dir() -> Path | None:
    """The include directory of the installed ``nvidia-nccl-cu13`` wheel, or None."""
    sys.path.insert(0, str(ROOT))
    from flowdsl.runtime import support_build  # noqa: PLC0415 - the repository's own finder

    return support_build.installed_include_dir()


def nccl_version(include_dir: Path) -> str:
    """``major.minor.patch`` of the NCCL whose headers are in ``include_dir``."""
    text = (include_dir / "nccl.h").read_text()
    parts = [re.search(rf"#define\s+NCCL_{part}\s+(\d+)", text) for part in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise SystemExit(f"Cannot read the NCCL version of {include_dir / 'nccl.h'}")
    return ".".join(p.group(1) for p in parts)


def surface(include_dir: Path) -> list[str]:
    """The sorted entries (``kind name``) of the device API in ``include_dir``'s headers."""
    family = include_dir / "nccl_device"
    public = [read_header(p, p.name) for p in sorted(family.glob("*.h")) if p.name not in NOT_DEVICE_API]
    # Every type of the family, for the ones public declarations name (ncclDevComm in impl/, ...).
    everywhere: dict[str, TypeInfo] = {}
    enum_of: dict[str, str] = {}
    for path in sorted(family.rglob("*.h")):
        for info in read_header(path, path.relative_to(family).as_posix()).types.values():
            if info.defined:
                everywhere.setdefault(info.name, info)
                for value in info.enumerators:
                    enum_of.setdefault(value, info.name)
    requirements = everywhere.get(REQUIREMENTS_STRUCT)
    if requirements is None or not requirements.fields:
        raise SystemExit(f"No definition of struct {REQUIREMENTS_STRUCT} in {family}")

    entries = {f"field {REQUIREMENTS_STRUCT}.{name}" for name in requirements.fields if name not in NOT_USER_FIELDS}
    types: dict[str, TypeInfo] = {}
    named: set[str] = set()
    for decls in public:
        entries |= {f"function {name}" for name in decls.functions}
        named |= decls.named
        for info in decls.types.values():
            if info.defined and not HOST_TYPES.match(info.name):
                types.setdefault(info.name, info)
    named |= {enum_of[n] for n in named if n in enum_of}
    for name in sorted(named - set(types)):
        if name in everywhere and not internal(name) and not HOST_TYPES.match(name):
            types[name] = everywhere[name]
    # A rename is listed as what it renames; a class template by its one template-free alias.
    for info in list(types.values()):
        if info.renames:
            target = types.get(info.renames) or everywhere.get(info.renames)
            if target is not None:
                types.setdefault(target.name, target)
                del types[info.name]
    aliases = Counter(info.instantiates for info in types.values() if info.instantiates)
    shown = {info.instantiates: info.name for info in types.values() if aliases[info.instantiates] == 1}
    for info in types.values():
        entries.add(f"type {info.name}")
        owner = shown.get(info.name, info.name)
        entries |= {f"method {owner}::{m}" for m in info.methods}
        entries |= {f"value {info.name}::{v}" for v in info.enumerators}
    return sorted(entries, key=lambda e: (e.split(" ", 1)[1], e))


def list_text(entries: list[str], version: str) -> str:
    header = [
        "# The public surface of NCCL's device API: one name a line, with its kind.",
        f"# Generated from NCCL {version}'s headers by scripts/nccl_device_surface.py (see its docstring for what",
        "# counts); tests/compile/test_nccl_coverage.py checks it against the installed NCCL and checks that",
        "# flowdsl/_nccl_coverage.py gives each entry a flowdsl name or a refusal.",
    ]
    return "\n".join(header + entries) + "\n"


def list_path(release: str) -> Path:
    """The committed list of ``release``: :data:`LIST` for the newest of :data:`RELEASES`."""
    return LIST if release == RELEASES[-1] else LIST.with_name(f"nccl_device_surface-{release}.txt")


def read_lists() -> dict[str, list[str]]:
    """``{release: entries}`` of every committed list, oldest first."""
    out = {}
    for release in RELEASES:
        entries, version = read_list(list_path(release))
        if version != release:
            raise SystemExit(f"{list_path(release)} says it is NCCL {version}'s list, not {release}'s")
        out[release] = entries
    return out


def union(lists: dict[str, list[str]]) -> list[str]:
    """Every entry of any list, in the lists' order."""
    return sorted({e for entries in lists.values() for e in entries}, key=lambda e: (e.split(" ", 1)[1], e))


def read_list(path: Path = LIST) -> tuple[list[str], str | None]:
    """``(entries, NCCL version)`` of a committed list."""
    text = path.read_text()
    version = re.search(r"from NCCL (\S+)'s headers", text)
    return [line for line in text.splitlines() if line and not line.startswith("#")], version and version.group(1)


# ---- the coverage page ------------------------------------------------------------------------------

PAGE_INTRO = """\
# NCCL device API coverage

Every public name of NCCL's device API (the `nccl_device.h` headers of {version}: the releases flowdsl
has support builds for) beside the flowdsl name that provides it, or the reason flowdsl does not. The
lists of names, `docs/nccl_device_surface.txt` (the newest release) and
`docs/nccl_device_surface-<release>.txt`, are generated from each release's headers by
`scripts/nccl_device_surface.py` (its docstring says what counts as public); the flowdsl column
comes from `flowdsl/_nccl_coverage.py`, and this page from both
(`python scripts/nccl_device_surface.py --markdown`). CI (`tests/compile/test_nccl_coverage.py`)
fails when the installed NCCL's headers differ from its release's list (or, for a release without
one, from the newest list), when a name has neither a flowdsl name nor a refusal, when a flowdsl
name does not resolve, and when this page is stale: a new NCCL release's additions show up there.
The releases column says which releases declare a name ("all": every one listed).

Kinds: `field` of `ncclDevCommRequirements` (set through `comm.device_communicator(...)`
keywords), device `function`, `type`, `method` of a type, enum `value`.

{summary}
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(lists: dict[str, list[str]]) -> str:
    """The Markdown page: a row per entry of any list, with the releases that declare it and its coverage."""
    entries = union(lists)
    sets = {release: set(names) for release, names in lists.items()}
    sys.path.insert(0, str(ROOT))
    from flowdsl import _nccl_coverage as coverage  # noqa: PLC0415 - the table lives in the package

    counts = Counter(coverage.category(entry) for entry in entries)
    tally = ", ".join(f"{counts[what]} {what}" for what in coverage.CATEGORIES)
    missing = f", {counts['missing']} **missing**" if counts["missing"] else ""
    summary = [f"Of the {len(entries)} names, {tally}{missing}.", "",
               "Names per release: " + ", ".join(f"{release} {len(names)}" for release, names in lists.items()) +
               ".", "",
               "What is not yet there, and how many names each item covers:", ""]
    not_yet = Counter(coverage.COVERAGE[entry].reason for entry in entries
                      if coverage.category(entry) == coverage.NOT_YET)
    summary += [f"* {reason} ({count})" for reason, count in sorted(not_yet.items(), key=lambda rc: (-rc[1], rc[0]))]
    rows = ["| NCCL name | kind | releases | flowdsl | note |", "| --- | --- | --- | --- | --- |"]
    for entry in entries:
        kind, name = entry.split(" ", 1)
        got = coverage.COVERAGE.get(entry)
        if isinstance(got, coverage.Provided):
            flowdsl, note = f"`{got.name}`", got.note
        elif isinstance(got, coverage.Refused):
            flowdsl, note = f"— ({got.category})", got.reason
        else:
            flowdsl, note = "**missing**", "no flowdsl name and no refusal in flowdsl/_nccl_coverage.py"
        having = [release for release in lists if entry in sets[release]]
        releases = "all" if len(having) == len(lists) else ", ".join(having)
        rows.append(f"| `{name}` | {kind} | {releases} | {_cell(flowdsl)} | {_cell(note)} |")
    version = "NCCL " + ", ".join(lists)
    return PAGE_INTRO.format(version=version, summary="\n".join(summary)) + \
        "\n" + "\n".join(rows) + "\n"


# ---- the command line -------------------------------------------------------------------------------

def list_for(version: str) -> Path:
    """The list the headers of NCCL ``version`` are compared with: its own, else the newest (a new release)."""
    return list_path(version) if version in RELEASES else LIST


def differences(committed: list[str], current: list[str], name: str = LIST.name) -> list[str]:
    """Lines saying what the headers have that the list ``name`` lacks (``+``) and the reverse (``-``)."""
    return ([f"+ {e}  (in the headers, not in {name})" for e in sorted(set(current) - set(committed))] +
            [f"- {e}  (in {name}, not in the headers)" for e in sorted(set(committed) - set(current))])


def check(include_dir: Path | None) -> list[str]:
    """What is stale (``include_dir``'s release's list against its headers, the page against the lists); []
    if nothing."""
    problems = []
    if include_dir is None:
        print("No installed NCCL headers (nvidia-nccl-cu13): no list is compared with any.")
    else:
        version = nccl_version(include_dir)
        path = list_for(version)
        if version not in RELEASES:
            print(f"NCCL {version} has no list; comparing its headers with the newest ({RELEASES[-1]}'s).")
        found = differences(read_list(path)[0], surface(include_dir), path.name)
        if found:
            problems.append(f"{path.relative_to(ROOT)} differs from NCCL {version}'s headers ({include_dir}); "
                            "rerun python scripts/nccl_device_surface.py --include DIR (a new release: add it "
                            "to RELEASES):\n  " + "\n  ".join(found))
    if PAGE.read_text() != render(read_lists()):
        problems.append(f"{PAGE.relative_to(ROOT)} is stale: python scripts/nccl_device_surface.py --markdown")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the list or the page is stale")
    parser.add_argument("--markdown", action="store_true", help="write only the page, from the committed list")
    parser.add_argument("--include", type=Path, help="NCCL's include directory (default: the installed wheel's)")
    parser.add_argument("--release", help="download this release's nvidia-nccl-cu13 wheel for its headers")
    args = parser.parse_args(argv)
    if args.release:
        import tempfile  # noqa: PLC0415

        sys.path.insert(0, str(ROOT))
        from flowdsl.runtime import support_build  # noqa: PLC0415

        workdir = Path(tempfile.mkdtemp(prefix="nccl-headers-"))
        args.include = support_build._fetch_headers(args.release, workdir)[0]  # noqa: SLF001 - the build's fetcher
    include_dir = args.include or installed_include_dir()
    if args.check:
        problems = check(include_dir)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    if not args.markdown:
        if include_dir is None:
            print("No NCCL headers: install nvidia-nccl-cu13 or pass --include DIR", file=sys.stderr)
            return 1
        version = nccl_version(include_dir)
        list_for(version).write_text(list_text(surface(include_dir), version))
    PAGE.write_text(render(read_lists()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
