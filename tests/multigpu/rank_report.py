"""The workers' side of a several-GPU test: each rank writes its report as ``rank<r>.json``."""

from __future__ import annotations

import json
import os
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


def record_calls(comm, section: dict, key: str, label: str, calls: int, failures: list, show: int) -> int:
    """Record ``failures`` of ``calls`` under ``section[key]``, print the rank's line (and the first
    ``show`` failures); 1 if any failed, else 0."""
    section[key] = {"calls": calls, "failures": failures}
    print(f"[rank {comm.rank}/{comm.nranks}] {label}: {calls} calls, "
          f"{'OK' if not failures else f'{len(failures)} WRONG'}", flush=True)
    for line in failures[:show]:
        print("   ", line, flush=True)
    return 1 if failures else 0


def run_reported(out: Path | None, report: dict, body) -> int:
    """``body()`` (its status), an exception in it recorded as status 2; the report written. After an
    exception the process exits at once, without closing: another rank may still wait inside a
    collective, and closing waits for the device; exiting lets torchrun end the other ranks."""
    try:
        status = body()
    except Exception:  # noqa: BLE001 - reported to the launcher, then the rank exits
        record_error(report)
        status = 2
    write_report(out, report)
    if status == 2:
        os._exit(status)
    return status
