"""The kernel disk cache: a key that covers everything a kernel's code depends on, and checked entries.

A compiled kernel depends on more than the file that defines it: on the device
functions it reaches in any module, on the values numba freezes into the code (module
globals and closure cells: numbers, tuples, NumPy scalars and arrays, enums), and on
flowdsl's lowering. numba-cuda's own cache index hashes only the function's ``co_code``
and its pickled closure, and trusts the defining file's time stamp; it follows no
dependency and refuses code without a file. So :func:`dependency_digest` walks the
kernel's bytecode: the code objects (constants included, recursively), the globals and
closure values it loads (attribute chains such as ``helpers.scale`` resolved), and
every function reached that way, in any module. Code without a source file (``exec``, a
notebook cell) is keyed by its code objects. A value it cannot hash reliably raises
:class:`Uncacheable`: the kernel is then compiled in memory, never served from disk.

What flowdsl's own device-side modules hold is covered by the digest of their sources
(part of the key); their module globals are constants written in those sources.

An entry is a cubin named by its content (``KEY-CRC.cubin``) and, written after it,
the record ``KEY.json`` naming it with its size and CRC-32; each file is renamed into
place whole, so ranks that compile the same kernel at once never pair one's record
with another's cubin. :func:`read_entry` detects a damaged entry (one warning naming
the file) and the caller rebuilds it; :func:`write_entry` falls back to memory, with
one warning per directory, when the cache cannot be written.
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import enum
import functools
import hashlib
import importlib
import inspect
import json
import os
import sys
import threading
import types as pytypes
import warnings
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ._release import format_version
from ._version import __version__
from .errors import CacheWarning, FlowDSLError

if TYPE_CHECKING:
    from .lowering.target import Target

__all__ = ["Uncacheable", "dependency_digest", "package_digest", "read_entry", "write_entry", "warn", "ENTRY_FORMAT",
           "kernel_key", "backend_key", "kernel_root"]

#: Version of the entry layout; part of every key, so older entries are never read.
ENTRY_FORMAT = 2

_ROOT = Path(__file__).parent

#: flowdsl sources that cannot change a compiled kernel (host side, simulator, examples, tests).
_HOST_ONLY = ("sim/", "runtime/", "examples/", "__main__.py", "testing.py", "torch.py", "collectives/_host.py",
              "collectives/_config.py", "collectives/_library.py", "collectives/cost.py", "collectives/check.py", "collectives/__init__.py",
              "_cache.py")

#: Packages whose objects are keyed by name: their versions are part of the key.
_VERSIONED = frozenset(("builtins", "numpy", "numba", "numba_cuda", "llvmlite", "math", "cmath", "operator",
                        "ctypes", "cuda", "_operator", "_ctypes"))


class Uncacheable(FlowDSLError):
    """A kernel depends on a value whose content cannot be hashed reliably; it is not cached on disk.
    ``device_array``: that value is GPU memory (its address would be frozen into the code)."""

    def __init__(self, message: str, device_array: bool = False):
        super().__init__(message)
        self.device_array = device_array


@functools.cache
def package_digest() -> str:
    """sha256 of flowdsl's Python sources that device code is built from."""
    h = hashlib.sha256()
    for path in sorted(_ROOT.rglob("*.py")):
        rel = path.relative_to(_ROOT).as_posix()
        if rel.startswith(_HOST_ONLY):
            continue
        h.update(rel.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1024)
def _owned_file(filename: str) -> bool:
    """True when ``filename`` is one of flowdsl's device-side sources (covered by :func:`package_digest`)."""
    try:
        rel = Path(filename).resolve().relative_to(_ROOT.resolve()).as_posix()
    except (ValueError, OSError):
        return False
    return rel.endswith(".py") and not rel.startswith(_HOST_ONLY)


def _owned_module(module) -> bool:
    file = getattr(module, "__file__", None)
    return bool(file) and _owned_file(file)


def _owned_name(module_name: str | None) -> bool:
    module = sys.modules.get(module_name or "")
    return module is not None and _owned_module(module)


def _versioned(module_name: str | None) -> bool:
    return (module_name or "").partition(".")[0] in _VERSIONED


