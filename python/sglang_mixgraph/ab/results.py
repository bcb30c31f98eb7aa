"""From a run directory's raw outputs to the numbers of the report and the verdict.

`run.json` holds the configuration the run was started with (after command-line overrides);
the plan is rebuilt from it, and every planned cell is read back from its `.cell.json` record
and its raw output: the JSON line `sglang.benchmark.serving` wrote, or the metrics dict of
SGLang's GSM8K eval. Nothing is taken from memory of the run itself, so `ab report RUN_DIR`
and the end of `ab run` produce the same results. Output tok/s per GPU divides
`output_throughput` by the arm's GPU count: `gpus` of the arm or of `[server]`, else the
server's own `tp_size` x `pp_size` from the `server_info` bench_serving recorded.
With `[slo]`, bench_serving's own goodput (`request_goodput`, req/s of requests that met every
SLO, and `slo_attainment`, their fraction) is taken from its result line like any other metric.
The verdict is PASS, FAIL (a failed cell, an arm below its GSM8K threshold, a ratio gate
outside its bounds) or INCOMPLETE (nothing failed, but cells are not measured yet: an
interrupted run, resumed by running it again). Thresholds and gates are judged on the 95%
interval (`judge`, docs/ab.md "Gates"): by default one fails only when the whole interval is
beyond its bound, i.e. when the data show the regression (`judge_bounds`).
Besides bench_serving's own fields (latencies at p50, p90, p95 and p99, `request_throughput`,
input and total tok/s, the MTP `accept_length`, `max_concurrent_requests`), each cell has
the mean input and output lengths it actually sent (its token totals / `completed`), tok/s
per user is 1000 / median TPOT (the decode speed one request sees); `pareto` marks the load
points no other point beats on both output tok/s per GPU and tok/s per user, per arm and over
all arms (`frontier`); each candidate's GSM8K score minus the baseline's comes with Newcombe's
interval (stats.score_difference), besides each arm against the threshold. The greedy token
check (`[tokens]`) compares every visit's output ids with the first listed arm's first visit
and each arm's visits with its own first (`tokens`); it informs, it judges nothing.
`results.csv` has one row per arm and load point: every metric's mean and interval, each
candidate's ratio to the baseline with its interval, and the point's two frontier marks. A ratio pairs repeat r of two arms, which
must have run on one machine (a run directory whose pair crosses machines is refused); pairs
are pooled per block and over blocks (stats.paired_ratio), and `pairs` adds ratios between
two candidates.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab import files, runner, versions
from sglang_mixgraph.ab.config import CONCURRENCY, Config, Gate, Point, parse_config
from sglang_mixgraph.ab.server_steps import visit_steps
from sglang_mixgraph.ab.stats import (
    Estimate,
    RatioEstimate,
    estimate,
    paired_ratio,
    score_difference,
    wilson,
)

RUN_FILE = "run.json"
# The version of results.json's layout; raised when a key changes meaning or type or goes away.
SCHEMA_VERSION = 1
# (key in the results, bench_serving result key, column title); the order of the report.
METRICS = (
    ("output_throughput_per_gpu", None, "output tok/s/GPU"),
    # 1000 / median TPOT: the decode speed one request sees (the Pareto frontier's x axis).
    ("output_tok_per_s_per_user", None, "tok/s/user"),
    ("request_throughput", "request_throughput", "req/s"),
    # The server's mean accepted tokens per speculative (MTP) step, which bench_serving reads
    # from /server_info after the cell; absent (None there) without speculative decoding.
    ("accept_length", "accept_length", "accept length"),
    *(
        (f"{p}_{key}", f"{p}_{key}", f"{name} {title} ms")
        for key, name in (
            ("tpot_ms", "TPOT"),
            ("ttft_ms", "TTFT"),
            ("itl_ms", "ITL"),
            ("e2e_latency_ms", "E2E"),
        )
        for p, title in (("median", "p50"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99"))
    ),
    ("output_throughput", "output_throughput", "output tok/s"),
    ("input_throughput", "input_throughput", "input tok/s"),
    ("total_throughput", "total_throughput", "total tok/s"),
    # The most requests in flight in any second of the cell (bench_serving's own count).
    ("max_concurrent_requests", "max_concurrent_requests", "peak concurrent requests"),
    # What was sent, per completed request: bench_serving's token totals / `completed` (a
    # turn of a multi-turn conversation counts; it has no input total for those).
    ("mean_input_len_sent", None, "input len sent"),
    ("mean_output_len_sent", None, "output len sent"),
    # Present only when the run has SLOs: bench_serving writes them with --goodput.
    ("request_goodput", "request_goodput", "goodput req/s"),
    ("slo_attainment", "slo_attainment", "within SLO"),
)
PASS, FAIL, INCOMPLETE = "PASS", "FAIL", "INCOMPLETE"
NOT_MEASURED = "not measured yet"


class RunDirError(ValueError):
    """The directory is not a run directory this tool wrote."""


def write_run_file(run_dir: Path, raw_config: dict[str, Any], accuracy_only: bool) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    files.write_text(
        run_dir / RUN_FILE,
        json.dumps({"config": raw_config, "accuracy_only": accuracy_only}, indent=2) + "\n",
    )


def load_run(run_dir: Path) -> tuple[Config, bool]:
    try:
        data = json.loads((run_dir / RUN_FILE).read_text())
    except OSError:
        raise RunDirError(f"{run_dir}: no {RUN_FILE}; not a run directory of `ab run`") from None
    except ValueError as e:
        raise RunDirError(f"{run_dir / RUN_FILE}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise RunDirError(f"{run_dir / RUN_FILE}: no configuration in it")
    accuracy_only = bool(data.get("accuracy_only", False))
    return parse_config(data["config"], accuracy_only=accuracy_only), accuracy_only


@dataclass
class Results:
    config: Config
    accuracy_only: bool
    cells: list[dict[str, Any]] = field(default_factory=list)
    # summary[arm][point][metric] and ratios[candidate][point][metric]
    summary: dict[str, dict[Point, dict[str, Estimate]]] = field(default_factory=dict)
    ratios: dict[str, dict[Point, dict[str, RatioEstimate]]] = field(default_factory=dict)
    # pair_ratios["candidate/baseline"][point][metric]: the configuration's extra `pairs`.
    pair_ratios: dict[str, dict[Point, dict[str, RatioEstimate]]] = field(default_factory=dict)
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)
    gsm8k: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each candidate's GSM8K score minus the baseline's, with its interval (stats.score_difference).
    gsm8k_differences: list[dict[str, Any]] = field(default_factory=list)
    # The greedy token check's comparisons (`_greedy_tokens`); empty when `[tokens]` is off.
    tokens: dict[str, Any] = field(default_factory=dict)
    # pareto[shape]: every arm's load points, per user against per GPU, and which are on the
    # arm's frontier and on the frontier of all arms together (`pareto_points`).
    pareto: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gates: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # cells not measured (yet)
    # within_slo[arm][shape]: the highest concurrency whose mean SLO attainment reached
    # [slo] attainment (None: none did), with SLOs only.
    within_slo: dict[str, dict[str, int | None]] = field(default_factory=dict)
    # Distinct versions of the measured cells (versions.describe line -> cells), and the SGLang
    # version each arm's server reported in /server_info (bench_serving records it).
    versions: dict[str, int] = field(default_factory=dict)
    server_versions: dict[str, list[str]] = field(default_factory=dict)
    # server_steps: one row per launched visit's server log (ab.server_steps.visit_steps).
    server_steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def baseline(self) -> str:
        return self.config.arms[0].name

    @property
    def status(self) -> str:
        if self.problems:
            return FAIL
        return INCOMPLETE if self.missing else PASS

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def point_key(self, point: Point) -> str:
        return point_key(self.config, point)


def point_key(config: Config, point: Point) -> str:
    """A load point as results.json and results.csv name it: `64`, `rate=2.5`, `SHAPE/64`."""
    load = str(int(point.value)) if point.kind == CONCURRENCY else f"rate={point.value:g}"
    return f"{point.shape}/{load}" if len(config.sweep.shapes) > 1 else load


def _gpus(config: Config, arm_name: str, raw: dict[str, Any]) -> tuple[int | None, str]:
    arm = config.arm(arm_name)
    if arm.gpus is not None:
        return arm.gpus, "arm gpus"
    if config.server.gpus is not None:
        return config.server.gpus, "[server] gpus"
    info = raw.get("server_info") or {}
    if isinstance(info.get("tp_size"), int):
        return info["tp_size"] * int(info.get("pp_size") or 1), "server_info tp_size x pp_size"
    return None, "unknown: set [server] gpus"


def collect(run_dir: Path) -> Results:
    config, accuracy_only = load_run(run_dir)
    results = Results(config=config, accuracy_only=accuracy_only)
    values: dict[str, dict[Point, dict[str, dict[int, float]]]] = {}
    token_outputs: dict[tuple[str, int], dict[str, Any]] = {}  # (arm, repeat) -> raw output
    for visit in runner.plan(config, accuracy_only=accuracy_only):
        for cell in visit.cells:
            record = runner.read_record(run_dir, cell) or {}
            status = record.get("status", "missing")
            entry: dict[str, Any] = {
                "kind": cell.kind,
                "arm": cell.arm,
                "concurrency": cell.concurrency,
                "repeat": cell.repeat,
                **_point_fields(config, cell.point),
                "key": cell.key,
                "status": status,
                "raw": str(runner.raw_path(run_dir, cell).relative_to(run_dir)),
            }
            if status == runner.OK:
                raw = _read_raw(run_dir, cell)
                if (damage := runner.raw_problem(run_dir, cell)) is not None:
                    status = entry["status"] = "damaged"  # measured again by the next run
                    record = {**record, "error": damage}
            if status == runner.OK:
                entry["machine"] = record.get("machine")
                entry["block"] = config.sweep.block_of(cell.repeat)
                entry["versions"] = record.get("versions")
                line = versions.describe(record.get("versions"))
                results.versions[line] = results.versions.get(line, 0) + 1
            if status != runner.OK:
                entry["error"] = record.get("error", "not run")
                line = f"{cell.label()}: {status}: {entry['error']}"
                (results.missing if status in ("missing", "damaged") else results.problems).append(
                    line
                )
                results.cells.append(entry)
                continue
            if cell.kind == "gsm8k":
                entry["score"] = float(raw["score"])
                n = int(cell.settings["num_examples"])
                low, high = wilson(min(1.0, max(0.0, entry["score"])), n)
                results.gsm8k[cell.arm] = {
                    "score": entry["score"],
                    "n": n,
                    "low": low,
                    "high": high,
                    "interval": "95% Wilson score interval over n questions",
                    "raw": entry["raw"],
                }
            elif cell.kind == "tokens":
                entry["prompts"] = len(raw["output_ids"])
                token_outputs[(cell.arm, cell.repeat)] = raw
            else:
                server_version = (raw.get("server_info") or {}).get("version")
                if server_version is not None:
                    seen = results.server_versions.setdefault(cell.arm, [])
                    if str(server_version) not in seen:
                        seen.append(str(server_version))
                gpus, source = _gpus(config, cell.arm, raw)
                results.gpus[cell.arm] = {"gpus": gpus, "source": source}
                metrics = {
                    key: raw[src]
                    for key, src, _ in METRICS
                    if src is not None and _number(raw.get(src)) is not None
                }
                if gpus is not None:
                    metrics["output_throughput_per_gpu"] = raw["output_throughput"] / gpus
                if (raw.get("median_tpot_ms") or 0) > 0:
                    metrics["output_tok_per_s_per_user"] = 1000.0 / raw["median_tpot_ms"]
                metrics.update(lengths_sent(raw))
                entry["metrics"] = metrics
                per_metric = values.setdefault(cell.arm, {}).setdefault(cell.point, {})
                for name, value in metrics.items():
                    per_metric.setdefault(name, {})[cell.repeat] = float(value)
            results.cells.append(entry)
    for arm, by_point in values.items():
        for point, by_metric in by_point.items():
            results.summary.setdefault(arm, {})[point] = {
                name: est
                for name, reps in by_metric.items()
                if (est := estimate([reps[r] for r in sorted(reps)])) is not None
            }

    def fill(candidate: str, baseline: str, into: dict[Point, dict[str, RatioEstimate]]) -> None:
        for point, by_metric in values.get(candidate, {}).items():
            for name in by_metric:
                est = pair_ratio(results, candidate, baseline, point, name)
                if est is not None:
                    into.setdefault(point, {})[name] = est

    for arm in config.arms[1:]:
        fill(arm.name, results.baseline, results.ratios.setdefault(arm.name, {}))
    for candidate, baseline in config.ratio_pairs:
        fill(candidate, baseline, results.pair_ratios.setdefault(f"{candidate}/{baseline}", {}))
    if config.slo.limits:
        _within_slo(results)
    _gsm8k_differences(results)
    if config.tokens.enabled and not accuracy_only:
        _greedy_tokens(results, token_outputs)
    _pareto(results)
    _verdict(results)
    results.server_steps = visit_steps(run_dir, [a.name for a in config.arms])
    return results


def _number(value: Any) -> float | None:
    """A result value as a number; None for a missing one (bench_serving writes null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def lengths_sent(raw: dict[str, Any]) -> dict[str, float]:
    """The mean input and output tokens per completed request, from bench_serving's totals: what
    a cell sent, which a dataset may make differ from the lengths asked for. Multi-turn cells
    have no input total (bench_serving writes 0): no input length, rather than a wrong one."""
    completed = _number(raw.get("completed")) or 0
    if completed <= 0:
        return {}
    sent = {}
    total_in, total_out = (
        _number(raw.get("total_input_tokens")),
        _number(raw.get("total_output_tokens")),
    )
    if total_in:
        sent["mean_input_len_sent"] = total_in / completed
    if total_out is not None:
        sent["mean_output_len_sent"] = total_out / completed
    return sent


def _gsm8k_differences(results: Results) -> None:
    base = results.gsm8k.get(results.baseline)
    for arm in results.config.arms[1:]:
        cand = results.gsm8k.get(arm.name)
        if base is None or cand is None:
            continue
        diff, low, high = score_difference(cand["score"], cand["n"], base["score"], base["n"])
        results.gsm8k_differences.append(
            {
                "candidate": arm.name,
                "baseline": results.baseline,
                "difference": diff,
                "low": low,
                "high": high,
                "interval": "95% Newcombe hybrid score interval of the difference of two "
                "accuracies (from the two Wilson intervals)",
            }
        )


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first output index where two prompts' ids differ (None: they are equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # a shorter one differs after it
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Prompts whose output ids equal the reference's, and where the others first differ."""
    total = len(reference["output_ids"])
    if other.get("prompt_digest") != reference.get("prompt_digest"):
        # Another vocabulary (an attached server of another model): nothing to compare.
        return {"equal": None, "total": total, "other_prompts": True, "differing": []}
    differing = [
        {"prompt": i, "first_index": at}
        for i, (a, b) in enumerate(zip(reference["output_ids"], other["output_ids"], strict=True))
        if (at := first_difference(a, b)) is not None
    ]
    return {"equal": total - len(differing), "total": total, "differing": differing}


def _greedy_tokens(results: Results, outputs: dict[tuple[str, int], dict[str, Any]]) -> None:
    """Every visit against the reference (the first listed arm's first visit), and each arm's
    visits against its own first: a difference there is the server's own nondeterminism."""
    t = results.config.tokens
    listed = [a.name for a in results.config.arms if not t.arms or a.name in t.arms]
    reference = outputs.get((listed[0], 0))
    visits, within = [], {}
    for arm in listed:
        repeats = sorted(r for a, r in outputs if a == arm)
        for repeat in repeats:
            row = {"arm": arm, "visit": repeat + 1}
            if reference is not None:
                row.update(compare_outputs(reference, outputs[(arm, repeat)]))
            visits.append(row)
        if repeats:
            first = outputs[(arm, repeats[0])]
            against_first = [
                {"visit": r + 1, **compare_outputs(first, outputs[(arm, r)])} for r in repeats[1:]
            ]
            within[arm] = {
                "visits": len(repeats),
                "first_visit": repeats[0] + 1,
                "differing_visits": [v for v in against_first if v["equal"] != v["total"]],
            }
    results.tokens = {
        "reference": {"arm": listed[0], "visit": 1, "measured": reference is not None},
        "prompts": t.prompts,
        "output_len": t.output_len,
        "visits": visits,
        "within_arm": within,
        "visits_of_an_arm_agree": not any(w["differing_visits"] for w in within.values()),
    }


PER_USER, PER_GPU = "output_tok_per_s_per_user", "output_throughput_per_gpu"


def frontier(points: list[tuple[float, float]]) -> list[bool]:
    """Which (x, y) points no other point dominates (at least as much of both, more of one)."""
    return [
        not any(
            ox >= x and oy >= y and (ox > x or oy > y)
            for j, (ox, oy) in enumerate(points)
            if j != i
        )
        for i, (x, y) in enumerate(points)
    ]


def _pareto(results: Results) -> None:
    """Per shape: each arm's load points (means over repeats) as output tok/s per GPU against
    tok/s per user, on the arm's own frontier or not, and on the joint frontier of all arms."""
    for shape in results.config.sweep.shapes:
        rows = [
            {
                "arm": arm.name,
                "point": results.point_key(point),
                PER_USER: by_m[PER_USER].mean,
                PER_GPU: by_m[PER_GPU].mean,
            }
            for arm in results.config.arms
            for point, by_m in results.summary.get(arm.name, {}).items()
            if point.shape == shape.name and PER_USER in by_m and PER_GPU in by_m
        ]
        if not rows:
            continue
        xy = [(r[PER_USER], r[PER_GPU]) for r in rows]
        for row, on in zip(rows, frontier(xy), strict=True):
            row["joint_frontier"] = on
        for arm in {r["arm"] for r in rows}:
            own = [i for i, r in enumerate(rows) if r["arm"] == arm]
            for i, on in zip(own, frontier([xy[i] for i in own]), strict=True):
                rows[i]["arm_frontier"] = on
        rows.sort(key=lambda r: (r["arm"], -r[PER_USER]))
        results.pareto[shape.name] = rows


def _point_fields(config: Config, point: Point | None) -> dict[str, Any]:
    if point is None:
        return {}
    fields: dict[str, Any] = {"point": point_key(config, point), "shape": point.shape}
    if point.kind != CONCURRENCY:
        fields["request_rate"] = point.value
    return fields


def _within_slo(results: Results) -> None:
    target = results.config.slo.attainment
    for arm in results.config.arms:
        by_point = results.summary.get(arm.name, {})
        for shape in results.config.sweep.shapes:
            met = [
                int(p.value)
                for p, by_m in by_point.items()
                if p.shape == shape.name
                and p.kind == CONCURRENCY
                and "slo_attainment" in by_m
                and by_m["slo_attainment"].mean >= target
            ]
            results.within_slo.setdefault(arm.name, {})[shape.name] = max(met, default=None)


def _read_raw(run_dir: Path, cell: runner.Cell) -> dict[str, Any] | None:
    try:
        text = runner.raw_path(run_dir, cell).read_text()
        # bench_serving appends one line per run; the runner gives each try a fresh file.
        return json.loads(text if cell.kind in runner.DOCUMENT_KINDS else text.splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def judge_bounds(
    value: float,
    low: float | None,
    high: float | None,
    *,
    judge: str,
    minimum: float | None = None,
    maximum: float | None = None,
    fmt: str = "{:.3f}",
) -> tuple[bool, str]:
    """Whether a value with its 95% interval meets `>= minimum` and `<= maximum`, and on what.

    `no_regression` (the default): fails only when the whole interval is beyond the bound, so
    a minimum is judged on the interval's upper bound and a maximum on its lower bound (the
    data show, at 97.5% one-sided, that the bound is crossed). `confirmed`: passes only when
    the interval excludes the bound on the right side (lower bound > minimum, upper bound <
    maximum): an interval that touches the bound has not shown it met. `mean`: the value
    itself. Without an interval (one repeat) `no_regression` uses the value and `confirmed`
    fails: nothing is confirmed without an interval.
    """
    checks = []
    no_interval = low is None or high is None
    strict = judge == "confirmed"
    for bound, is_min in ((minimum, True), (maximum, False)):
        if bound is None:
            continue
        if no_interval or judge == "mean":
            name, x = "value", value
        elif (judge == "no_regression") == is_min:
            name, x = "upper bound", high
        else:
            name, x = "lower bound", low
        if strict:
            # The relation as it is: a bound the interval touches reads `=`, and fails.
            sign = ">" if x > bound else "<" if x < bound else "="
            ok = sign == (">" if is_min else "<") and not no_interval
        else:
            ok = x >= bound if is_min else x <= bound
            sign = (">=" if ok else "<") if is_min else ("<=" if ok else ">")
        checks.append(
            (ok, f"{name} {fmt.format(x)} {sign} {fmt.replace('.3f', 'g').format(bound)}")
        )
    basis = "; ".join(text for _, text in checks)
    if no_interval and strict:
        basis += " (no interval: one repeat confirms nothing)"
    elif no_interval and judge != "mean":
        basis += " (no interval: one repeat)"
    return all(ok for ok, _ in checks), basis


def _verdict(results: Results) -> None:
    g = results.config.gsm8k
    if g.enabled and g.threshold is not None:
        for arm, entry in results.gsm8k.items():
            ok, basis = judge_bounds(
                entry["score"], entry["low"], entry["high"], judge=g.judge, minimum=g.threshold
            )
            entry.update(threshold=g.threshold, judge=g.judge, basis=basis, passed=ok)
            if not ok:
                results.problems.append(
                    f"GSM8K arm {arm!r}: accuracy {entry['score']:.3f} is below the "
                    f"threshold {g.threshold:g} ({basis}; 95% Wilson interval "
                    f"[{entry['low']:.3f}, {entry['high']:.3f}] over {entry['n']} questions)"
                )
    if results.accuracy_only:
        return
    for gate in results.config.gates:
        est = _gate_ratio(results, gate)
        entry: dict[str, Any] = {
            "gate": gate.describe(),
            "judge": gate.judge,
            "ratio": None if est is None else est.to_json(),
        }
        if _gate_cells_missing(results, gate):
            # Judged once every repeat of both arms is measured, not on part of them.
            entry.update(basis=NOT_MEASURED, passed=None)
            results.missing.append(f"gate {gate.describe()}: {NOT_MEASURED}")
        elif est is None:
            entry["passed"] = False
            results.problems.append(f"gate {gate.describe()}: no measurement to compare")
        else:
            ok, basis = judge_bounds(
                est.mean,
                est.low,
                est.high,
                judge=gate.judge,
                minimum=gate.min_ratio,
                maximum=gate.max_ratio,
                fmt="{:.3f}x",
            )
            entry.update(basis=basis, passed=ok)
            if not ok:
                shown = "" if est.low is None else f" [{est.low:.3f}, {est.high:.3f}]"
                results.problems.append(
                    f"gate {gate.describe()}: FAILED at {est.mean:.3f}x{shown} ({basis})"
                )
        results.gates.append(entry)


def _gate_cells(results: Results, gate: Gate) -> list[dict[str, Any]]:
    key = results.point_key(gate.point)
    return [
        c
        for c in results.cells
        if c["kind"] == "bench"
        and c["arm"] in (gate.candidate, gate.baseline)
        and c.get("point") == key
    ]


def _gate_cells_missing(results: Results, gate: Gate) -> bool:
    return any(c["status"] == "missing" for c in _gate_cells(results, gate))


def _gate_ratio(results: Results, gate: Gate) -> RatioEstimate | None:
    return pair_ratio(results, gate.candidate, gate.baseline, gate.point, gate.metric)


def pair_ratio(
    results: Results, candidate: str, baseline: str, point: Point, metric: str
) -> RatioEstimate | None:
    """`metric` of two arms (any two), paired per repeat on one machine, pooled over blocks."""
    key = results.point_key(point)
    cells: dict[str, dict[int, dict[str, Any]]] = {candidate: {}, baseline: {}}
    for c in results.cells:
        if c["kind"] == "bench" and c["arm"] in cells and c.get("point") == key:
            if metric in c.get("metrics", {}):
                cells[c["arm"]][c["repeat"]] = c
    for repeat in sorted(set(cells[candidate]) & set(cells[baseline])):
        a, b = cells[candidate][repeat].get("machine"), cells[baseline][repeat].get("machine")
        if a != b:
            raise RunDirError(
                f"{candidate} and {baseline} at {key}, repeat {repeat + 1}: measured on machines "
                f"{a or 'not recorded'} and {b or 'not recorded'}; a ratio pairs cells of one "
                "machine only (`ab run` measures such a block again whole)"
            )
    reps = {arm: {r: c["metrics"][metric] for r, c in by_r.items()} for arm, by_r in cells.items()}
    return paired_ratio(reps[candidate], reps[baseline], results.config.sweep.block_of)


def results_json(results: Results) -> dict[str, Any]:
    def table(d: dict[str, dict[Point, dict[str, Any]]]) -> dict[str, Any]:
        return {
            arm: {
                results.point_key(p): {m: e.to_json() for m, e in by_m.items()}
                for p, by_m in by_p.items()
            }
            for arm, by_p in d.items()
        }

    sw = results.config.sweep
    return {
        "schema_version": SCHEMA_VERSION,
        "baseline": results.baseline,
        "arms": [
            {"name": a.name, "env": a.env, "args": list(a.args), "url": a.url}
            for a in results.config.arms
        ],
        "dataset": sw.dataset,
        "shared_prefix": None if sw.shared_prefix is None else sw.shared_prefix.model_dump(),
        "concurrencies": list(sw.concurrencies),
        "request_rates": list(sw.request_rates),
        "shapes": [
            {
                "name": s.name,
                "input_len": s.input_len,
                "output_len": s.output_len,
                "range_ratio": s.range_ratio,
            }
            for s in sw.shapes
        ],
        "slo_ms": dict(results.config.slo.limits),
        "within_slo": results.within_slo,
        "repeats": sw.repeats,
        "accuracy_only": results.accuracy_only,
        "gpus": results.gpus,
        "versions": results.versions,
        "server_versions": results.server_versions,
        "summary": table(results.summary),
        "ratios_vs_baseline": table(results.ratios),
        "pair_ratios": table(results.pair_ratios),
        "blocks": sw.blocks,
        "block": list(sw.block),
        "pareto": results.pareto,
        "gsm8k": results.gsm8k,
        "gsm8k_differences": results.gsm8k_differences,
        # Only with [tokens] on: the results of runs without it keep their keys.
        **({"tokens": results.tokens} if results.tokens else {}),
        "gates": results.gates,
        # Only where launched visits left their server logs: other runs keep their keys.
        **({"server_steps": results.server_steps} if results.server_steps else {}),
        "cells": results.cells,
        "status": results.status,
        "passed": results.passed,
        "problems": results.problems,
        "missing": results.missing,
    }


def results_csv(results: Results) -> str:
    """One row per arm and load point: each metric's mean and 95% interval; for candidates,
    the ratio to the baseline with its interval (empty where there is none)."""
    names = [key for key, _, _ in METRICS]
    sw = results.config.sweep
    header = ["arm", "shape", "input_len", "output_len", "concurrency", "request_rate", "repeats"]
    for name in names:
        header += [name, f"{name}_low", f"{name}_high"]
    for name in names:
        header += [f"{name}_ratio", f"{name}_ratio_low", f"{name}_ratio_high"]
    header += ["arm_frontier", "joint_frontier"]
    on_frontier = {
        (shape, r["arm"], r["point"]): (r["arm_frontier"], r["joint_frontier"])
        for shape, rows in results.pareto.items()
        for r in rows
    }
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)

    def cells(est: Any) -> list[Any]:
        if est is None:
            return ["", "", ""]
        return [est.mean, "" if est.low is None else est.low, "" if est.high is None else est.high]

    for point in sw.points():
        shape = sw.shape(point.shape)
        for arm in results.config.arms:
            by_metric = results.summary.get(arm.name, {}).get(point)
            if by_metric is None:
                continue
            ratios = results.ratios.get(arm.name, {}).get(point, {})
            row: list[Any] = [
                arm.name,
                shape.name,
                shape.input_len,
                shape.output_len,
                int(point.value) if point.kind == CONCURRENCY else "",
                point.value if point.kind != CONCURRENCY else "",
                max((e.n for e in by_metric.values()), default=0),
            ]
            for name in names:
                row += cells(by_metric.get(name))
            for name in names:
                row += cells(ratios.get(name))
            row += on_frontier.get((shape.name, arm.name, results.point_key(point)), ("", ""))
            writer.writerow(row)
    return out.getvalue()
