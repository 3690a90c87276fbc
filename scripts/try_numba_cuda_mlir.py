"""Compile one LSA kernel with numba-cuda-mlir and link it with flowdsl's support build (no GPU needed).

The prototype of docs/backends.md, which evaluates numba-cuda-mlir as the successor of numba-cuda
for flowdsl's lowering. It does not import flowdsl (flowdsl needs numba-cuda; numba-cuda-mlir is
meant to replace it; of flowdsl it runs only the standard-library ELF reader, flowdsl/lowering/elf.py,
by its path), so run it in an environment of its own:

    python3 -m venv /tmp/mlir-venv && /tmp/mlir-venv/bin/pip install 'numba-cuda-mlir[cu13]==0.6.0'
    /tmp/mlir-venv/bin/python scripts/try_numba_cuda_mlir.py [--arch sm_90] [--nccl 2.28.9]

It rebuilds, with numba-cuda-mlir's extension API, what flowdsl's lowering is made of: C-ABI
declarations of support-library functions (``cuda.declare_device(..., abi="c")``), a custom type for
the device communicator carried by value with a struct data model, intrinsics that emit code (MLIR
here; LLVM IR through llvmlite in flowdsl) including inline PTX, and LTO-IR output linked by
nvJitLink (cuda.core) with ``prebuilt/build/nccl-<nccl>/<arch>.ltoir``. Each step prints what it got;
the exit status is 0 when the kernel links into a cubin with every support call resolved. Without
numba-cuda-mlir it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import re
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: FUNC symbols of an ELF64 cubin: flowdsl's own reader, a standard-library file run by its path.
_function_symbols = runpy.run_path(str(ROOT / "flowdsl" / "lowering" / "elf.py"))["function_symbols"]
#: The support functions the kernel calls (their numba-cuda-mlir signatures: ``_declare_support``).
SUPPORT_CALLS = ("flowdsl_comm_lsa_size", "flowdsl_get_peer_pointer", "flowdsl_lsa_barrier_sync__cta")


def _step(name: str, fn):
    start = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:
        print(f"[FAIL] {name}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}")
        raise
    print(f"[ ok ] {name} ({time.perf_counter() - start:.1f} s)")
    return result


def _dev_comm_words(nccl: str) -> int:
    """Kernel words of a device communicator: ``ncclDevComm`` padded to 8 bytes, then the wait record's address."""
    layout = json.loads((ROOT / "prebuilt/build/manifest.json").read_text())["abis"][nccl]["layout"]
    return -(-layout["dev_comm_size"] // 8) + 1


def _declared_in_header() -> set[str]:
    """The functions the header declares: prototypes, and rows of one per coop kind (``FLOWDSL_COOP_API``,
    expanded as the header's macro does)."""
    text = (ROOT / "prebuilt/include/flowdsl_support.h").read_text()
    names = set(re.findall(r"FLOWDSL_API [^;(]*?\b(flowdsl_\w+)\(", text))
    macro = re.search(r"#define FLOWDSL_COOP_API\(RET, NAME, PARAMS\)(.*)", text).group(1)
    kinds = re.findall(r"NAME##__(\w+)", macro)
    for stem in re.findall(r"FLOWDSL_COOP_API\(\w+, (flowdsl_\w+),", text):
        names |= {f"{stem}__{kind}" for kind in kinds}
    return names


def _declare_support(support: bytes):
    """The support functions the kernel calls, declared as flowdsl/lowering/declarations.py declares
    them from the extern table (C ABI, pointers and scalars).

    ``support`` (the support build's LTO-IR) is the declarations' ``link=``: numba-cuda-mlir 0.6
    links every compile to a cubin, so a call it cannot resolve fails even when PTX is asked for.
    """
    from numba_cuda_mlir import cuda, types  # noqa: PLC0415

    missing = set(SUPPORT_CALLS) - _declared_in_header()
    assert not missing, f"not in prebuilt/include/flowdsl_support.h: {sorted(missing)}"
    link = cuda.LTOIR(support, name="flowdsl_support")
    prototypes = (types.int32(types.voidptr),
                  types.voidptr(types.voidptr, types.uint64, types.int32),
                  types.void(types.uint32, types.voidptr, types.uint32, types.int32))
    return [cuda.declare_device(name, proto, abi="c", link=link) for name, proto in zip(SUPPORT_CALLS, prototypes)]


def _dev_comm_type(nccl: str):
    """flowdsl/lowering/types.py's DevCommType: the ``ncclDevComm`` words by value."""
    from numba_cuda_mlir import types  # noqa: PLC0415
    from numba_cuda_mlir.extending import register_model  # noqa: PLC0415
    from numba_cuda_mlir.models import StructModel  # noqa: PLC0415

    class DevCommType(types.Type):
        def __init__(self):
            super().__init__(name=f"DevComm(nccl={nccl})")

    # flowdsl's model has one UniTuple member; numba-cuda-mlir represents a tuple as a Python tuple of
    # MLIR values, which a StructModel cannot hold: one u64 member per word instead.
    nwords = _dev_comm_words(nccl)

    @register_model(DevCommType)
    class _DevCommModel(StructModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, [(f"w{i}", types.uint64) for i in range(nwords)])

    return DevCommType


def _one_value_intrinsic(name: str, accepts, result, emit):
    """An intrinsic of one argument that ``accepts(type)`` types, returning ``result(argument type)``:
    ``emit(builder, value)`` makes the result's MLIR value from the argument's."""
    from numba_cuda_mlir.extending import intrinsic  # noqa: PLC0415

    def typer(typingctx, arg):
        if not accepts(arg):
            return None

        def codegen(builder, target, args, kwargs):
            builder.store_var(target, emit(builder, builder.load_var(args[0])))

        return result(arg), codegen

    typer.__name__ = typer.__qualname__ = name
    return intrinsic(typer)


def _intrinsics(dev_comm_type):
    """``devcomm_ptr``, ``array_ptr``, ``window_handle`` and ``load_acquire_sys``: what
    flowdsl/lowering/intrinsics.py and ptx.py emit as LLVM IR, as MLIR."""
    from numba_cuda_mlir import types  # noqa: PLC0415
    from numba_cuda_mlir._mlir.dialects import llvm  # noqa: PLC0415
    from numba_cuda_mlir.extending import intrinsic  # noqa: PLC0415
    from numba_cuda_mlir.lowering_utilities import memref_data_pointer  # noqa: PLC0415

    @intrinsic
    def devcomm_ptr(typingctx, comm):
        """``const ncclDevComm*`` to a local copy of the words (flowdsl/lowering/intrinsics.py)."""
        if not isinstance(comm, dev_comm_type):
            return None

        def codegen(builder, target, args, kwargs):
            value = builder.load_var(args[0])
            slot = builder.alloca(value.type)
            llvm.store(value, slot, alignment=16)
            builder.store_var(target, slot)

        return types.voidptr(comm), codegen

    # Address of an array's first element, as ``void*``.
    array_ptr = _one_value_intrinsic("array_ptr", lambda ary: isinstance(ary, types.Array), types.voidptr,
                                     lambda builder, ary: memref_data_pointer(ary))
    # A window's ``ncclWindow_t`` from the u64 it travels as.
    window_handle = _one_value_intrinsic("window_handle", lambda handle: handle == types.uint64, types.voidptr,
                                         lambda builder, handle: llvm.inttoptr(llvm.PointerType.get(), handle))
    # ``ld.acquire.sys.global.u64`` as inline PTX (flowdsl/lowering/ptx.py's mem.load_acquire).
    load_acquire_sys = _one_value_intrinsic(
        "load_acquire_sys", lambda ptr: ptr == types.voidptr, types.uint64,
        lambda builder, ptr: llvm.inline_asm(builder.get_mlir_type(types.uint64), [ptr],
                                             "ld.acquire.sys.global.u64 $0, [$1];", "=l,l,~{memory}",
                                             has_side_effects=True))
    return devcomm_ptr, array_ptr, window_handle, load_acquire_sys


def build(nccl: str, support: bytes):
    """The kernel and its signature, made with numba-cuda-mlir's API only."""
    import numpy as np  # noqa: PLC0415
    from numba_cuda_mlir import cuda, types  # noqa: PLC0415
    from numba_cuda_mlir.extending import refresh_registries  # noqa: PLC0415

    comm_lsa_size, get_peer_pointer, barrier_sync_cta = _declare_support(support)
    dev_comm_type = _dev_comm_type(nccl)
    devcomm_ptr, array_ptr, window_handle, load_acquire_sys = _intrinsics(dev_comm_type)
    refresh_registries()  # intrinsics join the compiler's typing context only after this

    def sum_rows(comm, win, out, hidden):
        """Block b adds row b of every LSA rank's window into out (docs/index.md's sum_rows)."""
        c = devcomm_ptr(comm)
        barrier_sync_cta(0, c, cuda.blockIdx.x, 2)  # cuda::memory_order_acquire
        start = cuda.blockIdx.x * hidden
        for peer in range(comm_lsa_size(c)):
            row = get_peer_pointer(window_handle(win), start * 4, peer)
            theirs = cuda.carray(row, hidden, np.float32)
            for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
                out[start + i] += theirs[i]
        if load_acquire_sys(array_ptr(out)) == 12345:  # keeps the load; never true in a real run
            out[0] = 0
        barrier_sync_cta(0, c, cuda.blockIdx.x, 3)  # cuda::memory_order_release

    return sum_rows, types.void(dev_comm_type(), types.uint64, types.float32[::1], types.int64)


def _link(arch: str, objects: list[tuple[str, bytes]], output: str):
    """nvJitLink with LTO, as flowdsl/lowering/compiler.py links (cuda.core)."""
    from cuda.core import Linker, LinkerOptions, ObjectCode  # noqa: PLC0415

    linker = Linker(*[ObjectCode.from_ltoir(data, name=name) for name, data in objects],
                    options=LinkerOptions(arch=arch, link_time_optimization=True, ptx=output == "ptx"))
    try:
        return linker.link(output).code
    finally:
        linker.close()


def compile_and_link(arch: str, nccl: str) -> int:
    import numba_cuda_mlir  # noqa: PLC0415
    import numba_cuda_mlir.tools  # noqa: PLC0415
    from numba_cuda_mlir import cuda  # noqa: PLC0415

    print(f"numba-cuda-mlir {numba_cuda_mlir.__version__}; target {arch}, NCCL {nccl}")
    cc = (int(arch[3:-1]), int(arch[-1]))
    # 0.6 asks the driver for the GPU's compute capability even when cc= is given
    # (tools.resolve_gpu_target); with no GPU, fill its private cache with the target instead.
    numba_cuda_mlir.tools._cached_cc = cc
    support_path = ROOT / f"prebuilt/build/nccl-{nccl}/{arch}.ltoir"
    support = support_path.read_bytes()
    pyfunc, signature = _step("declarations, DevComm type and intrinsics", lambda: build(nccl, support))
    ltoir, _ = _step("cuda.compile(output='ltoir')",
                     lambda: cuda.compile(pyfunc, signature, device=False, abi="numba", cc=cc, output="ltoir"))
    print(f"       kernel LTO-IR: {len(ltoir)} bytes")
    objects = [("sum_rows", ltoir), ("flowdsl_support", support)]
    cubin = bytes(_step(f"nvJitLink (cuda.core) with {support_path.relative_to(ROOT)}",
                        lambda: _link(arch, objects, "cubin")))
    defined = _function_symbols(cubin)
    print(f"       cubin: {len(cubin)} bytes, {len(defined)} functions: {[_short(f) for f in defined]}")
    ptx = _step("the same link to PTX", lambda: _link(arch, objects, "ptx")).decode()
    entry = re.search(r"\.entry (\S+)\((.*?)\)", ptx, re.S)
    params = [re.sub(r"\s+\S+_param_(\d+)", r" p\1", p.strip()) for p in entry.group(2).split(",")]
    print(f"       parameters of {_short(entry.group(1))}: {params}")
    print(f"       ld.acquire.sys.global.u64 kept: {'ld.acquire.sys.global.u64' in ptx}; "
          f"support calls left after LTO: {[s for s in SUPPORT_CALLS if s in ptx]}")
    own = _step("cuda.compile_cubin (numba-cuda-mlir's own link)",
                lambda: cuda.compile_cubin(pyfunc, signature, device=False, abi="numba", chip=arch, lto=True))
    print(f"       cubin: {len(own)} bytes, {len(_function_symbols(own))} functions")
    unresolved = [f for f in _function_symbols(cubin, defined_only=False) if f not in defined]
    if unresolved:
        print(f"[FAIL] unresolved in the cubin: {unresolved}")
        return 1
    return 0


def _short(symbol: str) -> str:
    return symbol if len(symbol) <= 48 else f"{symbol[:30]}...{symbol[-15:]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90", choices=["sm_80", "sm_90", "sm_100"])
    parser.add_argument("--nccl", default="2.28.9", choices=["2.28.9", "2.32.3"])
    args = parser.parse_args(argv)
    try:
        import numba_cuda_mlir  # noqa: F401, PLC0415
    except ImportError:
        print("numba-cuda-mlir is not installed in this environment: nothing to try "
              "(pip install 'numba-cuda-mlir[cu13]' in an environment of its own).")
        return 0
    return compile_and_link(args.arch, args.nccl)


if __name__ == "__main__":
    sys.exit(main())