_LOADS = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF")
_TRANSPARENT = ("CACHE", "PRECALL", "EXTENDED_ARG")  # between a load and its attribute, changing nothing


@functools.lru_cache(maxsize=8192)
def _chains(code, kind: str | None = None) -> tuple:
    """Names the code loads and the attributes it reads from them: ``("g", "helpers", "scale")``.

    ``g``: a global (or builtin), ``d``: a closure cell (``kind`` picks one). Every prefix
    of a chain is listed; nested code (inner functions, comprehensions) counts too.
    """
    if kind is not None:
        return tuple(chain for chain in _chains(code) if chain[0] == kind)
    out = set()
    chain = None
    for instr in dis.get_instructions(code):
        if instr.opname in _LOADS:
            chain = ("g" if instr.opname in ("LOAD_GLOBAL", "LOAD_NAME") else "d", instr.argval)
        elif instr.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain is not None:
            chain = (*chain, instr.argval)
        else:
            if instr.opname not in _TRANSPARENT:
                chain = None
            continue
        out.add(chain)
    for const in code.co_consts:
        if inspect.iscode(const):
            out.update(_chains(const))
    return tuple(sorted(out))


def _code_digest(code, lineinfo: bool) -> bytes:
    """sha256 of what a code object compiles to: bytecode, constants (recursively), names.

    Line numbers and the file name count only with ``lineinfo`` (they are in the cubin then).
    """
    return _code_digest_of(code, code.co_filename if lineinfo else None)


@functools.lru_cache(maxsize=4096)
def _code_digest_of(code, filename: str | None) -> bytes:
    # Equal code objects may come from different files: the file name is part of the memo key.
    h = hashlib.sha256()
    for part in (code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                 code.co_flags, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        h.update(repr(part).encode())
        h.update(b"\0")
    h.update(code.co_code)
    h.update(getattr(code, "co_exceptiontable", b""))
    for const in code.co_consts:
        h.update(_code_digest(const, filename is not None) if inspect.iscode(const) else _const_token(const))
    if filename is not None:
        h.update(f"{filename}:{code.co_firstlineno}".encode())
        h.update(getattr(code, "co_linetable", b"") or code.co_lnotab)
    return h.digest()


def _const_token(value) -> bytes:
    """A code constant (numbers, strings, bytes, tuples and frozensets of them, None, Ellipsis)."""
    if isinstance(value, (tuple, frozenset)):
        items = sorted(_const_token(v) for v in value) if isinstance(value, frozenset) else \
            [_const_token(v) for v in value]
        return f"{type(value).__name__}(".encode() + b",".join(items) + b")"
    return f"{type(value).__name__}:{value!r}".encode()


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, mtime_ns: int, size: int) -> bytes:
    return hashlib.sha256(Path(path).read_bytes()).digest()


