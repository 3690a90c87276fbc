"""What the compile tests share: ``linked_ptx``, a kernel's linked code read back as PTX."""

from __future__ import annotations

import dataclasses

import pytest

from flowdsl.lowering import compiler

_LINKER = compiler.Linker


class _LinkerKeepingPtx(_LINKER):
    """The linker compile_kernel uses, which also links the same objects to PTX."""

    ptx: list = []

    def __init__(self, *objects, options):
        super().__init__(*objects, options=options)
        self._objects, self._options = objects, options

    def link(self, target):
        other = _LINKER(*self._objects, options=dataclasses.replace(self._options, ptx=True))
        try:
            self.ptx.append(bytes(other.link("ptx").code).decode())
        finally:
            other.close()
        return super().link(target)


@pytest.fixture
def linked_ptx(monkeypatch):
    monkeypatch.setattr(compiler, "Linker", _LinkerKeepingPtx)
    _LinkerKeepingPtx.ptx = []

    def compile_ptx(kernel, argtypes, nccl="2.28.9", arch="sm_90", **options):
        compiled = kernel.compile(argtypes, arch=arch, nccl=nccl, **options)
        assert [s for s in compiled.function_symbols() if s.startswith("flowdsl_")] == []
        return _LinkerKeepingPtx.ptx[-1]
    return compile_ptx
