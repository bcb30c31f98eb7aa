"""A run directory is used by one `ab run` at a time and never loses a cell it finished.

Lock: `ab run` holds an exclusive `flock` on `RUN_DIR/.lock` from before it writes `run.json`
until it exits; the kernel drops it when the process dies, so a killed run never leaves it
held. A second `ab run` on the directory refuses at once, naming the holder's pid.
Configuration: `digest` hashes what `run.json` records (the configuration after the
command-line overrides, with the prompt counts written out; `[run]` says how to run, not what
is measured, and is left out). A run with another configuration may extend the directory
(more repeats, load points or arms, another threshold or gate: every finished cell stays in
its plan) but may not leave out a cell the directory finished, which would silently vanish
from the report: that is refused naming both digests, unless `--force-new` moves the earlier
run aside to a sibling directory. Nothing is deleted.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab.results import RUN_FILE
from sglang_mixgraph.ab.runner import BENCH_RECORDS, GSM8K_RECORDS, TOKENS_RECORDS

LOCK_FILE = ".lock"
# Finished cells of the report (warm visits are discarded measurements, not reported).
RECORDS = (BENCH_RECORDS, GSM8K_RECORDS, TOKENS_RECORDS)
RECORD_SUFFIX = ".cell.json"


class RunDirBusy(RuntimeError):
    """Another `ab run` holds the directory."""


def digest(recorded: dict[str, Any], accuracy_only: bool) -> str:
    what = {k: v for k, v in recorded.items() if k != "run"}
    text = json.dumps({"config": what, "accuracy_only": accuracy_only}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def recorded_digest(run_dir: Path) -> str | None:
    """The digest of the run.json in `run_dir`; None: there is none."""
    path = run_dir / RUN_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return digest(data["config"], bool(data.get("accuracy_only", False)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "unreadable"


def finished(run_dir: Path) -> list[str]:
    """The stems (`cells/ARM/...`) of every cell recorded as finished in `run_dir`."""
    stems = []
    for pattern in RECORDS:
        for path in sorted(run_dir.glob(pattern)):
            try:
                ok = json.loads(path.read_text()).get("status") == "ok"
            except (OSError, ValueError, AttributeError):
                continue
            if ok:
                stems.append(str(path.relative_to(run_dir))[: -len(RECORD_SUFFIX)])
    return stems


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / RUN_FILE).exists() or bool(finished(run_dir))


def conflict(run_dir: Path, new_digest: str, planned: set[str]) -> str | None:
    """Why this configuration may not use `run_dir` (None: it may): it would drop cells."""
    old = recorded_digest(run_dir)
    if old == new_digest:
        return None
    left_out = [stem for stem in finished(run_dir) if stem not in planned]
    if not left_out:
        return None
    return (
        f"run directory {run_dir}: holds a run of configuration {old or 'not recorded'} and "
        f"this one is {new_digest}, which leaves out {len(left_out)} of its finished cells "
        f"(e.g. {left_out[0]}); give another --run-dir, or --force-new to move the earlier "
        "run aside"
    )


def aside_path(run_dir: Path) -> Path:
    """A sibling name for the earlier run: `RUN_DIR.old-YYYYmmdd-HHMMSS[-N]`."""
    base = f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = run_dir.with_name(base), 1
    while path.exists():
        n += 1
        path = run_dir.with_name(f"{base}-{n}")
    return path


class Lock:
    """The exclusive lock of `run_dir` (created if needed); `release()` or process exit frees it."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / LOCK_FILE
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self.fd, 64).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise RunDirBusy(
                f"run directory {run_dir}: in use by another `ab run` (pid {holder}); wait "
                "for it to end, or give another --run-dir"
            ) from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1


def take(
    run_dir: Path, new_digest: str, planned: set[str], force_new: bool
) -> tuple[Lock, Path | None]:
    """Lock `run_dir` for this run; with `force_new`, move an earlier run aside first.

    Returns the lock and where the earlier run went (None: it stayed). Raises RunDirBusy, or
    ValueError with the conflict's line when the directory holds another configuration's cells.
    """
    lock = Lock(run_dir)
    try:
        if force_new and holds_a_run(run_dir):
            # Renamed while locked: no other run can be writing into it.
            moved = aside_path(run_dir)
            os.rename(run_dir, moved)
            lock.release()
            return Lock(run_dir), moved
        problem = conflict(run_dir, new_digest, planned)
        if problem:
            raise ValueError(problem)
    except BaseException:
        lock.release()
        raise
    return lock, None