class _Walker:
    """One walk from a kernel over what its code reaches; ``h`` collects the digest."""

    def __init__(self, lineinfo: bool):
        self.lineinfo = lineinfo
        self.h = hashlib.sha256()
        self.functions: dict[int, bytes] = {}
        self.modules: set[str] = set()
        self.overload_index: dict | None = None  # id(function) -> numba-cuda's overload templates of it

    # -- functions -----------------------------------------------------------------------------
    def function(self, fn, where: str) -> bytes:
        """Digest of a Python function: its code, defaults, closure values and the globals it loads."""
        done = self.functions.get(id(fn))
        if done is not None:
            return done
        self.functions[id(fn)] = f"recursive:{fn.__module__}.{fn.__qualname__}".encode()  # until done
        code = fn.__code__
        h = hashlib.sha256(_code_digest(code, self.lineinfo))
        h.update(f"inline={getattr(fn, '__flowdsl_inline__', None)}".encode())
        # Its own options (fast math, debug, ...); fast math keeps the word it always had, so other keys stay
        for option, value in sorted(getattr(fn, "__flowdsl_jit_options__", {}).items()):
            h.update(b"fastmath" if option == "fastmath" else f"{option}={value}".encode())
        declared = getattr(getattr(fn, "overloads", None), "declared", None)  # a call converts to those types
        if declared is not None and hasattr(fn, "__flowdsl_jit_options__"):
            h.update(f"declared={declared!r}".encode())
        h.update(self.value(fn.__defaults__, f"{where}'s defaults"))
        h.update(self.value(fn.__kwdefaults__, f"{where}'s defaults"))
        h.update(self._closure(fn, where))
        if _owned_file(code.co_filename):  # flowdsl's globals are constants of its sources: once a process
            memo_key = (code, code.co_filename, self.lineinfo)  # equal code objects may live in two modules
            memo = _OWNED_GLOBALS.get(memo_key)
            if memo is None:
                memo = _OWNED_GLOBALS[memo_key] = self._globals(fn, where)
            h.update(memo)
        else:
            h.update(self._globals(fn, where))
            if not hasattr(fn, "__flowdsl_jit_options__"):  # a device function's overload is flowdsl's own
                h.update(self._overloads(fn, where))
            if fn.__module__ in sys.modules:
                self.modules.add(fn.__module__)
        digest = h.digest()
        self.functions[id(fn)] = digest
        return digest

    def _overloads(self, fn, where: str) -> bytes:
        """numba-cuda's ``@overload`` (and ``register_jitable``) implementations registered for ``fn``, with their
        options: a call of ``fn`` compiles those, not ``fn``'s own body."""
        if self.overload_index is None:
            self.overload_index = _overload_templates()
        h = hashlib.sha256()
        for template in self.overload_index.get(id(fn), ()):
            impl = template._overload_func
            inline = getattr(template._inline, "_inline", template._inline)  # "never", "always" or a cost model
            options = [sorted((template._jit_options or {}).items()), template._strict,
                       inline if isinstance(inline, str) else None, getattr(template, "prefer_literal", None)]
            h.update(f"overload:{options!r}:".encode())
            if isinstance(inline, pytypes.FunctionType):
                h.update(self.function(inline, f"{where}'s overload's inline cost model"))
            if isinstance(impl, pytypes.FunctionType) and not _owned_file(impl.__code__.co_filename):
                h.update(self.function(impl, f"{where}'s overload {impl.__qualname__}"))
        return h.digest()

    def _closure(self, fn, where: str) -> bytes:
        """The closure cells' values, and what the code reads through the cells that hold modules or classes."""
        h = hashlib.sha256()
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        for name, cell in cells.items():
            try:
                contents = cell.cell_contents
            except ValueError:
                h.update(f"{name}:<empty>".encode())
                continue
            if not isinstance(contents, (pytypes.ModuleType, type)):  # modules and classes: via their chains
                h.update(name.encode() + b"=" + self.value(contents, f"{where} captures {name}"))
        for _, name, *attrs in _chains(fn.__code__, "d"):
            cell = cells.get(name)
            if cell is None:  # a cell of the function itself (a local variable)
                continue
            try:
                start = cell.cell_contents
            except ValueError:
                continue
            label = ".".join((name, *attrs))
            h.update(f"d:{label}=".encode() + self.chain(start, attrs, f"{where} reads {label}"))
        return h.digest()

    def _globals(self, fn, where: str) -> bytes:
        """The module globals (and builtins) the code loads, through their attribute chains."""
        h = hashlib.sha256()
        for _, name, *attrs in _chains(fn.__code__, "g"):
            if name in fn.__globals__:
                start = fn.__globals__[name]
            elif hasattr(builtins, name):
                start = getattr(builtins, name)
            else:
                h.update(f"g:{name}:<missing>".encode())
                continue
            label = ".".join((name, *attrs))
            h.update(f"g:{label}=".encode() + self.chain(start, attrs, f"{where} reads {label}"))
        return h.digest()

    def chain(self, value, attrs, where: str) -> bytes:
        """Token of ``value.attrs...``: through user modules and classes to the value the code uses.

        What numba and NumPy hold is keyed by their versions, what flowdsl's device-side
        modules and classes hold by their sources: the walk stops there.
        """
        for i, attr in enumerate(attrs):
            if isinstance(value, pytypes.ModuleType):
                if _versioned(value.__name__):
                    return f"module:{value.__name__}".encode()
                if _owned_module(value):
                    return f"flowdsl:{value.__name__}.{'.'.join(attrs[i:])}".encode()
            elif isinstance(value, type):
                if _versioned(value.__module__) or _owned_name(value.__module__):
                    return self.value(value, where)
            else:  # an instance (``array.shape``): its content is what counts
                break
            try:
                value = getattr(value, attr)
            except AttributeError:
                return f"missing:{attr}".encode()
        return self.value(value, where)

    # -- values --------------------------------------------------------------------------------
    def value(self, value, where: str) -> bytes:
        """Token of a value numba may freeze into the code: by content, or :class:`Uncacheable`."""
        if isinstance(value, enum.Enum):  # before numbers: an IntEnum member is an int too
            return f"enum:{_type_name(type(value))}.{value.name}=".encode() + self.value(value.value, where)
        if value is None or value is Ellipsis or isinstance(value, (bool, int, float, complex, str, bytes)):
            return f"{type(value).__name__}:{value!r}".encode()
        if isinstance(value, (tuple, list)):
            fields = getattr(type(value), "_fields", None)
            head = f"{_type_name(type(value))}{fields!r}(" if type(value) not in (tuple, list) else \
                f"{type(value).__name__}("
            return head.encode() + b",".join(self.value(v, where) for v in value) + b")"
        if isinstance(value, (set, frozenset)):
            return b"set(" + b",".join(sorted(self.value(v, where) for v in value)) + b")"
        if isinstance(value, pytypes.FunctionType):
            return self._function_token(value, where)
        if isinstance(value, pytypes.ModuleType):
            return f"module:{value.__name__}".encode()
        if isinstance(value, type):
            return self._class_token(value, where)
        token = _numpy_token(value)
        if token is not None:
            return token
        return self._object_token(value, where)

    def _function_token(self, fn, where: str) -> bytes:
        if fn.__closure__ is None and _owned_file(fn.__code__.co_filename):
            return f"flowdsl-function:{fn.__module__}.{fn.__qualname__}".encode()
        if fn.__closure__ is None and _versioned(fn.__module__):
            return f"function:{fn.__module__}.{fn.__qualname__}".encode()
        return b"function:" + self.function(fn, f"{fn.__module__}.{fn.__qualname__}")

    def _class_token(self, cls, where: str) -> bytes:
        name = _type_name(cls)
        if _versioned(cls.__module__) or _owned_name(cls.__module__):
            return f"class:{name}".encode()
        if issubclass(cls, enum.Enum):
            return f"enum-class:{name}(".encode() + b",".join(
                f"{m.name}=".encode() + self.value(m.value, where) for m in cls) + b")"
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return f"namedtuple:{name}{cls._fields!r}".encode()
        raise Uncacheable(f"{where}, the class {name}")

    def _object_token(self, value, where: str) -> bytes:
        from numba.core import types as nbtypes  # noqa: PLC0415

        if isinstance(value, nbtypes.Type):
            return f"numba-type:{value!r}".encode()
        py_func = getattr(value, "py_func", None)  # numba-cuda dispatchers and flowdsl kernels
        if isinstance(py_func, pytypes.FunctionType):
            options = getattr(value, "targetoptions", None)
            # A dispatcher whose compilation is disabled (declared signatures) types calls by those alone: a call
            # numba then refuses must not find the entry of the same function made without them
            fixed = sorted(map(str, getattr(value, "signatures", ()))) if getattr(value, "_can_compile", True) is False \
                else None
            return (f"dispatcher:{_type_name(type(value))}:{sorted((options or {}).items())!r}:{fixed!r}:".encode()
                    + self.function(py_func, where))
        defn = getattr(value, "_defn", None)  # numba @intrinsic
        if isinstance(defn, pytypes.FunctionType):
            return b"intrinsic:" + self.function(defn, where)
        if _versioned(type(value).__module__) and isinstance(value, (pytypes.BuiltinFunctionType,
                                                                     pytypes.MethodWrapperType)):
            return f"builtin:{getattr(value, '__module__', '')}.{value.__qualname__}".encode()
        if type(value).__name__ == "ufunc":
            return f"ufunc:{value.__name__}".encode()
        if type(value).__name__ == "ExternFunction":  # cuda.declare_device: the linked files' contents count
            links = [_link_token(link, where) for link in getattr(value, "link", ())]
            return f"extern:{value.name}:{value.sig!r}:".encode() + b",".join(links)
        raise Uncacheable(f"{where}, a {_type_name(type(value))}",
                          device_array=hasattr(value, "__cuda_array_interface__"))

    # -- modules -------------------------------------------------------------------------------
    def module_sources(self) -> bytes:
        """sha256 of the files of the user modules whose functions were reached (their overloads count)."""
        h = hashlib.sha256()
        for name in sorted(self.modules):
            file = getattr(sys.modules.get(name), "__file__", None)
            if not file or not file.endswith(".py"):
                continue
            try:
                st = os.stat(file)
                h.update(name.encode() + _file_digest(file, st.st_mtime_ns, st.st_size))
            except OSError:
                continue
        return h.digest()


