"""Execute the notebooks headless, in a fresh kernel each, and save them with their outputs (figures included).

    python scripts/run_notebooks.py                      # every notebook in notebooks/, into ./executed-notebooks
    python scripts/run_notebooks.py notebooks/x.ipynb --out /tmp/executed --timeout 900
    python scripts/run_notebooks.py --in-place           # rewrite the committed notebooks (to commit them)

On a machine without a GPU the notebooks run on the simulator and their GPU cells print that they skip;
``scripts/gpu_all.sh`` (stage ``notebooks``) runs this on the GPU machine to produce the committed outputs.
The kernel is this Python's own (ipykernel), with this checkout first on its import path. A cell that raises
stops the run: the notebook is still written (its outputs up to the error, the traceback included) and the
exit status is 1. Needs ``pip install -e '.[notebooks]'`` (nbclient, nbformat, ipykernel, matplotlib).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: Seconds one cell may run (the GPU benchmark cell takes minutes on a cold kernel cache).
DEFAULT_TIMEOUT = 1200


def kernel_environment(**overrides: str) -> dict:
    """The kernel's environment: this one, with this checkout first on the import path and jupyter's
    standard directories (no deprecation warning about them), then ``overrides``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    env.update(overrides)
    return env


def execute(notebook, folder: Path, timeout: int = DEFAULT_TIMEOUT, env: dict | None = None):
    """Run every cell of ``notebook`` (an ``nbformat`` notebook, filled in place with the outputs) in a fresh
    python3 kernel working in ``folder``, with environment ``env`` (default :func:`kernel_environment`), and
    return it. A failing cell raises ``nbclient.exceptions.CellExecutionError``; ``notebook`` then holds the
    outputs up to it."""
    from nbclient import NotebookClient  # noqa: PLC0415

    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(folder)}})
    client.execute(env=env or kernel_environment())
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, default=NOTEBOOKS,
                        help="notebooks to run (default: every notebook in notebooks/)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=Path("executed-notebooks"),
                       help="write the executed notebooks here (default: ./executed-notebooks; the notebooks "
                            "themselves are left alone)")
    where.add_argument("--in-place", action="store_true",
                       help="overwrite the notebooks themselves with their outputs (what gets committed)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT,
                        help=f"seconds one cell may run (default {DEFAULT_TIMEOUT})")
    args = parser.parse_args(argv)
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")  # before jupyter_core is imported
    try:
        import nbformat  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        print(f"run_notebooks: {exc.name} is missing: pip install -e '.[notebooks]' (nbclient, nbformat, ipykernel, "
              "matplotlib)", file=sys.stderr)
        return 2
    if args.in_place:
        args.out = None

    failed = 0
    for path in args.notebooks:
        target = (args.out / path.name) if args.out else path
        notebook, error = nbformat.read(path, as_version=4), None
        start = time.perf_counter()
        try:
            execute(notebook, path.parent, args.timeout)
        except Exception as exc:  # noqa: BLE001 - any failure: save what ran, report it, go on
            error = exc
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
        seconds = time.perf_counter() - start
        if error is None:
            print(f"{path.name}: ran in {seconds:.1f} s, written to {target}")
        else:
            failed += 1
            print(f"{path.name}: FAILED after {seconds:.1f} s (outputs so far written to {target}):\n{error}",
                  file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
