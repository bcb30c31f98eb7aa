"""The sweep: which cells, in which order, on which server; resumable and interruptible.

A cell is one `bench_serving` run (arm, concurrency, repeat) or one GSM8K eval (arm). Arms
are interleaved per repeat, A B then B A (then A B ...), so slow drift of the machine (clocks,
thermals, other tenants) falls on both arms alike; each visit of an arm gets its own server
(launch mode) that is stopped before the next arm starts. Every cell is keyed by the hash of
its exact settings (config.cell_settings): a cell whose `.cell.json` says ok is skipped when
the run directory is reused, so an interrupted or partly failed run is resumed by running the
same command again, and a changed setting measures anew instead of mixing results.
A failed cell is recorded with its reason and retried on the next run; a server that dies
fails the cell it was serving and the visit moves on (the next visit starts a fresh server).
Every record also holds the versions it was measured with (versions.py: SGLang,
sglang-mixgraph, torch, the git commit, the GPUs); a finished cell whose versions differ from
this environment's is measured again, unless the run reuses cells (`--reuse-cells`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab import server as servers
from sglang_mixgraph.ab import versions
from sglang_mixgraph.ab.config import (
    Arm,
    Config,
    cell_settings,
    gsm8k_settings,
    settings_key,
)
from sglang_mixgraph.ab.tools import (
    BENCH_MODULE,
    GSM8K_MODULE,
    TIMED_OUT,
    Invoker,
    bench_argv,
    gsm8k_argv,
    subprocess_invoker,
)

OK = "ok"
FAILED = "failed"


@dataclass(frozen=True)
class Cell:
    kind: str  # "bench" or "gsm8k"
    arm: str
    concurrency: int | None
    repeat: int
    key: str
    settings: dict[str, Any]

    @property
    def stem(self) -> str:
        if self.kind == "gsm8k":
            return f"gsm8k/{self.arm}_{self.key}"
        return f"cells/{self.arm}/c{self.concurrency:05d}_r{self.repeat}_{self.key}"

    def label(self) -> str:
        if self.kind == "gsm8k":
            return f"gsm8k arm={self.arm}"
        return f"arm={self.arm} concurrency={self.concurrency} repeat={self.repeat + 1}"


@dataclass
class Visit:
    arm: Arm
    repeat: int
    cells: list[Cell] = field(default_factory=list)


def visit_order(arms: tuple[Arm, ...], repeats: int) -> list[tuple[Arm, int]]:
    order = []
    for repeat in range(repeats):
        sequence = arms if repeat % 2 == 0 else tuple(reversed(arms))
        order += [(arm, repeat) for arm in sequence]
    return order


def plan(config: Config, *, accuracy_only: bool = False) -> list[Visit]:
    g = config.gsm8k
    gsm8k_arms = set(g.arms or [a.name for a in config.arms]) if g.enabled else set()
    if accuracy_only:
        order = [(arm, 0) for arm in config.arms if arm.name in gsm8k_arms]
    else:
        order = visit_order(config.arms, config.sweep.repeats)
    visits = []
    for arm, repeat in order:
        visit = Visit(arm=arm, repeat=repeat)
        if repeat == 0 and arm.name in gsm8k_arms:
            # First: a server that answers wrongly fails fast, before the long sweep.
            settings = gsm8k_settings(config, arm)
            visit.cells.append(Cell("gsm8k", arm.name, None, 0, settings_key(settings), settings))
        if not accuracy_only:
            for concurrency in config.sweep.concurrencies:
                settings = cell_settings(config, arm, concurrency, repeat)
                visit.cells.append(
                    Cell("bench", arm.name, concurrency, repeat, settings_key(settings), settings)
                )
        visits.append(visit)
    return visits


# ---------------------------------------------------------------- cell records


def record_path(run_dir: Path, cell: Cell) -> Path:
    return run_dir / f"{cell.stem}.cell.json"


def raw_path(run_dir: Path, cell: Cell) -> Path:
    return run_dir / (f"{cell.stem}.json" if cell.kind == "gsm8k" else f"{cell.stem}.jsonl")


def log_path(run_dir: Path, cell: Cell) -> Path:
    return run_dir / f"{cell.stem}.log"


def read_record(run_dir: Path, cell: Cell) -> dict[str, Any] | None:
    try:
        return json.loads(record_path(run_dir, cell).read_text())
    except (OSError, ValueError):
        return None


def is_done(run_dir: Path, cell: Cell, current: dict[str, Any] | None = None) -> bool:
    """Finished and kept; with `current` versions, only when measured with the same ones."""
    record = read_record(run_dir, cell)
    if not record or record.get("status") != OK or not raw_path(run_dir, cell).exists():
        return False
    return current is None or versions.comparable(record.get("versions")) == versions.comparable(
        current
    )


def stale(run_dir: Path, cells: list[Cell], current: dict[str, Any]) -> list[str]:
    """How the versions of finished cells differ from `current` (one entry per difference)."""
    found: list[str] = []
    for cell in cells:
        if is_done(run_dir, cell) and not is_done(run_dir, cell, current):
            record = read_record(run_dir, cell) or {}
            for change in versions.differences(record.get("versions"), current):
                if change not in found:
                    found.append(change)
    return found


def _write_json(path: Path, data: Any) -> None:
    # Written whole, then renamed: an interrupted write never leaves a record that parses.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- running


class Progress:
    """Cells done out of the plan and an ETA from the cells measured in this session."""

    def __init__(self, total: int, done: int, out: Callable[[str], None]):
        self.total = total
        self.done = done
        self.out = out
        self.started = time.monotonic()
        self.measured = 0

    def line(self, text: str) -> None:
        self.out(f"[ab {self.done}/{self.total}] {text}")

    def finished(self, cell: Cell, outcome: str) -> None:
        self.done += 1
        self.measured += 1
        per_cell = (time.monotonic() - self.started) / self.measured
        left = self.total - self.done
        eta = f"; ETA {_duration(per_cell * left)}" if left else ""
        self.line(f"{cell.label()}: {outcome}{eta}")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


@dataclass
class RunOutcome:
    errors: list[str] = field(default_factory=list)
    interrupted: bool = False


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _bench_summary(raw_file: Path, num_prompts: int) -> tuple[str | None, str]:
    """(error or None, one-line summary) of a bench_serving output file."""
    try:
        lines = raw_file.read_text().splitlines()
        result = json.loads(lines[-1])
    except (OSError, ValueError, IndexError):
        return "bench_serving wrote no result", ""
    completed = result.get("completed")
    if completed != num_prompts:
        return f"{num_prompts - (completed or 0)} of {num_prompts} requests failed", ""
    return None, (
        f"{result['output_throughput']:.1f} tok/s, median TPOT {result['median_tpot_ms']:.1f} ms, "
        f"median TTFT {result['median_ttft_ms']:.1f} ms"
    )


def _run_cell(
    config: Config,
    run_dir: Path,
    cell: Cell,
    srv: servers.Server,
    invoker: Invoker,
) -> tuple[str | None, str]:
    raw = raw_path(run_dir, cell)
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.unlink(missing_ok=True)  # bench_serving appends; a failed try's line is no measurement
    if cell.kind == "gsm8k":
        module, argv, timeout = (
            GSM8K_MODULE,
            gsm8k_argv(config, srv.url, raw),
            config.gsm8k.timeout_s,
        )
    else:
        assert cell.concurrency is not None
        module = BENCH_MODULE
        argv = bench_argv(config, srv.url, cell.concurrency, raw)
        timeout = config.sweep.cell_timeout_s
    log = log_path(run_dir, cell)
    with open(log, "ab") as f:
        f.write(f"\n=== python -m {module} {' '.join(argv)}\n".encode())
    # While the tool runs only the process is watched: probing a busy server's health
    # endpoint would add load to the measurement and can time out under it.
    code = invoker(module, argv, log, timeout, lambda: srv.check_process(cell.label()))
    srv.check_alive(cell.label())
    if code == TIMED_OUT:
        return f"timed out after {timeout:g} s (log {log})", ""
    if code != 0:
        return f"{module} exited with code {code} (log {log}):\n{servers.log_tail(log, 8)}", ""
    if cell.kind == "gsm8k":
        try:
            score = json.loads(raw.read_text())["score"]
        except (OSError, ValueError, KeyError):
            return f"the GSM8K eval wrote no score (log {log})", ""
        return None, f"accuracy {score:.3f}"
    num_prompts = cell.settings["bench"]["num_prompts"]
    error, summary = _bench_summary(raw, num_prompts)
    if error:
        return f"{error} (log {log})", ""
    return None, summary


def run(
    config: Config,
    run_dir: Path,
    visits: list[Visit],
    *,
    invoker: Invoker = subprocess_invoker,
    out: Callable[[str], None] = _stderr,
    reuse_cells: bool = False,
) -> RunOutcome:
    env = versions.environment()
    current = None if reuse_cells else env
    cells = [c for v in visits for c in v.cells]
    progress = Progress(len(cells), sum(is_done(run_dir, c, current) for c in cells), out)
    changed = [] if reuse_cells else stale(run_dir, cells, env)
    if changed:
        kept = sum(is_done(run_dir, c) for c in cells) - progress.done
        progress.line(
            f"{kept} finished cells were measured with other versions ({'; '.join(changed)}): "
            "measuring them again (--reuse-cells keeps them)"
        )
    if progress.done:
        progress.line(f"resuming: {progress.done} finished cells are kept and skipped")
    outcome = RunOutcome()
    broken_arms: dict[str, str] = {}
    visit_counts: dict[str, int] = {}
    try:
        for visit in visits:
            arm = visit.arm
            visit_counts[arm.name] = visit_counts.get(arm.name, 0) + 1
            todo = [c for c in visit.cells if not is_done(run_dir, c, current)]
            if not todo:
                continue
            if arm.name in broken_arms:
                for cell in todo:
                    _fail(run_dir, cell, broken_arms[arm.name], progress, outcome, quiet=True)
                continue
            progress.line(
                f"arm {arm.name!r}, repeat {visit.repeat + 1}: "
                + (f"attaching to {arm.url}" if arm.url else "launching the server")
            )
            try:
                if arm.url:
                    srv = servers.attach(arm, timeout_s=min(60.0, config.server.health_timeout_s))
                else:
                    server_log = run_dir / "servers" / f"{arm.name}_{visit_counts[arm.name]}.log"
                    srv = servers.launch(config, arm, server_log)
            except servers.ServerError as e:
                # It will not start on the next visit either; its cells fail, the rest run.
                broken_arms[arm.name] = f"no server: {str(e).splitlines()[0]}"
                outcome.errors.append(str(e))
                out(str(e))
                for cell in todo:
                    _fail(run_dir, cell, broken_arms[arm.name], progress, outcome, quiet=True)
                continue
            try:
                for cell in todo:
                    started = time.time()
                    try:
                        error, summary = _run_cell(config, run_dir, cell, srv, invoker)
                    except servers.ServerError as e:
                        _fail(run_dir, cell, str(e), progress, outcome)
                        break  # the visit is over; the next one starts a fresh server
                    if error:
                        _fail(run_dir, cell, error, progress, outcome)
                        continue
                    _write_json(
                        record_path(run_dir, cell),
                        {
                            "status": OK,
                            "key": cell.key,
                            "settings": cell.settings,
                            "started": started,
                            "wall_s": time.time() - started,
                            "server_url": srv.url,
                            "versions": env,
                        },
                    )
                    progress.finished(cell, summary)
            finally:
                # Uninterruptible; prints any pid left. A signal during it is raised after.
                srv.stop()
    except KeyboardInterrupt:
        outcome.interrupted = True
    return outcome


def _fail(
    run_dir: Path,
    cell: Cell,
    error: str,
    progress: Progress,
    outcome: RunOutcome,
    *,
    quiet: bool = False,
) -> None:
    _write_json(
        record_path(run_dir, cell),
        {"status": FAILED, "key": cell.key, "settings": cell.settings, "error": error},
    )
    if not quiet:
        outcome.errors.append(f"{cell.label()}: {error}")
    progress.finished(cell, f"FAILED: {error}")
