"""Lines that show a long run is alive: during a cell and while a server starts.

A cell of a large deployment runs for many minutes and a server start (weights, graph
capture) can take half an hour; one line per finished cell leaves both blind. `Heartbeat`
is ticked from the loops that already wait on them (the invoker's watch every
`tools.WATCH_S`, the health poll) and, every `every_s` seconds, prints what is waited on,
the time it has taken so far, and the last line of the log it writes to, with that log's
path, so a hang or a crash loop shows without opening a second terminal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

# How often a waiting loop says so; `ab run --progress-every` changes it.
DEFAULT_EVERY_S = 30.0
# The log's last line is cut to this many characters (a server can log whole tensors).
LAST_LINE_CHARS = 200
# Only the end of the log is read: server logs grow to hundreds of megabytes.
TAIL_BYTES = 8192


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def last_line(path: Path | None) -> str:
    """The log's last non-empty line (carriage-return progress bars: their last state)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= LAST_LINE_CHARS else line[: LAST_LINE_CHARS - 3] + "..."


class Heartbeat:
    """`tick()` prints `<what>, <elapsed> so far, log <path>: <last line>` every `every_s` s."""

    def __init__(
        self,
        what: str,
        log: Path | None,
        out: Callable[[str], None],
        every_s: float = DEFAULT_EVERY_S,
    ):
        self.what = what
        self.log = log
        self.out = out
        self.every_s = every_s
        self.started = time.monotonic()
        self.next_at = self.started + every_s

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.every_s
        text = f"{self.what}, {duration(now - self.started)} so far"
        if self.log is not None:
            line = last_line(self.log)
            text += f", log {self.log}: " + (line or "(empty)")
        self.out(text)
