"""`ab run --dry-run`: every visit's server, every cell's exact command, and how long it takes.

The commands are the ones the run would start: the server launch line of each arm (with its
environment) and, per cell, `python -m sglang.benchmark.serving ...`, the GSM8K eval or the
greedy token check with the URL and output file the run would give it. Cells that are already
done (and would be skipped) are marked, and so are finished cells whose raw output is damaged
(measured again).

The time estimate is for what is left to do. A cell to measure costs what cells at the same
load point (shape and concurrency or rate; GSM8K and token cells: of their kind) took in this
run directory, over every arm and repeat (their records hold `wall_s`); a server start costs
what this arm's starts took there (`server_start_s`). With nothing measured yet a cell is
modelled: bench_serving sends its requests in waves of `concurrency` (warm-up, then prompts),
each wave as long as one request, TTFT + (output_len - 1) x TPOT; a request-rate cell lasts
prompts / rate plus two requests (the warm-up burst, the last arrival's request); GSM8K sends
`num_examples` in waves of `parallel`, each up to `max_tokens` long; a token cell is one wave of
its prompts, `output_len` tokens long. TPOT is `--assume-tpot-ms`, else `[slo] tpot_ms` (the
server is expected to meet it), else ASSUMED_TPOT_MS; TTFT is `[slo] ttft_ms`, else
ASSUMED_TTFT_MS; the line says where each came from. A server start never measured is not
guessed: the line gives how many there are and their bound, `health_timeout_s` each.
"""

from __future__ import annotations

import math
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab import runner, server
from sglang_mixgraph.ab.config import CONCURRENCY, Config
from sglang_mixgraph.ab.progress import duration

# Without [slo] (or --assume-tpot-ms): a loaded large-model server's order of magnitude, stated
# in the output; DeepSeek-V4 at concurrency 2048 decodes at about 190 ms.
ASSUMED_TTFT_MS = 1000.0
ASSUMED_TPOT_MS = 50.0


def _url(config: Config, arm: Any) -> str:
    return arm.url.rstrip("/") if arm.url else f"http://{config.server.host}:{config.server.port}"


def plan_lines(
    config: Config,
    run_dir: Path,
    visits: list[runner.Visit],
    current: dict[str, Any] | None,
    *,
    fresh: bool = False,
) -> list[str]:
    """`fresh`: the run starts anew (--force-new), nothing counts as done."""
    lines = []
    for visit in visits:
        done = [not fresh and runner.is_done(run_dir, c, current) for c in visit.cells]
        block = f"block {visit.block + 1}, " if config.sweep.block else ""
        lines.append(
            f"{block}arm {visit.arm.name}, repeat {visit.repeat + 1}: {len(visit.cells)} cells "
            f"({sum(done)} done)"
        )
        arm = visit.arm
        if not all(done):
            where = f"attach {arm.url}" if arm.url else server.launch_line(config, arm)
            lines.append(f"  server: {where}")
        for cell, is_done in zip(visit.cells, done, strict=True):
            module, argv = runner.cell_command(config, run_dir, cell, _url(config, arm))
            command = shlex.join([sys.executable, "-m", module, *argv])
            mark = " (done)" if is_done else ""
            if not fresh and runner.damaged(run_dir, cell):
                mark = " (damaged: measured again)"
            lines.append(f"  {cell.label()}{mark}: {command}")
    return lines


@dataclass(frozen=True)
class Latency:
    """One request's model: TTFT and TPOT in ms, each with where it came from."""

    ttft_ms: float
    tpot_ms: float
    text: str  # "TTFT 1000 ms assumed without ... and TPOT 190 ms from --assume-tpot-ms"