#: (code, file, lineinfo) of flowdsl's own functions -> digest of the globals they load.
_OWNED_GLOBALS: dict = {}


def _type_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _link_token(link, where: str) -> bytes:
    if isinstance(link, (str, os.PathLike)) and os.path.isfile(link):
        st = os.stat(link)
        return _file_digest(os.fspath(link), st.st_mtime_ns, st.st_size)
    raise Uncacheable(f"{where}, an external function linking {link!r}")


def _numpy_token(value):
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return None
        layout = "C" if value.flags.c_contiguous else "F" if value.flags.f_contiguous else "A"
        data = np.ascontiguousarray(value)
        return (f"ndarray:{value.dtype.descr!r}:{value.shape}:{layout}:".encode()
                + hashlib.sha256(data.view(np.uint8).reshape(-1) if data.size else b"").digest())
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return f"numpy:{value.dtype.str}:".encode() + value.tobytes()
    if isinstance(value, np.dtype):
        return f"dtype:{value.str}:{value.descr!r}".encode()
    return None


def _overload_templates() -> dict:
    """``{id(function): [numba-cuda overload template, ...]}`` of the functions overloaded so far (none before
    numba-cuda's typing is imported: nothing can be overloaded then)."""
    registry = sys.modules.get("numba.cuda.typing.templates")
    index: dict = {}
    if registry is None:
        return index
    for value, typ in list(registry.builtin_registry.globals):
        for template in getattr(typ, "templates", ()):
            if hasattr(template, "_overload_func"):
                index.setdefault(id(value), []).append(template)
    return index


