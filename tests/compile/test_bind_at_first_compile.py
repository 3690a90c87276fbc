"""The device surface and ``@flowdsl.device`` functions are bound to numba-cuda at the first compile.

A device function made before anything compiled and one made after both compile into
kernels, and ``inline=False`` keeps either out of line (its own function in the cubin). A
kernel found in the disk cache binds nothing. Each case runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.compile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CODE = '''
import sys
import numpy as np
from numba import cuda
import flowdsl
from flowdsl import _devices

@flowdsl.device(inline=False)
def kept_before(a, i):
    a[i] = a[i] * 3.0 + 1.0

@flowdsl.device
def inlined_before(a, i):
    a[i] = a[i] - 2.0

assert _devices._binder is None and len(_devices._PENDING_DEVICES) >= 2
assert "flowdsl.lowering.bindings" not in sys.modules

@flowdsl.kernel
def first(a):
    i = cuda.grid(1)
    if i < a.size:
        kept_before(a, i)
        inlined_before(a, i)

args = first.argtypes_for(np.zeros(4, np.float32), nccl="2.28.9")
symbols = first.compile(args, arch="sm_90", nccl="2.28.9").function_symbols()
assert _devices._binder is not None and not _devices._PENDING_DEVICES
assert [s for s in symbols if "kept_before" in s], symbols
assert not [s for s in symbols if "inlined_before" in s], symbols

@flowdsl.device(inline=False)
def kept_after(a, i):
    a[i] = a[i] + 5.0

@flowdsl.kernel
def second(a):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        kept_after(a, i)
        inlined_before(a, i)

symbols = second.compile(args, arch="sm_90", nccl="2.28.9").function_symbols()
assert [s for s in symbols if "kept_after" in s], symbols
print("ok")
'''


def _fresh(code: str, **env) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])), **env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip()


def test_device_functions_made_before_and_after_the_first_compile():
    assert _fresh(_CODE).endswith("ok")


_BUILD = """
import sys
from flowdsl import RedOp
from flowdsl.collectives import _library
from flowdsl.lowering.target import Target
print(_library._build(("one_shot", "all_reduce", RedOp.MAX, "int32"), Target((2, 28, 9), "sm_90"), False),
      "flowdsl.lowering.bindings" in sys.modules)
"""


def test_a_kernel_found_on_disk_binds_nothing(tmp_path):
    assert _fresh(_BUILD, FLOWDSL_CACHE_DIR=str(tmp_path)).splitlines()[-1] == "compiled True"
    assert _fresh(_BUILD, FLOWDSL_CACHE_DIR=str(tmp_path)).splitlines()[-1] == "cached False"
