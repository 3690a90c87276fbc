"""One rank of the several-GPU planted-hang tests (``tests/planted_hangs.py``), under torchrun.

Launched by ``tests/multigpu/test_timeouts_multigpu.py``, one process per GPU, or by hand::

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/multigpu/timeouts_worker.py --program skip_barrier --out /tmp/hang

Programs: those of ``planted_hangs.PROGRAMS`` (each rank runs ``main(comm)``, the waits
give up after ``planted_hangs.TIMEOUT`` seconds), and ``abort_from_thread``: every rank
launches a kernel that waits for ever (``wait_timeout=0``), a host thread calls
``comm.abort()`` after one second, and ``comm.synchronize()`` must return with
``ResourceClosedError``. Every rank writes ``DIR/rank<r>.json``: ``{"rank", "outcome"
("ok", "timeout", "aborted" or "error"), "seconds", "fields", "message"}``, then aborts
its communicator (after a timeout, peers may be gone: no collective teardown).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on the shared machines
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's flowdsl and tests
from tests.multigpu.rank_report import write_report  # noqa: E402 - found through the line above


def abort_from_thread(comm):
    """Every rank spins in a kernel without a limit; another host thread aborts the communicator."""
    import numpy as np

    from tests import planted_hangs

    comm.wait_timeout = 0
    buf = comm.alloc(8, np.uint64)
    buf[...] = 0
    win, dc = comm.register(buf), comm.device_communicator()
    planted_hangs.wait_for_next[1, 32](dc, win)
    threading.Timer(1.0, comm.abort).start()
    comm.synchronize()  # raises ResourceClosedError once the kernel gave up
    return "ok"


def main(argv=None) -> int:
    from tests import planted_hangs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", required=True, choices=[*planted_hangs.PROGRAMS, "abort_from_thread"])
    parser.add_argument("--out", type=Path, required=True, help="write rank<r>.json here")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    import flowdsl

    dist.init_process_group("gloo")
    report = {"rank": dist.get_rank(), "outcome": None, "seconds": None, "fields": None, "message": None}
    comm = flowdsl.init(group=dist.group.WORLD)
    program = (abort_from_thread if args.program == "abort_from_thread"
               else planted_hangs.PROGRAMS[args.program][0]())
    dist.barrier()  # start together: a rank still compiling is not a hang
    start = time.monotonic()
    try:
        report["outcome"] = program(comm)
    except flowdsl.DeviceTimeoutError as exc:
        report["outcome"] = "timeout"
        report["fields"] = {name: getattr(exc, name) for name in exc.FIELDS}
        report["message"] = str(exc)
    except flowdsl.ResourceClosedError as exc:
        report["outcome"] = "aborted"
        report["message"] = str(exc)
    except Exception:  # noqa: BLE001 - reported to the launcher
        report["outcome"] = "error"
        report["message"] = traceback.format_exc()
    report["seconds"] = time.monotonic() - start
    print(f"[rank {report['rank']}] {args.program}: {report['outcome']} after {report['seconds']:.2f} s",
          flush=True)
    write_report(args.out, report)
    comm.abort()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
