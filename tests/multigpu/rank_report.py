"""The workers' side of a several-GPU test: each rank writes its report as ``rank<r>.json``."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path


def record_error(report: dict) -> None:
    """Put the exception being handled into ``report["error"]`` and print it, naming the rank."""
    report["error"] = traceback.format_exc()
    print(f"[rank {report['rank']}] {report['error']}", file=sys.stderr, flush=True)


def write_report(out: Path | None, report: dict) -> None:
    """Write ``report`` to ``out/rank<r>.json`` (nothing without ``out``)."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{report['rank']}.json").write_text(json.dumps(report, indent=1))
