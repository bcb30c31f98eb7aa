"""Lines that show a long run is alive: during a cell and while a server starts.

A cell of a large deployment runs for many minutes and a server start (weights, graph
capture) can take half an hour; one line per finished cell leaves both blind. `Heartbeat`
is ticked from the loops that already wait on them (the invoker's watch every
`tools.WATCH_S`, the health poll) and, every `every_s` seconds, prints what is waited on,
the time it has taken so far, and the last line of the log it writes to, with that log's
path, so a hang or a crash loop shows without opening a second terminal. During a load cell
it also says how many requests are done out of how many (`requests_done`), read from the
progress bar bench_serving draws into that log; a line that is not surely that bar shows no
count at all rather than a wrong one.
"""

from __future__ import annotations

import re
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


# bench_serving's bar of the measured requests: tqdm(total=N) without a description, so a line
# that starts with the percentage (` 40%|####      | 4/10 [00:01<00:01,  3.20it/s]`). Bars with
# a description (the shared-prefix prompts being generated, a download) start otherwise.
_BAR = re.compile(r"^\s*(\d{1,3})%\|[^|]*\|\s*(\d+)/(\d+)\s*\[")
# Where the measured requests start: the bar is drawn after it (sglang.benchmark.serving.benchmark).
_MAIN_RUN = "Starting main benchmark run"
# What the runner writes before each try of a cell (runner._run_cell): a retry starts afresh.
TRY_HEADER = "\n=== python -m "


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _lines(text: str) -> list[str]:
    """Non-empty lines; a carriage return (a redrawn progress bar) ends one too."""
    return [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]


def requests_done(path: Path | None) -> tuple[int, int] | None:
    """(done, total) from the last progress bar of the measured requests in the log's last
    try; None when there is none yet (warm-up, loading) or the line is not surely it."""
    if path is None:
        return None
    text = _tail(path)
    text = text[text.rfind(TRY_HEADER) + 1 :]  # the whole tail when no header is in it
    if _MAIN_RUN in text:
        text = text[text.rfind(_MAIN_RUN) :]
    for line in reversed(_lines(text)):
        if (bar := _BAR.match(line)) is None:
            continue  # e.g. a bar cut off mid-write: the one before it is still right
        percent, done, total = map(int, bar.groups())
        # tqdm rounds the percentage of done / total: a line that disagrees is no such bar.
        if 0 < total and done <= total and abs(percent - 100 * done / total) <= 1:
            return done, total
        return None
    return None


def last_line(path: Path | None) -> str:
    """The log's last non-empty line (carriage-return progress bars: their last state)."""
    if path is None:
        return ""
    lines = _lines(_tail(path))
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= LAST_LINE_CHARS else line[: LAST_LINE_CHARS - 3] + "..."


class Heartbeat:
    """`tick()` prints `<what>, <elapsed> so far, log <path>: <last line>` every `every_s` s;
    with `counts_requests`, `N/M requests done` after the time once the log shows them."""

    def __init__(
        self,
        what: str,
        log: Path | None,
        out: Callable[[str], None],
        every_s: float = DEFAULT_EVERY_S,
        counts_requests: bool = False,
    ):
        self.what = what
        self.log = log
        self.out = out
        self.every_s = every_s
        self.counts_requests = counts_requests
        self.started = time.monotonic()
        self.next_at = self.started + every_s

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.every_s
        text = f"{self.what}, {duration(now - self.started)} so far"
        if self.counts_requests and (counts := requests_done(self.log)) is not None:
            text += f", {counts[0]}/{counts[1]} requests done"
        if self.log is not None:
            line = last_line(self.log)
            text += f", log {self.log}: " + (line or "(empty)")
        self.out(text)