def latency_model(config: Config, assume_tpot_ms: float | None = None) -> Latency:
    """TPOT from --assume-tpot-ms, else [slo] tpot_ms, else assumed; TTFT from [slo] or assumed."""
    limits = config.slo.limits
    if assume_tpot_ms is not None:
        tpot, tpot_from = assume_tpot_ms, "from --assume-tpot-ms"
    elif "tpot_ms" in limits:
        tpot, tpot_from = limits["tpot_ms"], "from [slo] tpot_ms"
    else:
        tpot, tpot_from = ASSUMED_TPOT_MS, "assumed without [slo] tpot_ms or --assume-tpot-ms"
    if "ttft_ms" in limits:
        ttft, ttft_from = limits["ttft_ms"], "from [slo] ttft_ms"
    else:
        ttft, ttft_from = ASSUMED_TTFT_MS, "assumed without [slo] ttft_ms"
    return Latency(ttft, tpot, f"TTFT {ttft:g} ms {ttft_from} and TPOT {tpot:g} ms {tpot_from}")


def modelled_cell_s(config: Config, cell: runner.Cell, latency: Latency) -> float:
    ttft, tpot = latency.ttft_ms, latency.tpot_ms
    if cell.kind == "gsm8k":
        g = config.gsm8k
        return math.ceil(g.num_examples / g.parallel) * (ttft + g.max_tokens * tpot) / 1000
    if cell.kind == "tokens":
        return (ttft + (cell.settings["output_len"] - 1) * tpot) / 1000
    assert cell.point is not None
    bench = cell.settings["bench"]
    request_s = (ttft + (bench["output_len"] - 1) * tpot) / 1000
    if cell.point.kind == CONCURRENCY:
        c = int(cell.point.value)
        waves = math.ceil(bench["warmup_requests"] / c) + math.ceil(bench["num_prompts"] / c)
        return waves * request_s
    return request_s * 2 + bench["num_prompts"] / cell.point.value  # warm-up burst, arrivals


def estimate_line(
    config: Config,
    run_dir: Path,
    visits: list[runner.Visit],
    current: dict[str, Any] | None,
    latency: Latency,
    *,
    fresh: bool = False,
) -> str:
    measured: dict[Any, list[float]] = {}  # (cell kind, point) -> wall seconds
    starts: dict[str, list[float]] = {}  # arm -> server start seconds
    for visit in visits:
        for cell in visit.cells:
            record = runner.read_record(run_dir, cell) or {}
            if record.get("status") != runner.OK:
                continue
            if isinstance(record.get("wall_s"), (int, float)):
                measured.setdefault((cell.kind, cell.point), []).append(float(record["wall_s"]))
            if isinstance(record.get("server_start_s"), (int, float)):
                starts.setdefault(cell.arm, []).append(float(record["server_start_s"]))
    total = 0.0
    from_runs = modelled = 0
    start_count = 0
    unknown_starts = 0
    for visit in visits:
        todo = [c for c in visit.cells if fresh or not runner.is_done(run_dir, c, current)]
        if not todo:
            continue
        if visit.arm.url is None:
            start_count += 1
            if visit.arm.name in starts:
                total += statistics.fmean(starts[visit.arm.name])
            else:
                unknown_starts += 1
        for cell in todo:
            if (cell.kind, cell.point) in measured:
                total += statistics.fmean(measured[(cell.kind, cell.point)])
                from_runs += 1
            else:
                total += modelled_cell_s(config, cell, latency)
                modelled += 1
    cells = from_runs + modelled
    if not cells:
        return "estimate: nothing left to measure"
    parts = []
    if from_runs:
        parts.append(f"{from_runs} as measured in this run directory")
    if modelled:
        parts.append(f"{modelled} modelled with {latency.text}")
    text = (
        f"estimate: about {duration(total)} for {cells} cells ({'; '.join(parts)}) and "
        f"{start_count} server starts"
    )
    if unknown_starts:
        text += (
            f", {unknown_starts} of them not measured yet and not counted (up to "
            f"{config.server.health_timeout_s:g} s each, [server] health_timeout_s)"
        )
    return text
