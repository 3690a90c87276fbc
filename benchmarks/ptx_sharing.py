"""How much of the collectives library's linked PTX is the same function body in several kernels: the share of
ptxas's work that compiling Flow's engine once (issue "Compiles at notebook speed") could save. No GPU.

Each library kernel of ``--dtypes`` x ``--ops`` is linked as ``scripts/ptx_hashes.py`` links it (its ``linked_ptx``) (the PTX ptxas
compiles), split into its functions; a body is compared without what differs between modules for the same code
(numba's unique ids, the function's own name, comments such as ``// callseq N``, the module's block-label
numbering). Prints each kernel's PTX lines and functions, then the library's lines, those in bodies that recur in
another kernel, and the lines left if each distinct body were compiled once.

    python benchmarks/ptx_sharing.py --dtypes float32 --ops sum
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from ptx_hashes import linked_ptx, normalised  # noqa: E402

#: A function's or kernel's definition (or declaration) in PTX, and its name.
_FUNCTION = re.compile(r"^(?:\.visible |\.weak |\.extern )?\.(?:func|entry)\s+(?:\([^)]*\)\s*)?([\w$]+)", re.M)


def functions(ptx: str) -> dict:
    """``{name: (digest of the body, PTX lines)}`` of the functions ``ptx`` defines."""
    ptx = normalised(ptx)
    starts = [(m.start(), m.group(1)) for m in _FUNCTION.finditer(ptx)]
    out = {}
    for (start, name), (end, _) in zip(starts, starts[1:] + [(len(ptx), None)]):
        text = ptx[start:end]
        if "{" not in text:  # a declaration
            continue
        body = re.sub(r"\$L__BB\d+_", "L_", re.sub(r"//[^\n]*", "", text.replace(name, "F")))
        out[name] = (hashlib.sha256(body.encode()).hexdigest(), text.count("\n"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nccl", default="2.28.9")
    ap.add_argument("--dtypes", nargs="+", default=["float32"])
    ap.add_argument("--ops", nargs="+", default=["sum"])
    args = ap.parse_args()
    kernels = {}
    for name, ptx in linked_ptx(args.arch, args.nccl, args.dtypes, args.ops):
        kernels[name] = functions(ptx)
        print(f"{name:45s} {sum(n for _, n in kernels[name].values()):7d} PTX lines, "
              f"{len(kernels[name])} functions", flush=True)
    seen = collections.Counter(digest for funcs in kernels.values() for digest, _ in funcs.values())
    total = sum(n for funcs in kernels.values() for _, n in funcs.values())
    shared = sum(n for funcs in kernels.values() for digest, n in funcs.values() if seen[digest] > 1)
    once = sum(dict(body for funcs in kernels.values() for body in funcs.values()).values())
    print(f"library: {total} PTX lines; {shared} ({shared / total:.0%}) in function bodies that recur in another "
          f"kernel; {once} ({once / total:.0%}) if each distinct body were compiled once")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
