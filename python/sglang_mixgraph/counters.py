"""Per-process activity counters: how often each patch acted, and fell back by reason.

Host-side integers keyed ``(patch, event)`` and ``(patch, reason)``, always on: a count is a
dict update, no device work and no synchronisation. :func:`snapshot` returns them (tests, the
end-to-end harness). A process that counted something logs one INFO line on the
``sglang_mixgraph.counters`` logger, ``sglang-mixgraph counters {json}``, every
``SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL`` seconds when something changed, and once at exit.
Counts are cumulative, so a process's last line is its total. SGLang's ``Engine.shutdown``
can end scheduler processes without running exit handlers: a reader that needs totals sets a
short interval and waits one interval after its last request (test/gpu_e2e does).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from typing import Any

from sglang_mixgraph.flags import FlagValueError, seconds_flag

logger = logging.getLogger("sglang_mixgraph.counters")

LOG_PREFIX = "sglang-mixgraph counters "

# The shortest interval: below it the reporter thread would spin (1e-9 s took a quarter core).
MIN_INTERVAL_S = 0.1

INTERVAL_FLAG = seconds_flag(
    "SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL",
    60,
    "Seconds between the per-process INFO lines with the patches' activity counters (only when "
    f"a count changed), at least {MIN_INTERVAL_S:g}; 0 logs only at exit.",
    minimum=MIN_INTERVAL_S,
)

_events: dict[tuple[str, str], int] = {}
_fallbacks: dict[tuple[str, str], int] = {}
_changes = 0  # bumped on every count; the reporter logs when it moved
_logged_at = 0  # _changes when the last line was logged
_reporter: threading.Thread | None = None
_reporter_stop = threading.Event()
_exit_line_registered = False  # inherited by a forked child, whose exit handlers are the parent's
_start_lock = threading.Lock()


def count(patch: str, event: str, n: int = 1) -> None:
    """Add ``n`` to the ``(patch, event)`` counter of this process."""
    global _changes
    key = (patch, event)
    _events[key] = _events.get(key, 0) + n
    _changes += 1
    if _reporter is None:
        _start_reporter()


def count_fallback(patch: str, reason: str) -> None:
    """One more time ``patch`` handed work back to upstream because of ``reason``."""
    global _changes
    key = (patch, reason)
    _fallbacks[key] = _fallbacks.get(key, 0) + 1
    _changes += 1
    if _reporter is None:
        _start_reporter()


def _nest(flat: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (patch, name), n in sorted(dict(flat).items()):  # dict(): a copy taken under the GIL
        out.setdefault(patch, {})[name] = n
    return out


def snapshot() -> dict[str, Any]:
    """``{"pid", "events": {patch: {event: n}}, "fallbacks": {patch: {reason: n}}}``."""
    return {"pid": os.getpid(), "events": _nest(_events), "fallbacks": _nest(_fallbacks)}


def get(patch: str, event: str) -> int:
    return _events.get((patch, event), 0)


def get_fallback(patch: str, reason: str) -> int:
    return _fallbacks.get((patch, reason), 0)


def reset() -> None:
    """Zero every counter of this process (tests)."""
    global _changes, _logged_at
    _events.clear()
    _fallbacks.clear()
    _changes = _logged_at = 0


def format_line() -> str:
    return LOG_PREFIX + json.dumps(snapshot(), sort_keys=True)


def parse_line(line: str) -> dict[str, Any] | None:
    """The snapshot in one log line (any prefix SGLang's log format adds), or None."""
    at = line.find(LOG_PREFIX)
    if at < 0:
        return None
    try:
        return json.loads(line[at + len(LOG_PREFIX) :])
    except ValueError:
        return None


def log_now() -> None:
    global _logged_at
    _logged_at = _changes
    logger.info("%s", format_line())


def _interval() -> float:
    try:
        return float(INTERVAL_FLAG.get())
    except FlagValueError as e:
        # Startup (plugin.register) already stopped on a bad value; a process that skipped
        # it must not fail inside a forward pass for a log line.
        logger.warning("%s; logging counters only at exit", e)
        return 0.0


def _report_every(seconds: float, stop: threading.Event) -> None:
    while not stop.wait(seconds):
        if _changes != _logged_at:
            log_now()


def _at_exit() -> None:
    if not _changes:
        return
    # At interpreter exit a handler's stream may already be closed (a test runner's capture):
    # the totals line is then lost quietly, not reported as a logging traceback.
    raise_errors = logging.raiseExceptions
    logging.raiseExceptions = False
    try:
        log_now()
    finally:
        logging.raiseExceptions = raise_errors


def _start_reporter() -> None:
    """On the first count of a process: the exit line, and the periodic thread if asked."""
    global _reporter, _reporter_stop, _exit_line_registered
    with _start_lock:
        if _reporter is not None:
            return
        seconds = _interval()
        _reporter_stop = threading.Event()
        _reporter = threading.Thread(
            target=_report_every,
            args=(seconds, _reporter_stop),
            name="sglang-mixgraph-counters",
            daemon=True,
        )
        if not _exit_line_registered:
            atexit.register(_at_exit)
            _exit_line_registered = True
        if seconds > 0:
            _reporter.start()


def stop_reporter() -> None:
    """Stop the periodic thread; the next count starts a new one (tests)."""
    global _reporter
    with _start_lock:
        _reporter_stop.set()
        if _reporter is not None and _reporter.is_alive():
            _reporter.join()
        _reporter = None


def _after_fork_in_child() -> None:
    # A forked child inherits the counts but not the reporter thread; it counts for itself.
    global _reporter
    reset()
    _reporter = None


os.register_at_fork(after_in_child=_after_fork_in_child)