def dependency_digest(fn, *, lineinfo: bool = False) -> str:
    """sha256 of everything ``fn``'s compiled code depends on outside flowdsl and numba.

    Raises:
        Uncacheable: ``fn`` reaches a value that cannot be hashed reliably (the message
            names where it was found and its type).
    """
    walker = _Walker(lineinfo)
    walker.h.update(walker.function(fn, f"{fn.__module__}.{fn.__qualname__}"))
    walker.h.update(walker.module_sources())
    return walker.h.hexdigest()


# -- entries ---------------------------------------------------------------------------------
def warn(message: str) -> None:
    """A :class:`CacheWarning` attributed to the first caller outside flowdsl."""
    frame, level = sys._getframe(1), 2
    while frame is not None and _inside_flowdsl(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, CacheWarning, stacklevel=level)


@functools.lru_cache(maxsize=256)
def _inside_flowdsl(filename: str) -> bool:
    try:
        Path(filename).resolve().relative_to(_ROOT.resolve())
    except (ValueError, OSError):
        return False
    return True


_WARNED_DIRS: set[str] = set()


def read_entry(root: Path, key: str) -> tuple[bytes, dict] | None:
    """``(cubin, metadata)`` of ``key``, or None when absent or damaged (one warning names the file)."""
    meta_path = root / f"{key}.json"
    try:
        text = meta_path.read_bytes()
    except FileNotFoundError:
        return None  # a writer that died after the cubin leaves no record: not an entry
    except OSError:
        return None  # an unreadable directory: compile, and the write says why it fails
    try:
        meta = json.loads(text)
        problem = _meta_problem(meta, key)
        if problem is None:
            cubin = (root / meta["cubin"]).read_bytes()
            problem = _cubin_problem(cubin, meta)
    except (ValueError, UnicodeDecodeError) as exc:
        problem = f"its metadata is not valid JSON ({exc})"
    except OSError as exc:
        problem = f"its cubin cannot be read ({exc.strerror or exc})"
    if problem is None:
        return cubin, meta
    warn(f"Damaged kernel cache entry {meta_path}: {problem}. Rebuilding it.")
    for path in (meta_path, *root.glob(f"{key}-*.cubin")):  # the rebuilt entry replaces them
        with contextlib.suppress(OSError):
            path.unlink()
    return None


