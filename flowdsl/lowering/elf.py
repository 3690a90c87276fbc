"""The function and data symbols of an ELF64 object such as a cubin.

Standard library only: ``scripts/try_numba_cuda_mlir.py``, which runs where numba-cuda (and so
flowdsl) is not installed, runs this file by its path.
"""

from __future__ import annotations

import struct

__all__ = ["function_symbols", "object_symbols"]


def function_symbols(elf: bytes, defined_only: bool = True) -> list[str]:
    """Names of the FUNC symbols of the ELF64 object ``elf``; with ``defined_only``, not those it leaves
    undefined (the driver's ``vprintf``, or a call the link did not resolve)."""
    return _symbols(elf, 2, defined_only)  # STT_FUNC


def object_symbols(elf: bytes) -> list[str]:
    """Names of the OBJECT symbols (global variables) ``elf`` defines."""
    return _symbols(elf, 1, True)  # STT_OBJECT


def _symbols(elf: bytes, kind: int, defined_only: bool) -> list[str]:
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sec[6]]
        offset, size, entsize = sec[4], sec[5], sec[9]
        for pos in range(offset, offset + size, entsize):
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", elf, pos)
            if st_info & 0xF == kind and (defined_only is False or st_shndx != 0):
                start = strtab[4] + st_name
                names.append(elf[start:elf.index(b"\0", start)].decode())
    return names
