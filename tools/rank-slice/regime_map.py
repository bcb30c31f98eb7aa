"""The regime map: how much replaying a MIXED step gains over running it eagerly, across the work
of a step, on the FP8 slice (`upstream` eager against `bcg-auto-lean` replayed: the project's
leanest replay, the prefill buckets derived with the break running `wo_a` and the compressor
plans capped).

Cells: the chunk's prefill part 1024 / 2048 / 4096 tokens (next to up to 256 decode rows, so
`run_slice_probe.py --chunk` 1280 / 2304 / 4352) by context 2k / 8k, 272 requests of 200 output
tokens; one device call a cell (`regime_map.sh CELL`), the two arms alternating in it.

    python3 tools/rank-slice/regime_map.py plan             # every cell: predicted visits, command
    python3 tools/rank-slice/regime_map.py args 2048x8k     # one cell's run_slice_probe.py arguments
    python3 tools/rank-slice/regime_map.py read DIR_OR_JSON ... [--json docs/results/regime_map.json]
        [--svg docs/results/regime_map.svg]

`plan` prices each visit from the burst's steps at the cell's chunk (`adaptive_steps.served_steps`)
with costs measured on one H100 at chunk 2816 (`COSTS`), and keeps the visits that fit one call.
`read` turns probe reports (`rank_slice_probe.json`, or `.json.xz`) into the map's rows: per cell
the eager and replayed MIXED wall medians (the median of the visits' medians), the replay's gain
(eager over replayed), the eager step's host / kernel ratio (its MIXED host median over the
profiled step's kernels), the visits' spread, and whether every visit's greedy tokens agree;
`--svg` draws the gains over that ratio beside the upstream PR's 8 x B300 point (`SEED_POINT`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import lzma
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from slice_arms import PAGE, RUNNING

PREFILL = (1024, 2048, 4096)  # the chunk's prefill part, tokens
CONTEXTS = {  # run_slice_probe.py's workload per context (8k: the radix cache holds 6144 once)
    "2k": {"input_len": 2048, "shared_prefix": 0, "context_length": 8192},
    "8k": {"input_len": 8192, "shared_prefix": 6144, "context_length": 8448},
}
REQUESTS, OUTPUT_LEN = 272, 200
EAGER, REPLAY = "upstream", "bcg-auto-lean"
PROBE_FLAGS = ["--kernels", "faithful", "--fp8", "--fp8-gemm", "torch"]
SH = "tools/rank-slice/regime_map.sh"
BUDGET_S = 540  # run_slice_probe.py --budget-s: a 600 s call less the kit's start and cache save
PROFILED_AT = 0.85  # the profiled MIXED step's place in the burst (step 185 of 217 at chunk 2816)
STEADY_ROWS = 2791  # the rows of the step the kernel times below were measured at

# One H100, FP8 slice, faithful kernels, torch FP8 GEMMs, chunk 2816, 272 x (L + 200):
# 2k from docs/results/replay_cost_h100 (call 2), 8k from docs/results/split_8k_h100 (call 1),
# both slower visits than later ones, kept so that a visit planned fits a slow machine.
# Host: the mean eager MIXED host per step (the p90 is 1.5x the median, so the mean, not the
# median); kernels: the profiled step's (2791 rows), scaled by rows; start: the Engine's (the
# replay adds its capture, about 25 s for buckets up to 2816).
COSTS = {
    "2k": {"eager_host_ms": 300, "kernel_ms": 248, "start_s": 50},
    "8k": {"eager_host_ms": 369, "kernel_ms": 277, "start_s": 70},
}
# The profiled step's trace and tables, written inside the burst and outside every timed step:
# 24.0-25.1 s for an eager step, 4.4 s for a replayed one (docs/results/wo_a_in_break_h100.md).
EXPORT_S = {"eager": 26, "replay": 5}
# The eager host per MIXED step shrinks with the step's rows, less than its kernels do: its
# median was 242 ms at 2791 rows and 181-186 ms at about 1124 (the 1024x2k cell,
# docs/results/regime_map_h100.md), so host = the 2791-row host x (FIXED + (1 - FIXED) x rows /
# 2791), FIXED fitted to those two points.
EAGER_HOST_FIXED = 0.59
REPLAY_HOST_MS = 31  # bcg-auto-lean's MIXED host median 30.2-31.0 ms: the kernels decide the wall
REPLAY_KERNEL_FACTOR = 1.028  # bcg-auto-lean's step kernels over the eager step's (+2.8% measured)
CAPTURE_S = 25  # bucket capture at chunk 2816, scaled with the chunk
DECODE_MS = 45  # a decode step (graph) with the scheduler around it: 39-41 ms measured
STEP_OVERHEAD_MS = 25  # the scheduler's own time a step outside the forward (the replay visit)
VISIT_FIXED_S = 10  # process start, imports, the counters' last line, shutdown


def cell_name(prefill: int, context: str) -> str:
    return f"{prefill}x{context}"


def parse_cell(name: str) -> tuple[int, str]:
    prefill, _, context = name.partition("x")
    if not prefill.isdigit() or int(prefill) not in PREFILL or context not in CONTEXTS:
        cells = [cell_name(p, c) for p in PREFILL for c in CONTEXTS]
        raise ValueError(f"unknown cell {name!r}; cells: {', '.join(cells)}")
    return int(prefill), context


def chunk_of(prefill: int) -> int:
    """The chunked prefill per rank whose steady MIXED step prefills ``prefill`` tokens next to up
    to ``RUNNING`` decode rows (SGLang takes the decode rows off the chunk first, then page-floors
    a new request's chunk)."""
    return prefill + RUNNING


def prefill_of(chunk: int) -> int:
    return (chunk - RUNNING) // PAGE * PAGE


@dataclass(frozen=True)
class VisitCost:
    mixed_steps: int
    profile_step: int  # the MIXED ordinal to profile
    eager_s: float
    replay_s: float


def visit_cost(prefill: int, context: str) -> VisitCost:
    """A visit's predicted seconds per arm, step by step over the burst as SGLang schedules it.
    The kernels scale with the step's rows; the eager host partly (``EAGER_HOST_FIXED``)."""
    from adaptive_steps import served_steps

    wl = CONTEXTS[context]
    chunk = chunk_of(prefill)
    steps = served_steps(REQUESTS, wl["input_len"], OUTPUT_LEN, wl["shared_prefix"], chunk=chunk)
    c = COSTS[context]
    kernels = [c["kernel_ms"] * s.rows / STEADY_ROWS for s in steps]
    decode_steps = OUTPUT_LEN - 1
    around = (len(steps) + decode_steps) * STEP_OVERHEAD_MS + decode_steps * DECODE_MS
    hosts = [
        c["eager_host_ms"] * (EAGER_HOST_FIXED + (1 - EAGER_HOST_FIXED) * s.rows / STEADY_ROWS)
        for s in steps
    ]
    eager_ms = sum(max(h, k) for h, k in zip(hosts, kernels, strict=True))
    eager_ms += EXPORT_S["eager"] * 1e3
    replay_ms = sum(max(REPLAY_HOST_MS, k * REPLAY_KERNEL_FACTOR) for k in kernels)
    replay_ms += EXPORT_S["replay"] * 1e3
    capture = CAPTURE_S * chunk / chunk_of(2560)
    return VisitCost(
        mixed_steps=len(steps),
        profile_step=math.ceil(PROFILED_AT * len(steps)),
        eager_s=round(c["start_s"] + VISIT_FIXED_S + (eager_ms + around) / 1e3, 1),
        replay_s=round(c["start_s"] + capture + VISIT_FIXED_S + (replay_ms + around) / 1e3, 1),
    )


def _repeat(arms: tuple[str, ...], cost: VisitCost, budget_s: float) -> list[str]:
    """``arms`` in turn, as many visits as the predictions fit in ``budget_s``."""
    order, used = [], 0.0
    for arm in itertools.cycle(arms):
        need = cost.eager_s if arm == EAGER else cost.replay_s
        if used + need > budget_s:
            return order
        order.append(arm)
        used += need


def calls(cost: VisitCost, budget_s: float = BUDGET_S) -> list[list[str]]:
    """The device calls of one cell: one, the arms alternating (eager first) as many visits as
    fit; where one visit of each does not fit, two, each arm's visits in a call of its own."""
    one = _repeat((EAGER, REPLAY), cost, budget_s)
    if set(one) == {EAGER, REPLAY}:
        return [one]
    two = [_repeat((EAGER,), cost, budget_s), _repeat((REPLAY,), cost, budget_s)]
    if not all(two):
        raise ValueError(f"a visit does not fit {budget_s} s: {cost}")
    return two


def probe_args(cell: str, call: int = 1) -> list[str]:
    """run_slice_probe.py's arguments for one device call of a cell (1-based)."""
    prefill, context = parse_cell(cell)
    cost = visit_cost(prefill, context)
    planned = calls(cost)
    if not 1 <= call <= len(planned):
        raise ValueError(f"{cell} has {len(planned)} call(s), not a call {call}")
    wl = CONTEXTS[context]
    args = [*planned[call - 1], *PROBE_FLAGS, "--requests", str(REQUESTS)]
    args += ["--output-len", str(OUTPUT_LEN), "--input-len", str(wl["input_len"])]
    args += ["--context-length", str(wl["context_length"])]
    if wl["shared_prefix"]:
        args += ["--shared-prefix", str(wl["shared_prefix"])]
    args += ["--chunk", str(chunk_of(prefill)), "--profile-mixed", str(cost.profile_step)]
    return args + ["--budget-s", str(BUDGET_S)]


def plan_lines() -> list[str]:
    lines = [
        "cell | chunk | MIXED steps | profiled step | eager visit s | replayed visit s | "
        "visits (calls apart by /)",
        "---|---:|---:|---:|---:|---:|---",
    ]
    for prefill, context in itertools.product(PREFILL, CONTEXTS):
        cost = visit_cost(prefill, context)
        lines.append(
            f"{cell_name(prefill, context)} | {chunk_of(prefill)} | {cost.mixed_steps} | "
            f"{cost.profile_step} | {cost.eager_s} | {cost.replay_s} | "
            f"{' / '.join(' '.join(c) for c in calls(cost))}"
        )
    return lines


# ---- reading the probe's reports ----------------------------------------------------------


def load_report(path: str | Path) -> dict:
    """A probe report: the file, or ``rank_slice_probe.json[.xz]`` in the folder given; the card
    from the report or else its probe log's first line."""
    p = Path(path)
    if p.is_dir():
        found = [p / n for n in ("rank_slice_probe.json", "rank_slice_probe.json.xz")]
        p = next((f for f in found if f.exists()), found[0])
    report = json.load(lzma.open(p) if p.suffix == ".xz" else open(p))
    if "device" not in report:
        log = p.parent / "rank_slice_probe.log"
        first = log.read_text().splitlines()[:1] if log.exists() else []
        report["device"] = first[0].split(" on ", 1)[1] if first and " on " in first[0] else None
    report["source"] = str(p)
    return report


def report_chunk(report: dict) -> int:
    """The report's chunk per rank; reports before ``--chunk`` ran at 2816 (their Engine's)."""
    if "chunk" in report:
        return report["chunk"]
    return next(iter(report["arms"].values()))["engine"]["chunked_prefill_size"]


def context_of(workload: dict) -> str:
    return f"{round(workload['input_len'] / 1024)}k"


def _mixed(entry: dict) -> tuple[dict | None, int, int]:
    """(the visit's MIXED summary of its main mode, graph steps, eager steps)."""
    steps = entry["steps"]
    graph = steps.get("MIXED/graph", {}).get("wall_ms", {}).get("n", 0)
    eager = steps.get("MIXED/eager", {}).get("wall_ms", {}).get("n", 0)
    main = "MIXED/graph" if graph > eager else "MIXED/eager"
    return steps.get(main), graph, eager


def _kernel_ms(entry: dict) -> tuple[float | None, float | None, dict | None]:
    """The profiled MIXED step's kernels (its class table's total, summed), the GPU's busy time
    (overlap counted once; None in reports written before the class table had it) and shape;
    medians where several were profiled."""
    ms, busy, shape = [], [], None
    for p in entry.get("profiles", []):
        classes = p.get("classes")
        if (
            p["step"].get("mode") == "MIXED"
            and isinstance(classes, dict)
            and "kernel_ms" in classes
        ):
            ms.append(classes["kernel_ms"])
            busy.append(classes.get("busy_ms"))
            shape = {k: p["step"].get(k) for k in ("rows", "n_dec", "prefill_tokens")}
    busy_ms = round(statistics.median(busy), 2) if busy and None not in busy else None
    return (round(statistics.median(ms), 2) if ms else None), busy_ms, shape


def visit_row(key: str, entry: dict) -> dict:
    mixed, graph, eager = _mixed(entry)
    kernel_ms, busy_ms, shape = _kernel_ms(entry)
    return {
        "visit": key,
        "arm": key.split("#")[0],
        "ok": entry["ok"],
        "mixed_steps": graph + eager,
        "replayed_share": round(graph / (graph + eager), 3) if graph + eager else None,
        "host_ms": mixed["host_ms"]["median"] if mixed else None,
        "wall_ms": mixed["wall_ms"]["median"] if mixed else None,
        "kernel_ms": kernel_ms,
        "busy_ms": busy_ms,
        "profiled": shape,
    }


def _tokens_agree(reports: list[dict]) -> bool | None:
    outs = [e["outputs"] for r in reports for e in r["arms"].values() if e["ok"]]
    return all(o == outs[0] for o in outs) if len(outs) > 1 else None


def _arm_summary(rows: list[dict]) -> dict:
    walls = [r["wall_ms"] for r in rows]
    kernels = [r["kernel_ms"] for r in rows if r["kernel_ms"] is not None]
    busy = [r["busy_ms"] for r in rows if r["busy_ms"] is not None]
    return {
        "visits": len(rows),
        "wall_ms": round(statistics.median(walls), 2),
        "wall_spread_ms": round(max(walls) - min(walls), 2),
        "host_ms": round(statistics.median(r["host_ms"] for r in rows), 2),
        "kernel_ms": round(statistics.median(kernels), 2) if kernels else None,
        "busy_ms": round(statistics.median(busy), 2) if busy else None,
        "replayed_share": min(r["replayed_share"] for r in rows),
    }


def cell_row(reports: list[dict], eager_arm: str = EAGER, replay_arm: str = REPLAY) -> dict:
    """One cell's row of the map from every report of that cell (visits of finished arms only;
    a visit cut at the call's deadline is listed under ``unfinished``). No gain where a replay
    visit replayed no MIXED step (its graph refused): that would compare eager with eager."""
    first = reports[0]
    chunk = report_chunk(first)
    visits_ = [visit_row(k, e) for r in reports for k, e in r["arms"].items()]
    done = [v for v in visits_ if v["ok"] and v["wall_ms"] is not None]
    eager = [v for v in done if v["arm"] == eager_arm]
    replay = [v for v in done if v["arm"] == replay_arm]
    row = {
        "cell": cell_name(prefill_of(chunk), context_of(first["workload"])),
        "context": context_of(first["workload"]),
        "prefill_chunk": prefill_of(chunk),
        "chunk": chunk,
        "workload": first["workload"],
        "cards": sorted({r.get("device") or "unknown" for r in reports}),
        "sources": [r.get("source") for r in reports],
        "eager": _arm_summary(eager) if eager else None,
        "replayed": _arm_summary(replay) if replay else None,
        "visits": visits_,
        "unfinished": [v["visit"] for v in visits_ if v not in done],
        "tokens_equal": _tokens_agree(reports),
    }
    e, r = row["eager"], row["replayed"]
    row["host_kernel_ratio"] = (
        round(e["host_ms"] / e["kernel_ms"], 3) if e and e["kernel_ms"] else None
    )
    if e and r and r["replayed_share"]:
        pairs = [a["wall_ms"] / b["wall_ms"] for a in eager for b in replay]
        row["gain"] = round(e["wall_ms"] / r["wall_ms"], 3)
        row["gain_range"] = [round(min(pairs), 3), round(max(pairs), 3)]
        # the gain counts only where it is larger than two eager visits of the same cell differ
        row["gain_beyond_spread"] = e["wall_ms"] - r["wall_ms"] > e["wall_spread_ms"]
    else:
        row["gain"] = row["gain_range"] = row["gain_beyond_spread"] = None
    return row


def regime_rows(reports: list[dict], **arms) -> list[dict]:
    """One row per (chunk, context) cell, reports of one cell merged (a cell may span calls)."""
    by: dict[tuple, list[dict]] = {}
    for r in reports:
        by.setdefault((report_chunk(r), context_of(r["workload"])), []).append(r)
    rows = [cell_row(rs, **arms) for rs in by.values()]
    return sorted(rows, key=lambda r: (r["context"], r["prefill_chunk"]))


def _fmt(v, digits=1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(rows: list[dict]) -> list[str]:
    lines = [
        "cell | eager wall ms (visits, spread) | replayed wall ms (visits, spread) | replayed "
        "share | gain (range) | eager host / kernels ms | host/kernel | tokens equal | card",
        "---|---:|---:|---:|---|---:|---:|---|---",
    ]
    for row in rows:
        e, r = row["eager"] or {}, row["replayed"] or {}
        gain = (
            "-"
            if row["gain"] is None
            else f"{row['gain']:.3f}x ({row['gain_range'][0]:.3f}-{row['gain_range'][1]:.3f})"
        )
        lines.append(
            f"{row['cell']} | {_fmt(e.get('wall_ms'))} ({e.get('visits', 0)}, "
            f"{_fmt(e.get('wall_spread_ms'))}) | {_fmt(r.get('wall_ms'))} ({r.get('visits', 0)}, "
            f"{_fmt(r.get('wall_spread_ms'))}) | {_fmt(r.get('replayed_share'), 3)} | {gain} | "
            f"{_fmt(e.get('host_ms'))} / {_fmt(e.get('kernel_ms'))} | "
            f"{_fmt(row['host_kernel_ratio'], 3)} | {row['tokens_equal']} | "
            f"{', '.join(row['cards'])}"
        )
    return lines


# The upstream PR's 8 x B300 point (DeepSeek-V4-Pro, mixed steady state; an anchor, not our
# measurement): eager launch host 171 ms a step, TPOT 177.2 ms eager and 172.5 ms replayed. Its
# kernels were not reported: taken as the replayed TPOT (a replay's host hides under its kernels).
SEED_POINT = {
    "label": "8 x B300, upstream PR (kernels taken as the replayed TPOT)",
    "host_kernel_ratio": round(171 / 172.5, 3),
    "gain": round(177.2 / 172.5, 3),
}


def svg_plot(rows: list[dict], seed: dict = SEED_POINT) -> str:
    """The map as an SVG: each cell's gain over its eager step's host / kernel ratio, the seed's
    point beside them, the ceiling a replay with no GPU time of its own reaches (gain =
    max(1, host / kernel)) and the issue's 1.2x line."""
    points = [r for r in rows if r["gain"] is not None and r["host_kernel_ratio"] is not None]
    x_max = max([3.0, seed["host_kernel_ratio"], *(r["host_kernel_ratio"] for r in points)])
    y_max = max([3.0, seed["gain"], *(r["gain"] for r in points)])
    w, h, m = 640, 420, 60

    def xy(x: float, y: float) -> tuple[float, float]:
        return m + (w - 2 * m) * x / x_max, h - m - (h - 2 * m) * (y - 0.8) / (y_max - 0.8)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-size="11">',
        f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
        f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
        f'<text x="{w / 2}" y="{h - 20}" text-anchor="middle">eager MIXED host / kernels</text>',
        f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">'
        "gain (eager wall / replayed wall)</text>",
    ]
    for i in range(int(x_max / 0.5) + 1):  # ticks every 0.5 on both axes
        x, _ = xy(i * 0.5, 0.8)
        out.append(f'<text x="{x:.1f}" y="{h - m + 16}" text-anchor="middle">{i * 0.5:.1f}</text>')
    for i in range(int((y_max - 0.8) / 0.2) + 1):
        _, y = xy(0, 0.8 + i * 0.2)
        out.append(
            f'<text x="{m - 6}" y="{y + 4:.1f}" text-anchor="end">{0.8 + i * 0.2:.1f}</text>'
        )
    ceiling = [xy(x / 10, max(1.0, x / 10)) for x in range(int(x_max * 10) + 1)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in ceiling)
    out.append(f'<polyline points="{path}" fill="none" stroke="gray" stroke-dasharray="4 3"/>')
    for level in (1.0, 1.2):
        (x0, y), (x1, _) = xy(0, level), xy(x_max, level)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#bbb"/>')
        out.append(f'<text x="{x1 + 4}" y="{y + 4:.1f}">{level:.1f}x</text>')
    for r in points:
        x, y = xy(r["host_kernel_ratio"], r["gain"])
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="black"/>')
        out.append(f'<text x="{x + 6:.1f}" y="{y - 6:.1f}">{r["cell"]} {r["gain"]:.3f}x</text>')
    x, y = xy(seed["host_kernel_ratio"], seed["gain"])
    out.append(
        f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="none" stroke="black"/>'
    )
    out.append(f'<text x="{x + 6:.1f}" y="{y + 14:.1f}">{seed["label"]}</text>')
    return "\n".join([*out, "</svg>", ""])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("plan", help="every cell's predicted visits and its device command")
    one = sub.add_parser("args", help="one cell's run_slice_probe.py arguments")
    one.add_argument("cell")
    one.add_argument("call", nargs="?", type=int, default=1, help="the cell's call (1-based)")
    rd = sub.add_parser("read", help="the map's rows from probe reports")
    rd.add_argument("reports", nargs="+", help="rank_slice_probe.json[.xz] files or folders")
    rd.add_argument("--json", help="write the rows here (docs/results/regime_map.json)")
    rd.add_argument("--svg", help="draw the map here (docs/results/regime_map.svg)")
    rd.add_argument("--eager", default=EAGER)
    rd.add_argument("--replay", default=REPLAY)
    args = ap.parse_args(argv)
    if args.cmd == "plan":
        print("\n".join(plan_lines()))
        print("\nOne device call a cell (TileLang and the plugin's egg-info carried):")
        for prefill, context in itertools.product(PREFILL, CONTEXTS):
            cell = cell_name(prefill, context)
            for k in range(len(calls(visit_cost(prefill, context)))):
                print(f"  bash tools/gpu-upstream/device.sh bash {SH} {cell} {k + 1}")
        return 0
    if args.cmd == "args":
        try:
            print(" ".join(probe_args(args.cell, args.call)))
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        return 0
    rows = regime_rows(
        [load_report(p) for p in args.reports], eager_arm=args.eager, replay_arm=args.replay
    )
    print("\n".join(table(rows)))
    if args.json:
        what = (
            "eager (upstream) against replayed (bcg-auto-lean) MIXED steps per chunk and context, "
            "FP8 slice; gain = eager wall median / replayed wall median (medians over visits)"
        )
        body = {"what": what, "rows": rows, "seed_point": SEED_POINT}
        Path(args.json).write_text(json.dumps(body, indent=1) + "\n")
    if args.svg:
        Path(args.svg).write_text(svg_plot(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