def _cubin_name(key: str, cubin: bytes) -> str:
    """Named by its content: writers of one key never replace each other's cubin under a record."""
    return f"{key}-{zlib.crc32(cubin):08x}.cubin"


def _meta_problem(meta, key: str) -> str | None:
    if not isinstance(meta, dict):
        return f"its metadata is a {type(meta).__name__}, not an object"
    expected = {"format": int, "key": str, "entry_name": str, "features": list, "cubin": str, "cubin_bytes": int,
                "cubin_crc32": int}
    missing = [name for name, kind in expected.items() if not isinstance(meta.get(name), kind)]
    if missing:
        return f"its metadata lacks {', '.join(missing)}"
    if meta["format"] != ENTRY_FORMAT or meta["key"] != key:
        return f"its metadata is for format {meta['format']} key {meta['key']}"
    if not meta["entry_name"] or not all(isinstance(f, str) for f in meta["features"]):
        return "its metadata names no kernel"
    if not (meta["cubin"].startswith(f"{key}-") and meta["cubin"].endswith(".cubin") and "/" not in meta["cubin"]):
        return f"its metadata names the cubin {meta['cubin']!r}"
    return None


def _cubin_problem(cubin: bytes, meta: dict) -> str | None:
    if len(cubin) != meta["cubin_bytes"]:
        return f"the cubin has {len(cubin)} bytes, {meta['cubin_bytes']} were written"
    if zlib.crc32(cubin) != meta["cubin_crc32"]:
        return "the cubin's checksum does not match"
    return None


def write_entry(root: Path, key: str, cubin: bytes, entry_name: str, features, compile_warnings=()) -> bool:
    """Store an entry: the cubin, then the record naming it; False when ``root`` cannot be written.
    ``compile_warnings``: what the compile warned (:func:`recorded_warnings`), said again at each load.

    Each file appears whole (written aside, then renamed). The first failure for a
    directory warns once; the kernel then runs from memory.
    """
    name = _cubin_name(key, cubin)
    meta = {"format": ENTRY_FORMAT, "key": key, "entry_name": entry_name, "features": sorted(features),
            "cubin": name, "cubin_bytes": len(cubin), "cubin_crc32": zlib.crc32(cubin),
            "warnings": list(compile_warnings)}
    try:
        root.mkdir(parents=True, exist_ok=True)
        for path, data in ((root / name, cubin), (root / f"{key}.json", json.dumps(meta).encode())):
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                tmp.write_bytes(data)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
    except OSError as exc:
        if str(root) not in _WARNED_DIRS:
            _WARNED_DIRS.add(str(root))
            warn(f"Cannot write the kernel cache {root}: {exc.strerror or exc}. Kernels are compiled in "
                 "memory for this process; set FLOWDSL_CACHE_DIR to a writable directory to keep them.")
        return False
    return True


def recorded_warnings(caught) -> list[dict]:
    """What a compile warned (``warnings.catch_warnings(record=True)``'s list), as an entry keeps it: numba's
    diagnostics (an uninitialised variable, ...) would otherwise be said by the first compile only."""
    return [{"category": f"{w.category.__module__}:{w.category.__qualname__}",
             "message": str(w.message), "filename": w.filename, "lineno": w.lineno} for w in caught]


def warn_again(recorded) -> None:
    """Say the warnings of an entry's compile (:func:`recorded_warnings`) again, where they were said first, in
    their words and class (a UserWarning when the class no longer imports)."""
    for w in recorded:
        module, _, qualname = str(w.get("category", "")).partition(":")
        try:
            category = functools.reduce(getattr, qualname.split("."), importlib.import_module(module))
        except (ImportError, AttributeError, ValueError):
            category = UserWarning
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        message = category.__new__(category)  # the text as said, not through the class's constructor (numba's
        Warning.__init__(message, str(w.get("message", "")))  # colours its text there)
        warnings.warn_explicit(message, category, str(w.get("filename", "")), int(w.get("lineno") or 0))


