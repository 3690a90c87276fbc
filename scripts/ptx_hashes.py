"""The collectives' linked PTX, hashed per library kernel: whether a change left their device code alone.

A refactor of the lowering or of the host side must leave the collectives' code as it was, or say why not
(docs/contributing.md). Each kernel of the library (``flowdsl.collectives._library.library``) is typed,
lowered and linked with link-time optimisation for ``--arch`` and ``--nccl``: the PTX ptxas compiles
(``FlowKernel.inspect_lto_ptx``'s). numba's unique ids in mangled names (the ``v1967`` of ``B5v1967``, which
shift when an unrelated function is compiled first) are normalised, then the text is hashed (sha256). No GPU.

    python scripts/ptx_hashes.py --dtypes float32 --ops sum --json now.json
    python scripts/ptx_hashes.py --dtypes float32 --ops sum --tree /tmp/old --json before.json
    python scripts/ptx_hashes.py --compare before.json now.json

``--tree DIR`` hashes the flowdsl of another checkout (an earlier commit: ``git worktree add DIR REV``). The
comparison prints each kernel whose PTX differs and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: numba's per-process unique id in a mangled name's ABI tags: ``B<len>v<digits>``.
_UNIQUE_ID = re.compile(r"B\d+v\d+")
#: The linker's suffix on a refusal's format string defined by several modules (``name$1``): which copy gets
#: which number follows the order the modules were made in, which differs between processes.
_LINK_SUFFIX = re.compile(r"(flowdsl_refusal_[0-9a-f]{16})\$\d+")


def normalised(ptx: str) -> str:
    """``ptx`` without what differs between processes compiling the same code."""
    return _LINK_SUFFIX.sub(r"\1", _UNIQUE_ID.sub("Bv", ptx))


def linked_ptx(arch: str, nccl: str, dtypes, ops):
    """``(name, PTX)`` of every library kernel of ``dtypes`` x ``ops`` a GPU of ``arch`` runs, linked as ptxas gets
    it; ``name`` is ``"algorithm collective op dtype"``."""
    from flowdsl import RedOp
    from flowdsl.collectives import _library
    from flowdsl.lowering.compiler import KernelCode
    from flowdsl.lowering.target import Target, parse_version
    from flowdsl.runtime.support import feature_libraries, support_build_for

    target = Target(parse_version(nccl), arch)
    support = support_build_for(target.nccl, target.arch)
    entries = _library.library(dtypes, [RedOp[o.upper()] for o in ops] if ops else None)
    # every kernel a GPU of this target can run (the CFT programs need sm_100 and a CFT build: hashed where
    # the target is one)
    cft = target.cc >= (10, 0) and target.nccl >= (2, 32, 0)
    for entry in _library.precompiled(entries, gin_peers=True, multimem=True, cft=cft):
        algorithm, collective, op, dtype = entry
        kernel = _library._kernel_of(entry, False)
        code = KernelCode(kernel.py_func, _library._argtypes(dtype, target.nccl, algorithm), target, support.ltoir,
                          link_for_features=feature_libraries(target), **kernel._codegen)
        yield f"{algorithm} {collective} {op.name.lower()} {dtype}", code.lto_ptx()


def hashes(arch: str, nccl: str, dtypes, ops) -> dict:
    """``{"algorithm collective op dtype": sha256}`` of every library kernel of ``dtypes`` x ``ops``."""
    out = {}
    for name, ptx in linked_ptx(arch, nccl, dtypes, ops):
        out[name] = hashlib.sha256(normalised(ptx).encode()).hexdigest()
        print(f"{name:50s} {out[name][:16]}", file=sys.stderr, flush=True)
    return out


def compare(before: dict, now: dict) -> int:
    """Print the kernels whose PTX differs (or that only one side has); 1 if any."""
    differ = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    for k in differ:
        print(f"differs: {k} ({(before.get(k) or 'absent')[:16]} -> {(now.get(k) or 'absent')[:16]})")
    print(f"{len(set(before) & set(now)) - len([k for k in differ if k in before and k in now])} of "
          f"{len(set(before) | set(now))} kernels' PTX identical")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nccl", default="2.28.9")
    ap.add_argument("--dtypes", nargs="+", default=["float32"])
    ap.add_argument("--ops", nargs="+", default=["sum"])
    ap.add_argument("--tree", type=Path, help="hash the flowdsl of this checkout instead")
    ap.add_argument("--json", type=Path, help="write the hashes here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "NOW"))
    args = ap.parse_args()
    if args.compare:
        before, now = (json.loads(p.read_text()) for p in args.compare)
        return compare(before, now)
    if args.tree is not None:  # this script, with the other checkout's flowdsl first on the path
        argv = [a for a in sys.argv[1:]]
        i = argv.index("--tree")
        del argv[i:i + 2]
        env = {**os.environ, "PYTHONPATH": f"{args.tree.resolve()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        return subprocess.run([sys.executable, __file__, *argv], cwd=args.tree, env=env).returncode
    sys.path.insert(0, str(Path.cwd()))
    result = hashes(args.arch, args.nccl, args.dtypes, args.ops)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
