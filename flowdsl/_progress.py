"""A one-line progress bar with an ETA on stderr, drawn only when stderr is a terminal.

Used where a long run has a known number of parts (seeds of :func:`flowdsl.testing.run_seeds`),
so that the bar and its ETA mean something; output piped to a file or a CI log stays clean.
"""

from __future__ import annotations

import sys
import time

__all__ = ["ProgressBar"]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class ProgressBar:
    """``label [#####.....] done/total  elapsed 0:12  ETA 0:30  note``, redrawn in place.

    Args:
        total: Number of parts.
        label: What is running.
        stream: Where to draw (default ``sys.stderr``).
        enabled: Draw or not; default: when ``stream`` is a terminal.
    """

    width = 30

    def __init__(self, total: int, label: str, stream=None, enabled: bool | None = None):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else enabled
        self.start = time.perf_counter()
        self._drawn = False

    def update(self, done: int, note: str = "") -> None:
        """Show ``done`` of ``total`` parts finished (the ETA assumes the rest take as long each)."""
        if not self.enabled or self.total == 0:
            return
        elapsed = time.perf_counter() - self.start
        filled = self.width * done // self.total
        eta = _duration(elapsed / done * (self.total - done)) if done else "?"
        line = (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total}  "
                f"elapsed {_duration(elapsed)}  ETA {eta}  {note}")
        self.stream.write(f"\r{line:<100}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the line (nothing when nothing was drawn)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