# -- the key of a flowdsl kernel --------------------------------------------------------------------

def kernel_key(kernel, argtypes, target: Target, support) -> str:
    """The disk-cache key of flowdsl ``kernel`` for ``argtypes`` and ``target`` (``support``: its support build).

    Computed at each compile or load (not once per kernel): numba freezes the globals'
    values at compile time, so a value changed since counts. Raises :class:`Uncacheable`.
    """
    fn = kernel.py_func
    payload = json.dumps({
        "format": ENTRY_FORMAT, "flowdsl": __version__, "versions": _versions(),
        "numba_config": _numba_config(),
        "code": dependency_digest(fn, lineinfo=kernel.lineinfo),
        "flowdsl_sources": package_digest(), "qualname": fn.__qualname__,
        "module": fn.__module__, "args": [str(t) for t in argtypes],
        "nccl": format_version(target.nccl), "arch": target.arch,
        "support": _digest_of(support.ltoir), "cft": _cft_digest(target), "gin": _gin_digest(target),
        "options": [kernel.fastmath, kernel.lineinfo, kernel.max_registers, getattr(kernel, "launch_bounds", None),
                    getattr(kernel, "opt", True)],
        "link": [_link_digest(item) for item in getattr(kernel, "link", ())],
    }, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _link_digest(item) -> str:
    """sha256 of what a ``link=`` item holds (a file's bytes, a ``LinkableCode``'s data): an edited file is a
    new kernel."""
    data = getattr(item, "data", None)
    if data is None:
        try:
            data = Path(item).read_bytes()
        except OSError as exc:
            raise Uncacheable(f"the link= file {item!r} cannot be read ({exc})") from None
    return hashlib.sha256(data if isinstance(data, bytes) else str(data).encode()).hexdigest()


def kernel_root() -> Path:
    from .runtime.support import cache_dir  # noqa: PLC0415

    return cache_dir() / "kernels"


_DIGESTS: dict = {}


def _digest_of(data: bytes) -> str:
    """sha256 of a support build, once per process (it is megabytes, hashed per kernel otherwise)."""
    key = (id(data), len(data))
    hit = _DIGESTS.get(key)
    if hit is None or hit[0] is not data:
        hit = _DIGESTS[key] = (data, hashlib.sha256(data).hexdigest())
    return hit[1]


@functools.cache
def _versions() -> dict:
    """Versions of what compiles a kernel (what they key by name is theirs)."""
    import numpy  # noqa: PLC0415

    from .lowering import backend  # noqa: PLC0415
    from .lowering.target import linker_cuda_version  # noqa: PLC0415

    return {**backend.versions(), "numpy": numpy.__version__, "python": list(sys.version_info[:2]),
            "nvjitlink": list(linker_cuda_version())}


def _numba_config() -> list:
    """numba-cuda settings that change generated code (from NUMBA_* variables)."""
    from .lowering.backend import codegen_settings  # noqa: PLC0415

    return codegen_settings()


def _cft_digest(target: Target):
    """sha256 of the CFT build a kernel for ``target`` would link, or None (part of the cache key)."""
    from .runtime.support import manifest  # noqa: PLC0415

    builds = manifest().get("cft", {}).get("abis", {}).get(format_version(target.nccl), {}).get("builds", {})
    return sorted(b["sha256"] for b in builds.values()) or None


def _gin_digest(target: Target):
    """Digest of the GIN builds a kernel for ``target`` may link (part of the cache key)."""
    from .runtime import support, support_build  # noqa: PLC0415

    return support.gin_digest(target.nccl) or "sources:" + ",".join(support_build.source_digest().values())


def backend_key(key, target: Target):
    """The cache key of a GIN kernel linked for ``target``'s backend only (None: no backend named)."""
    if key is None or target.gin_backend is None:
        return None
    return hashlib.sha256(f"{key} gin:{target.gin_backend.option}".encode()).hexdigest()[:32]
