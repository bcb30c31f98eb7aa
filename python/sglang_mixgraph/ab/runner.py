"""The sweep: which cells, in which order, on which server; resumable and interruptible.

A cell is one `bench_serving` run (arm, load point: a shape's concurrency or request rate,
repeat), one GSM8K eval (arm) or one greedy token check (arm, repeat: `[tokens]`, after the
visit's load cells on the same server, so the timed cells are untouched). Arms
are interleaved per repeat, A B then B A (then A B ...), or in a configured block order such as
U E L L E U, so slow drift of the machine (clocks, thermals, other tenants) falls on both arms
alike; each visit of an arm gets its own server (launch mode) that is stopped before the next
arm starts. A block (each repeat, without a block order) runs whole on one machine: every
record names its machine (`--machine`, else host and boot id), a block begun on another
machine is measured again whole, `--max-blocks` stops after that many blocks (one machine's
share), and a machine that has served nothing of the run first serves one discarded visit of
`[sweep] warm_visit`. Every cell is keyed by the hash of
its exact settings (config.cell_settings): a cell whose `.cell.json` says ok is skipped when
the run directory is reused, so an interrupted or partly failed run is resumed by running the
same command again, and a changed setting measures anew instead of mixing results.
A failed cell is recorded with its reason (one line that names its log; a download that
failed names the setting that avoids it) and retried on the next run; a server that dies
fails the cell it was serving and the visit moves on (the next visit starts a fresh server).
A finished cell whose raw output no longer reads back (truncated, emptied, removed) is
damaged: a resume names it and measures it again, keeping the damaged file as `.damaged`.
Every record also holds the versions it was measured with (versions.py: SGLang,
sglang-mixgraph, torch, the git commit, the GPUs); a finished cell whose versions differ from
this environment's is measured again, its raw output kept as `.superseded`, unless the run
reuses cells (`--reuse-cells`). GPUs that cannot be read now (or could not then) are unknown,
which keeps the cells and says so: a finished raw output is never overwritten.
While a cell runs and while a server starts, a line every `--progress-every` seconds says how
long it has taken, for a load cell how many requests are done, and what its log last said
(progress.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab import files, network, versions
from sglang_mixgraph.ab import server as servers
from sglang_mixgraph.ab.config import (
    CONCURRENCY,
    Arm,
    Config,
    Point,
    cell_settings,
    gsm8k_settings,
    settings_key,
    tokens_settings,
)
from sglang_mixgraph.ab.greedy_tokens import digest
from sglang_mixgraph.ab.progress import (
    DEFAULT_EVERY_S,
    TRY_HEADER,
    Heartbeat,
    duration,
    last_line,
)
from sglang_mixgraph.ab.tools import (
    GSM8K_MODULE,
    TIMED_OUT,
    TOKENS_MODULE,
    Invoker,
    bench_argv,
    gsm8k_argv,
    subprocess_invoker,
    tokens_argv,
)
from sglang_mixgraph.resolution.serving_client import BENCH_MODULE

OK = "ok"
FAILED = "failed"
# What a finished cell's raw output is renamed to when the cell is measured again.
DAMAGED, SUPERSEDED = ".damaged", ".superseded"
# What the report and the summary read from a bench_serving result line.
BENCH_KEYS = ("completed", "output_throughput", "median_tpot_ms", "median_ttft_ms")
# A failed tool's log is read from its end for the marks of a failed download.
LOG_TAIL_BYTES = 65536
# Every cell record of a run directory: bench cells, GSM8K cells, token checks, warm visits.
BENCH_RECORDS, GSM8K_RECORDS = "cells/*/*.cell.json", "gsm8k/*.cell.json"
TOKENS_RECORDS, WARM_RECORDS = "tokens/*.cell.json", "warm/*/*.cell.json"
RECORD_GLOBS = (BENCH_RECORDS, GSM8K_RECORDS, TOKENS_RECORDS, WARM_RECORDS)
# Kinds whose raw output is one JSON document (bench_serving appends a line per run).
DOCUMENT_KINDS = ("gsm8k", "tokens")


@dataclass(frozen=True)
class Cell:
    kind: str  # "bench", "gsm8k" or "tokens"
    arm: str
    point: Point | None  # None for GSM8K and tokens
    repeat: int
    key: str
    settings: dict[str, Any]
    several_shapes: bool = False  # the shape's name goes into file names and labels
    warm_on: str | None = None  # a discarded warm visit's cell on this machine

    @property
    def concurrency(self) -> int | None:
        if self.point is None or self.point.kind != CONCURRENCY:
            return None
        return int(self.point.value)

    @property
    def stem(self) -> str:
        if self.kind == "gsm8k":
            return f"gsm8k/{self.arm}_{self.key}"
        if self.kind == "tokens":
            return f"tokens/{self.arm}_r{self.repeat}_{self.key}"
        assert self.point is not None
        shape = f"{self.point.shape}_" if self.several_shapes else ""
        if self.point.kind == CONCURRENCY:
            load = f"c{int(self.point.value):05d}"
        else:
            load = f"rate{self.point.value:g}"
        if self.warm_on is not None:
            return f"warm/{self.warm_on}/{self.arm}_{shape}{load}_{self.key}"
        return f"cells/{self.arm}/{shape}{load}_r{self.repeat}_{self.key}"

    def label(self) -> str:
        if self.kind == "gsm8k":
            return f"gsm8k arm={self.arm}"
        if self.kind == "tokens":
            return f"tokens arm={self.arm} repeat={self.repeat + 1}"
        assert self.point is not None
        shape = f" shape={self.point.shape}" if self.several_shapes else ""
        which = "warm visit" if self.warm_on is not None else f"repeat={self.repeat + 1}"
        return f"arm={self.arm}{shape} {self.point.describe()} {which}"


@dataclass
class Visit:
    arm: Arm
    repeat: int
    cells: list[Cell] = field(default_factory=list)
    block: int = 0


def visit_order(config: Config) -> list[tuple[Arm, int]]:
    """(arm, repeat) in run order: A B, B A, ... or `block` repeated, its k-th visit of an arm in
    block b being repeat b x visits per arm + k."""
    sw, arms = config.sweep, config.arms
    order = []
    if not sw.block:
        for repeat in range(sw.repeats):
            sequence = arms if repeat % 2 == 0 else tuple(reversed(arms))
            order += [(arm, repeat) for arm in sequence]
        return order
    per_arm = sw.visits_per_block()
    for block in range(sw.repeats // per_arm):
        seen: dict[str, int] = {}
        for name in sw.block:
            order.append((config.arm(name), block * per_arm + seen.get(name, 0)))
            seen[name] = seen.get(name, 0) + 1
    return order


def _listed(enabled: bool, arms: tuple[str, ...], config: Config) -> set[str]:
    """The arms a section runs on: those it lists, else every arm; none when it is off."""
    return set(arms or [a.name for a in config.arms]) if enabled else set()


def plan(config: Config, *, accuracy_only: bool = False) -> list[Visit]:
    g, t = config.gsm8k, config.tokens
    gsm8k_arms = _listed(g.enabled, g.arms, config)
    tokens_arms = set() if accuracy_only else _listed(t.enabled, t.arms, config)
    if accuracy_only:
        order = [(arm, 0) for arm in config.arms if arm.name in gsm8k_arms]
    else:
        order = visit_order(config)
    visits = []
    for arm, repeat in order:
        visit = Visit(arm=arm, repeat=repeat, block=config.sweep.block_of(repeat))
        if repeat == 0 and arm.name in gsm8k_arms:
            # First: a server that answers wrongly fails fast, before the long sweep.
            settings = gsm8k_settings(config, arm)
            visit.cells.append(Cell("gsm8k", arm.name, None, 0, settings_key(settings), settings))
        if not accuracy_only:
            several = len(config.sweep.shapes) > 1
            for point in config.sweep.points():
                settings = cell_settings(config, arm, point, repeat)
                key = settings_key(settings)
                visit.cells.append(Cell("bench", arm.name, point, repeat, key, settings, several))
        if arm.name in tokens_arms:
            # Last: on the server the load cells used, after them, outside their timing.
            settings = tokens_settings(config, arm, repeat)
            visit.cells.append(
                Cell("tokens", arm.name, None, repeat, settings_key(settings), settings)
            )
        visits.append(visit)
    return visits


# ---------------------------------------------------------------- cell records


def record_path(run_dir: Path, cell: Cell) -> Path:
    return run_dir / f"{cell.stem}.cell.json"


def raw_path(run_dir: Path, cell: Cell) -> Path:
    suffix = ".json" if cell.kind in DOCUMENT_KINDS else ".jsonl"
    return run_dir / f"{cell.stem}{suffix}"


def log_path(run_dir: Path, cell: Cell) -> Path:
    return run_dir / f"{cell.stem}.log"


class RecordError(ValueError):
    """A cell record that parses as JSON but is no object: this tool did not write it."""


def load_record(path: Path) -> dict[str, Any] | None:
    """The record at `path`; None when missing or not JSON (its cell is measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        # Not silently measured again: a hand edit or another tool's file, the user decides.
        raise RecordError(
            f"{path}: not a cell record (JSON {type(data).__name__}, not an object); move it "
            "away and its cell is measured again"
        )
    return data


def read_record(run_dir: Path, cell: Cell) -> dict[str, Any] | None:
    return load_record(record_path(run_dir, cell))


def record_problem(run_dir: Path) -> str | None:
    """The first record of `run_dir` that is no object (None: there is none), so that a run
    refuses it before starting a server instead of failing on it mid-run."""
    for pattern in RECORD_GLOBS:
        for path in sorted(run_dir.glob(pattern)):
            try:
                load_record(path)
            except RecordError as e:
                return str(e)
    return None


def raw_problem(run_dir: Path, cell: Cell) -> str | None:
    """Why a cell's raw output does not read back as a result (None: it does)."""
    path = raw_path(run_dir, cell)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return f"its raw output {path} is missing"
    except (OSError, UnicodeDecodeError) as e:
        return f"its raw output {path} cannot be read ({e})"
    lines = text.splitlines() or [""]
    try:
        # bench_serving appends one line per run; the runner gives each try a fresh file.
        result = json.loads(text if cell.kind in DOCUMENT_KINDS else lines[-1])
    except ValueError:
        return f"its raw output {path} does not parse as JSON (truncated?)"
    if cell.kind == "tokens":
        return _output_ids_problem(path, result, int(cell.settings["prompts"]))
    keys = ("score",) if cell.kind == "gsm8k" else BENCH_KEYS
    for key in keys:
        value = result.get(key) if isinstance(result, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"its raw output {path} has no {key!r}"
    return None


def _output_ids_problem(path: Path, result: Any, prompts: int) -> str | None:
    outputs = result.get("output_ids") if isinstance(result, dict) else None
    if not isinstance(outputs, list) or len(outputs) != prompts:
        return f"its raw output {path} has no 'output_ids' for its {prompts} prompts"
    if not all(isinstance(ids, list) for ids in outputs):
        return f"its raw output {path} has an 'output_ids' entry that is no list"
    return None


def damaged(run_dir: Path, cell: Cell) -> str | None:
    """Why a cell recorded as finished is no result (None: it is one, or is not finished)."""
    record = read_record(run_dir, cell)
    if not record or record.get("status") != OK:
        return None
    return raw_problem(run_dir, cell)


def is_done(run_dir: Path, cell: Cell, current: dict[str, Any] | None = None) -> bool:
    """Finished and kept; with `current` versions, only when measured with the same ones."""
    record = read_record(run_dir, cell)
    if not record or record.get("status") != OK or raw_problem(run_dir, cell):
        return False
    return current is None or versions.same(record.get("versions"), current)


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


def _free_name(path: Path) -> Path:
    """`path`, or `path.2`, `path.3`...: the first that does not exist (nothing kept is lost)."""
    n, free = 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{path.name}.{n}")
    return free


def _write_json(path: Path, data: Any) -> None:
    # Written whole, then renamed: an interrupted write never leaves a record that parses.
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


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
        eta = f"; ETA {duration(per_cell * left)}" if left else ""
        self.line(f"{cell.label()}: {outcome}{eta}")


@dataclass
class RunOutcome:
    errors: list[str] = field(default_factory=list)
    interrupted: bool = False


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _bench_summary(raw_file: Path, expected: int) -> tuple[str | None, str]:
    """(error or None, one-line summary) of a bench_serving output file; `expected`: its
    `completed` count when every request succeeds (Sweep.completions)."""
    try:
        lines = raw_file.read_text().splitlines()
        result = json.loads(lines[-1])
    except (OSError, ValueError, IndexError):
        return "bench_serving wrote no result", ""
    completed = result.get("completed")
    if completed != expected:
        return f"{expected - (completed or 0)} of {expected} requests failed", ""
    summary = (
        f"{result['output_throughput']:.1f} tok/s, median TPOT {result['median_tpot_ms']:.1f} ms, "
        f"median TTFT {result['median_ttft_ms']:.1f} ms"
    )
    if isinstance(result.get("accept_length"), (int, float)):
        summary += f", accept length {result['accept_length']:.2f}"
    if "request_goodput" in result:
        summary += (
            f", goodput {result['request_goodput']:.2f} req/s "
            f"({100 * result['slo_attainment']:.0f}% within the SLOs)"
        )
    return None, summary


def cell_command(config: Config, run_dir: Path, cell: Cell, url: str) -> tuple[str, list[str]]:
    """The module and arguments a cell runs (`python -m module *argv`) against `url`."""
    raw = raw_path(run_dir, cell)
    if cell.kind == "gsm8k":
        return GSM8K_MODULE, gsm8k_argv(config, url, raw)
    if cell.kind == "tokens":
        return TOKENS_MODULE, tokens_argv(config, url, raw)
    assert cell.point is not None
    return BENCH_MODULE, bench_argv(config, url, cell.point, raw)


def _run_cell(
    config: Config,
    run_dir: Path,
    cell: Cell,
    srv: servers.Server,
    invoker: Invoker,
    heartbeat: Heartbeat,
) -> tuple[str | None, str]:
    raw = raw_path(run_dir, cell)
    raw.parent.mkdir(parents=True, exist_ok=True)
    record = read_record(run_dir, cell)
    if record and record.get("status") == OK and raw.exists():
        # A finished cell measured again (damaged, or other versions): its raw output is kept
        # aside, never overwritten; a deleted raw output leaves nothing to keep.
        aside = SUPERSEDED if raw_problem(run_dir, cell) is None else DAMAGED
        os.replace(raw, _free_name(raw.with_name(raw.name + aside)))
    raw.unlink(missing_ok=True)  # bench_serving appends; a failed try's line is no measurement
    module, argv = cell_command(config, run_dir, cell, srv.url)
    timeout = {"gsm8k": config.gsm8k.timeout_s, "tokens": config.tokens.timeout_s}.get(
        cell.kind, config.sweep.cell_timeout_s
    )
    log = log_path(run_dir, cell)
    with open(log, "ab") as f:
        f.write(f"{TRY_HEADER}{module} {' '.join(argv)}\n".encode())

    def watch() -> None:
        # While the tool runs only the process is watched: probing a busy server's health
        # endpoint would add load to the measurement and can time out under it.
        srv.check_process(cell.label())
        heartbeat.tick()

    code = invoker(module, argv, log, timeout, watch)
    srv.check_alive(cell.label())
    if code == TIMED_OUT:
        return f"timed out after {timeout:g} s (log {log})", ""
    if code != 0:
        fetch = network.failed_fetch(config, cell.kind, _log_end(log))
        if fetch is not None:
            return f"needs network: {fetch.what} failed; set {fetch.avoid} (log {log})", ""
        # The summary shows the first line only: it names the cause and the log.
        return (
            f"{module} exited with code {code}: {last_line(log) or 'no output'} (log {log})\n"
            f"{servers.log_tail(log, 8)}",
            "",
        )
    if cell.kind == "gsm8k":
        try:
            score = json.loads(raw.read_text())["score"]
        except (OSError, ValueError, KeyError):
            return f"the GSM8K eval wrote no score (log {log})", ""
        return None, f"accuracy {score:.3f}"
    if cell.kind == "tokens":
        return _tokens_summary(run_dir, cell, log)
    assert cell.point is not None
    error, summary = _bench_summary(raw, config.sweep.completions(cell.point))
    if error:
        return f"{error} (log {log})", ""
    return None, summary


def _tokens_summary(run_dir: Path, cell: Cell, log: Path) -> tuple[str | None, str]:
    if problem := raw_problem(run_dir, cell):
        return f"the greedy token check wrote no output ids: {problem} (log {log})", ""
    outputs = json.loads(raw_path(run_dir, cell).read_text())["output_ids"]
    # The digest in the progress line shows a difference between visits as the run goes.
    return None, f"{len(outputs)} prompts, output ids digest {digest(outputs)}"


def _headline(message: str) -> str:
    """A server error whose first line, the summary's, ends with its log, not 'last lines:'."""
    first, newline, rest = message.partition("\n")
    return first.removesuffix(", last lines:") + newline + rest


def _log_end(log: Path) -> str:
    """The end of a cell's log: its last try, where a failed download shows."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return text[text.rfind(TRY_HEADER) + 1 :]  # from the last try's header


def machine_of(run_dir: Path, cell: Cell) -> str | None:
    """The machine a finished cell's record names (None: written before machines were)."""
    return (read_record(run_dir, cell) or {}).get("machine")


def served_on(run_dir: Path, machine: str) -> bool:
    """Whether any cell of the run directory, warm visits included, was measured on `machine`."""
    for path in [*run_dir.glob(BENCH_RECORDS), *run_dir.glob(WARM_RECORDS)]:
        record = load_record(path) or {}
        if record.get("status") == OK and record.get("machine") == machine:
            return True
    return False


def _blocks_todo(
    run_dir: Path,
    visits: list[Visit],
    current: dict[str, Any] | None,
    machine: str,
    out: Callable[[str], None],
) -> list[list[tuple[Visit, list[Cell]]]]:
    """Per block (in plan order), each visit with the cells left to measure on `machine`.

    A block finished or begun on another machine keeps its cells only when it is finished: a
    ratio pairs cells of one machine, so a block begun elsewhere is measured again whole here.
    """
    by_block: dict[int, list[Visit]] = {}
    for visit in visits:
        by_block.setdefault(visit.block, []).append(visit)
    todo = []
    for block, block_visits in by_block.items():
        cells = [c for v in block_visits for c in v.cells]
        done = [c for c in cells if is_done(run_dir, c, current)]
        elsewhere = sorted({machine_of(run_dir, c) or "not recorded" for c in done} - {machine})
        whole = bool(elsewhere) and len(done) < len(cells)
        if whole:
            out(
                f"block {block + 1} was begun on machine {', '.join(elsewhere)}: measuring it "
                f"again whole on {machine} (a ratio never pairs cells of two machines)"
            )
        left = [(v, [c for c in v.cells if whole or c not in done]) for v in block_visits]
        todo.append(left)
    return todo


def run(
    config: Config,
    run_dir: Path,
    visits: list[Visit],
    *,
    invoker: Invoker = subprocess_invoker,
    out: Callable[[str], None] = _stderr,
    reuse_cells: bool = False,
    progress_every_s: float = DEFAULT_EVERY_S,
    machine: str | None = None,
    max_blocks: int | None = None,
) -> RunOutcome:
    env = versions.environment()
    machine = machine or versions.machine_id()
    current = None if reuse_cells else env
    cells = [c for v in visits for c in v.cells]
    for cell in cells:
        problem = damaged(run_dir, cell)
        if problem:
            out(f"{cell.label()}: finished but damaged, {problem}: measuring it again")
    changed = [] if reuse_cells else stale(run_dir, cells, env)
    blocks = _blocks_todo(run_dir, visits, current, machine, out)
    left = sum(len(c) for block in blocks for _, c in block)
    progress = Progress(len(cells), len(cells) - left, out)
    if changed:
        kept = sum(is_done(run_dir, c) for c in cells) - progress.done
        progress.line(
            f"{kept} finished cells were measured with other versions ({'; '.join(changed)}): "
            f"measuring them again, their raw outputs kept as *{SUPERSEDED} (--reuse-cells "
            "keeps the cells)"
        )
    if not versions.gpus_known(env.get("gpus")) and any(is_done(run_dir, c) for c in cells):
        progress.line(
            f"this machine's GPUs are {versions.describe_field('gpus', env.get('gpus'))}: "
            "finished cells are kept (an unreadable GPU inventory is not another machine)"
        )
    if progress.done:
        progress.line(f"resuming: {progress.done} finished cells are kept and skipped")
    state = _VisitState(config, run_dir, invoker, progress, progress_every_s, env, machine)
    started_blocks = 0
    try:
        for block_visits in blocks:
            if not any(todo for _, todo in block_visits):
                continue
            if max_blocks is not None and started_blocks >= max_blocks:
                progress.line(
                    f"stopping after {started_blocks} block(s) (--max-blocks {max_blocks}); "
                    "the rest is not measured yet"
                )
                break
            started_blocks += 1
            warm = config.sweep.warm_visit
            if warm is not None and not served_on(run_dir, machine):
                state.serve_warm_visit(config.arm(warm), visits)
            for visit, todo in block_visits:
                state.serve(visit, todo)
    except KeyboardInterrupt:
        state.outcome.interrupted = True
    return state.outcome


class _VisitState:
    """One `run`'s servers and records: serves a visit's cells on a fresh server."""

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        invoker: Invoker,
        progress: Progress,
        progress_every_s: float,
        env: dict[str, Any],
        machine: str,
    ):
        self.config, self.run_dir, self.invoker = config, run_dir, invoker
        self.progress, self.every_s, self.env, self.machine = (
            progress,
            progress_every_s,
            env,
            machine,
        )
        self.outcome = RunOutcome()
        self.broken_arms: dict[str, str] = {}

    def serve_warm_visit(self, arm: Arm, visits: list[Visit]) -> None:
        """One cell of `arm`'s first visit on a fresh server, recorded under warm/, not counted."""
        first = next(c for v in visits if v.arm.name == arm.name for c in v.cells if c.point)
        cell = replace(first, warm_on=self.machine)
        self.progress.line(
            f"machine {self.machine} has served nothing of this run: one warm visit of "
            f"{arm.name!r} first (discarded)"
        )
        self.serve(Visit(arm=arm, repeat=first.repeat, block=-1), [cell], warm=True)

    def serve(self, visit: Visit, todo: list[Cell], *, warm: bool = False) -> None:
        if not todo:
            return
        arm, progress, run_dir = visit.arm, self.progress, self.run_dir
        if arm.name in self.broken_arms:
            for cell in todo:
                self._fail(cell, self.broken_arms[arm.name], quiet=True, warm=warm)
            return
        what = "warm visit" if warm else f"repeat {visit.repeat + 1}"
        progress.line(
            f"arm {arm.name!r}, {what}: "
            + (f"attaching to {arm.url}" if arm.url else "launching the server")
        )
        launch_started = time.monotonic()
        try:
            if arm.url:
                srv = servers.attach(arm, timeout_s=min(60.0, self.config.server.health_timeout_s))
            else:
                n = "warm" if warm else visit.repeat + 1  # an arm's n-th visit is its repeat n
                server_log = run_dir / "servers" / f"{arm.name}_{n}.log"
                starting = Heartbeat(
                    f"arm {arm.name!r}: server starting", server_log, progress.line, self.every_s
                )
                srv = servers.launch(self.config, arm, server_log, on_wait=starting.tick)
        except servers.ServerError as e:
            # It will not start on the next visit either; its cells fail, the rest run.
            self.broken_arms[arm.name] = f"no server: {_headline(str(e)).splitlines()[0]}"
            self.outcome.errors.append(str(e))
            progress.out(str(e))
            for cell in todo:
                self._fail(cell, self.broken_arms[arm.name], quiet=True, warm=warm)
            return
        server_start_s = time.monotonic() - launch_started
        try:
            for cell in todo:
                started = time.time()
                heartbeat = Heartbeat(
                    f"{cell.label()}: running",
                    log_path(run_dir, cell),
                    progress.line,
                    self.every_s,
                    counts_requests=cell.kind == "bench",
                )
                try:
                    error, summary = _run_cell(
                        self.config, run_dir, cell, srv, self.invoker, heartbeat
                    )
                except servers.ServerError as e:
                    self._fail(cell, _headline(str(e)), warm=warm)
                    break  # the visit is over; the next one starts a fresh server
                if error:
                    self._fail(cell, error, warm=warm)
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
                        # What starting this visit's server took, for --dry-run's estimate.
                        "server_start_s": server_start_s,
                        "versions": self.env,
                        "machine": self.machine,
                        "block": visit.block,
                    },
                )
                if warm:
                    progress.line(f"{cell.label()}: {summary} (discarded)")
                else:
                    progress.finished(cell, summary)
        finally:
            # Uninterruptible; prints any pid left. A signal during it is raised after.
            srv.stop()

    def _fail(self, cell: Cell, error: str, *, quiet: bool = False, warm: bool = False) -> None:
        _write_json(
            record_path(self.run_dir, cell),
            {"status": FAILED, "key": cell.key, "settings": cell.settings, "error": error},
        )
        if warm:
            # A failed warm visit is no measurement; the block's own visits say what is wrong.
            self.progress.line(f"{cell.label()}: FAILED: {error}")
            return
        if not quiet:
            self.outcome.errors.append(f"{cell.label()}: {error}")
        self.progress.finished(cell, f"FAILED: {error}")
