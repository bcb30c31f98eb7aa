"""The report of a run directory: `report.md`, `results.json` and plots, rebuilt from raw outputs.

`report.md` is meant to be pasted into a pull request or an issue: the verdict (PASS, FAIL,
or INCOMPLETE while cells are still to be measured), what was compared (model, server
arguments, each arm's environment and arguments), the workload, then per shape and load point
(concurrency or request rate) each arm's output tok/s per GPU, tok/s per user, requests per
second, the MTP accept length when the server reports one, TPOT, TTFT, ITL and end-to-end
latency (p50 and p99, then p90 and p95), with SLOs its goodput and SLO attainment, and what
was sent (mean input and output tokens per request, input and total tok/s, the most requests
in flight), as mean +/- the 95% interval over repeats, with each candidate's ratio to the
baseline (the first arm): the geometric mean of the paired ratios with the exp of the t
interval of their logarithms; the Pareto frontier of output tok/s per GPU against tok/s per
user, per arm and over all arms; GSM8K per arm with its Wilson interval against the
threshold, and each candidate's score minus the baseline's with its interval; with `[tokens]`
each visit's greedy output ids against the first listed arm's first visit and against the
arm's own first visit (prompts equal, and where the others first differ); the gates with
the interval and the bound each was judged on; every failed or missing cell. `results.csv`
holds the table's numbers.
Plots need matplotlib (the `ab` extra); without it they are skipped with one line saying so,
and everything else is written. They are drawn with matplotlib's Figure API, not pyplot
(pyplot's backend selection consults IPython whenever a module of that name is loaded, which
broke a run on a GPU machine). `pareto.png` is output tok/s per GPU against tok/s per user, one
curve per arm (and shape) through its load points, the joint frontier dashed; `throughput.png` is tok/s per GPU against
concurrency with the intervals as error bars; `ratio.png` is each candidate's ratio to the
baseline (output tok/s per GPU, median TPOT) against concurrency, and against request rate
when the run has rate points, with the ratio's interval as error bars.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab import files, versions
from sglang_mixgraph.ab.config import CONCURRENCY, GOODPUT_METRICS, RATE, Point, Sweep
from sglang_mixgraph.ab.greedy_tokens import length_bounds
from sglang_mixgraph.ab.results import (
    INCOMPLETE,
    METRICS,
    NOT_MEASURED,
    PASS,
    PER_GPU,
    PER_USER,
    Results,
    collect,
    results_csv,
    results_json,
)
from sglang_mixgraph.ab.stats import Estimate, RatioEstimate

PLOTS = ("pareto.png", "throughput.png", "ratio.png")
# Percentages in the table: a fraction of requests.
FRACTIONS = ("slo_attainment",)
PLOTS_SKIPPED = "plots skipped: matplotlib is not installed (pip install 'sglang-mixgraph[ab]')"


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# A ratio interval spanning more than this factor says nothing; shown as such, not as numbers.
RATIO_SPREAD_SHOWN = 100.0


def _cell(est: Estimate | None, fraction: bool = False) -> str:
    """The mean ± its interval's half-width; every metric here is at least 0 (a fraction at
    most 1), so an interval that reaches past those bounds is shown cut to them, as [low, high]."""
    if est is None:
        return "-"
    if fraction:
        text = f"{100 * est.mean:.1f}%"
        if est.ci95 is None:
            return text
        if est.mean - est.ci95 < 0 or est.mean + est.ci95 > 1:
            low, high = max(0.0, est.mean - est.ci95), min(1.0, est.mean + est.ci95)
            return f"{text} [{100 * low:.1f}, {100 * high:.1f}]"
        return f"{text} ± {100 * est.ci95:.1f}"
    if est.ci95 is None:
        return _num(est.mean)
    if est.mean - est.ci95 < 0:
        return f"{_num(est.mean)} [0, {_num(est.mean + est.ci95)}]"
    return f"{_num(est.mean)} ± {_num(est.ci95)}"


def _ratio(est: RatioEstimate | dict | None, pairs: int | None = None) -> str:
    """The ratio and its interval; `pairs`: the repeats both arms measured, named when the
    ratio rests on fewer (a pair with a zero, e.g. no goodput left, has no log ratio)."""
    if est is None:
        return "-"
    if isinstance(est, dict):  # from results.json's gates
        mean, low, high, n = est["mean"], est["low"], est["high"], est.get("pairs", est["n"])
    else:
        mean, low, high, n = est.mean, est.low, est.high, est.pairs
    if low is None:
        text = f"{mean:.3f}x"
    elif high > low * RATIO_SPREAD_SHOWN:
        text = f"{mean:.3f}x [no bound: the {n} pairs disagree by over {RATIO_SPREAD_SHOWN:g}x]"
    else:
        text = f"{mean:.3f}x [{low:.3f}, {high:.3f}]"
    if pairs is not None and n < pairs:
        text += f" ({n} of {pairs} pairs)"
    return text


def _headlines(results: Results) -> list[str]:
    """One sentence per candidate: its output tok/s per GPU against the baseline at the
    highest load point measured (and the range over all of them), and its GSM8K difference."""
    c = results.config
    differences = {d["candidate"]: d for d in results.gsm8k_differences}
    lines = []
    for arm in c.arms[1:]:
        parts = []
        by_point = results.ratios.get(arm.name, {})
        measured = [p for p in c.sweep.points() if PER_GPU in by_point.get(p, {})]
        if measured and not results.accuracy_only:
            # the highest concurrency (else request rate) measured, of the first shape with it
            top = max(measured, key=lambda p: (p.kind == CONCURRENCY, p.value))
            shape = f" of `{top.shape}`" if len(c.sweep.shapes) > 1 else ""
            label = _point_label(top, bool(c.sweep.request_rates))
            parts.append(
                f"output tok/s per GPU {_ratio(by_point[top][PER_GPU])} the baseline's at "
                f"{'' if c.sweep.request_rates else 'concurrency '}{label}{shape}"
            )
            means = [by_point[p][PER_GPU].mean for p in measured]
            if len(means) > 1:
                parts.append(
                    f"{min(means):.3f}x to {max(means):.3f}x over its {len(means)} load points"
                )
        d = differences.get(arm.name)
        if d is not None:
            parts.append(
                f"GSM8K {100 * d['difference']:+.1f} points [{100 * d['low']:+.1f}, "
                f"{100 * d['high']:+.1f}]"
            )
        if parts:
            lines.append(f"`{arm.name}` against `{results.baseline}`: " + "; ".join(parts) + ".")
    return lines


def _env_args(env: dict[str, str], args: tuple[str, ...]) -> str:
    parts = [f"`{k}={v}`" for k, v in env.items()] + ([f"`{' '.join(args)}`"] if args else [])
    return ", ".join(parts) if parts else "(nothing added)"


def render_markdown(results: Results) -> str:
    c = results.config
    s = c.server
    lines = ["# A/B report", ""]
    if c.note:
        lines += [f"> {line}".rstrip() for line in c.note.strip().splitlines()] + [""]
    if results.status == PASS:
        lines.append("**Result: PASS**")
    elif results.status == INCOMPLETE:
        lines.append(
            f"**Result: INCOMPLETE** ({len(results.missing)} not measured yet, listed below; "
            "run the same command to resume)"
        )
    else:
        lines.append(f"**Result: FAIL** ({len(results.problems)} problems, listed below)")
    lines.append("")
    headlines = _headlines(results)
    if headlines:
        lines += headlines + [""]
    lines += ["## Setup", ""]
    if any(a.url is None for a in c.arms):
        lines.append(f"- model: `{s.model_path}`")
        lines.append(f"- server arguments (all arms): `{' '.join(s.args) or '(none)'}`")
        if s.env:
            lines.append(f"- environment (all arms): {_env_args(s.env, ())}")
    for i, arm in enumerate(c.arms):
        role = "baseline" if i == 0 else "candidate"
        where = f"attached at {arm.url}" if arm.url else "launched"
        lines.append(f"- arm `{arm.name}` ({role}, {where}): {_env_args(arm.env, arm.args)}")
    if not results.accuracy_only:
        sw = c.sweep
        lines += _load_lines(sw)
        if c.slo.limits:
            slos = ", ".join(
                f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in c.slo.limits.items()
            )
            lines.append(
                f"- SLOs (bench_serving --goodput): {slos}; goodput = requests per second that "
                "met every SLO, within SLO = their fraction of the requests sent"
            )
        if sw.block:
            lines.append(
                f"- {sw.blocks} block(s) of visits `{' '.join(sw.block)}`, each run whole on one "
                f"machine; a fresh server per visit when launched; ratios pair the visits of one "
                "block and their interval is over blocks"
            )
        else:
            lines.append(
                f"- {sw.repeats} repeats, arms interleaved per repeat (A B, then B A, ...); a "
                "fresh server per arm and repeat when launched"
            )
        if sw.warm_visit:
            lines.append(
                f"- each machine's first block after one discarded visit of `{sw.warm_visit}`"
            )
        for arm, info in results.gpus.items():
            lines.append(f"- GPUs of `{arm}`: {info['gpus'] or '?'} ({info['source']})")
        for arm, seen in results.server_versions.items():
            lines.append(f"- SGLang of `{arm}`'s server (its /server_info): {', '.join(seen)}")
        lines.append(
            "- values: mean ± half-width of the 95% t interval over repeats ([low, high] where "
            "it reaches below 0, cut there); ratios: "
            f"candidate / `{results.baseline}` paired by repeat, the geometric mean of the "
            "paired ratios [95% interval: exp of the t interval of their logarithms]; `-` "
            "where the baseline measured 0 in a pair (no ratio over zero)"
        )
    for line, count in results.versions.items():
        lines.append(f"- measured with: {line} ({count} cells)")
    lines.append("")
    if not results.accuracy_only:
        lines += _throughput_section(results)
        if c.sweep.block or c.pairs:
            lines += _blocks_section(results)
    lines += _gsm8k_section(results)
    lines += _tokens_section(results)
    lines += _server_steps_section(results)
    if results.gates:
        lines += [
            "## Gates",
            "",
            _JUDGE_NOTE,
            "",
            "| gate | ratio [95% interval] | judge | judged on | result |",
            "|---|---|---|---|---|",
        ]
        for gate in results.gates:
            verdict = {True: "pass", False: "FAIL", None: NOT_MEASURED}[gate["passed"]]
            lines.append(
                f"| {gate['gate']} | {_ratio(gate['ratio'])} | {gate['judge']} | "
                f"{gate.get('basis', 'no measurement')} | {verdict} |"
            )
        lines.append("")
    if results.problems:
        lines += ["## Problems", ""]
        lines += [f"- {p.splitlines()[0]}" for p in results.problems]
        lines.append("")
    if results.missing:
        lines += ["## Not measured yet", ""]
        lines += [f"- {p.splitlines()[0]}" for p in results.missing]
        lines.append("")
    return "\n".join(lines)


def _load_lines(sw: Sweep) -> list[str]:
    shapes = "; ".join(
        f"input {s.input_len} / output {s.output_len} tokens (range ratio {s.range_ratio:g})"
        + (f" as `{s.name}`" if len(sw.shapes) > 1 else "")
        for s in sw.shapes
    )
    if (gsp := sw.shared_prefix) is not None:
        turns = f"{gsp.num_turns} turns each" if gsp.num_turns > 1 else "one turn each"
        shapes = (
            f"{gsp.num_groups} shared system prompts of {gsp.system_prompt_len} tokens, each "
            f"with {gsp.prompts_per_group} questions of {gsp.question_len} tokens, "
            f"{turns}, output {gsp.output_len} tokens (range ratio {gsp.range_ratio:g})"
        )
    if gsp is not None:
        prompts = f"{gsp.requests} requests per cell (groups x questions per group)"
    elif sw.num_prompts is not None:
        prompts = f"{sw.num_prompts} prompts per cell"
    else:
        prompts = (
            f"max(min_prompts {sw.min_prompts}, {sw.prompts_per_concurrency} x concurrency) "
            "prompts per cell"
        )
        if sw.request_rates:
            prompts += f" (a request rate: max(min_prompts, rate x {sw.rate_duration_s:g} s))"
    if sw.warmup_requests is not None:
        warmup = f"warm-up requests: {sw.warmup_requests}"
    else:
        warmup = f"warm-up requests: {sw.warmup_per_concurrency} x concurrency"
        if sw.request_rates:
            warmup += " (a request rate: x the rate, rounded up)"
    points = []
    if sw.concurrencies:
        points.append(f"concurrencies {', '.join(map(str, sw.concurrencies))}")
    if sw.request_rates:
        points.append(
            f"request rates {', '.join(f'{r:g}' for r in sw.request_rates)} req/s "
            "(Poisson arrivals, no concurrency cap)"
        )
    return [
        f"- load: `sglang.benchmark.serving --backend {sw.backend} --dataset-name {sw.dataset}`, "
        f"{shapes}, {prompts}, {warmup}"
        + (", prefix cache flushed after the warm-up" if sw.flush_cache else ""),
        f"- load points: {'; '.join(points)}",
    ]


_JUDGE_NOTE = (
    "Judged on the 95% interval: `no_regression` (the default) fails only when the whole "
    "interval is beyond the bound (a minimum on its upper bound, a maximum on its lower "
    "bound: the data show the regression); `confirmed` passes only when the interval excludes "
    "the bound on the passing side (lower bound > a minimum, upper bound < a maximum: the data "
    "show it met; one repeat confirms nothing); `mean` compares the value itself."
)


def _point_label(point: Point, rates: bool) -> str:
    if point.kind == CONCURRENCY:
        return f"c={int(point.value)}" if rates else str(int(point.value))
    return f"{point.value:g} req/s"


# The report's tables per shape, by results key: the headline numbers (bench_serving's p50 and
# p99; the accept length only where a server reported one; goodput only with SLOs), the tail
# latencies between them, then the load as sent: the mean lengths of what went out per
# completed request, the input and total token rates and the most requests in flight.
MAIN_COLUMNS = (
    "output_throughput_per_gpu",
    "output_tok_per_s_per_user",
    "request_throughput",
    "accept_length",
    *(
        f"{p}_{m}"
        for m in ("tpot_ms", "ttft_ms", "itl_ms", "e2e_latency_ms")
        for p in ("median", "p99")
    ),
    *GOODPUT_METRICS,
)
TAIL_COLUMNS = tuple(
    f"{p}_{m}" for m in ("tpot_ms", "ttft_ms", "itl_ms", "e2e_latency_ms") for p in ("p90", "p95")
)
SENT_COLUMNS = (
    "mean_input_len_sent",
    "mean_output_len_sent",
    "input_throughput",
    "total_throughput",
    "max_concurrent_requests",
)
_TITLES = {key: title for key, _, title in METRICS}


def _measured(results: Results, key: str) -> bool:
    return any(key in by_m for by_p in results.summary.values() for by_m in by_p.values())


def _metric_table(results: Results, shape: str, keys: tuple[str, ...]) -> list[str]:
    """Rows per load point: each arm's mean ± interval, then each candidate's ratio."""
    c = results.config
    sw = c.sweep
    shown = [(key, _TITLES[key]) for key in keys]
    load = "load" if sw.request_rates else "concurrency"
    header = f"| {load} | arm | " + " | ".join(t for _, t in shown) + " | repeats |"
    lines = [header, "|" + "---|" * (len(shown) + 3)]
    for point in (p for p in sw.points() if p.shape == shape):
        label = _point_label(point, bool(sw.request_rates))
        for arm in c.arms:
            by_metric = results.summary.get(arm.name, {}).get(point, {})
            n = max((e.n for e in by_metric.values()), default=0)
            row = [label, f"`{arm.name}`"]
            row += [_cell(by_metric.get(k), k in FRACTIONS) for k, _ in shown]
            lines.append("| " + " | ".join(row) + f" | {n} |")
        base = results.summary.get(results.baseline, {}).get(point, {})
        for arm in c.arms[1:]:
            by_metric = results.ratios.get(arm.name, {}).get(point, {})
            own = results.summary.get(arm.name, {}).get(point, {})
            row = ["", f"`{arm.name}` / `{results.baseline}`"]
            row += [
                _ratio(
                    by_metric.get(k),
                    min(own[k].n, base[k].n) if k in own and k in base else None,
                )
                for k, _ in shown
            ]
            lines.append("| " + " | ".join(row) + " | |")
    lines.append("")
    return lines


def _throughput_section(results: Results) -> list[str]:
    c = results.config
    sw = c.sweep
    lines = ["## Throughput and latency", ""]
    main = tuple(
        key
        for key in MAIN_COLUMNS
        if (key not in GOODPUT_METRICS or c.slo.limits)
        and (key != "accept_length" or _measured(results, key))
    )
    for shape in sw.shapes:
        if len(sw.shapes) > 1:
            lines += [
                f"### `{shape.name}`: input {shape.input_len} / output {shape.output_len} tokens",
                "",
            ]
        lines += _metric_table(results, shape.name, main)
        lines += ["p90 and p95 latencies:", ""]
        lines += _metric_table(results, shape.name, TAIL_COLUMNS)
        lines += [
            "As sent: mean input and output tokens per completed request (bench_serving's "
            "token totals / completed requests), input and total tok/s, and the most requests "
            "in flight in any second:",
            "",
        ]
        lines += _metric_table(results, shape.name, SENT_COLUMNS)
    if c.slo.limits and sw.concurrencies:
        lines.append(
            f"Highest concurrency with at least {100 * c.slo.attainment:g}% of requests within "
            "the SLOs (mean over repeats):"
        )
        lines.append("")
        for arm in c.arms:
            for shape in sw.shapes:
                best = results.within_slo.get(arm.name, {}).get(shape.name)
                where = f" (`{shape.name}`)" if len(sw.shapes) > 1 else ""
                lines.append(f"- `{arm.name}`{where}: " + ("none" if best is None else str(best)))
        lines.append("")
    lines += _pareto_section(results)
    lines += [
        "![throughput per GPU vs per user](pareto.png)",
        "",
        "![throughput](throughput.png)",
        "",
        "![ratio to the baseline](ratio.png)",
        "",
    ]
    return lines


def _pareto_load(key: str) -> str:
    """A load point key of results.json (`64`, `rate=2.5`, `SHAPE/64`) as the tables write it."""
    load = key.split("/")[-1]
    return f"{load.removeprefix('rate=')} req/s" if load.startswith("rate=") else load


def _pareto_section(results: Results) -> list[str]:
    if not results.pareto:
        return []
    shapes = len(results.config.sweep.shapes) > 1
    lines = [
        "### Pareto frontier: output tok/s per GPU against tok/s per user",
        "",
        "tok/s per user is 1000 / median TPOT, the decode speed one request sees. A load point "
        "is on a frontier when no other point has at least as much of both and more of one "
        "(means over repeats): its arm's own points, or every arm's points together (joint).",
        "",
        ("| shape " if shapes else "")
        + "| arm | load | tok/s/user | output tok/s/GPU | arm's frontier | joint frontier |",
        "|" + "---|" * (7 if shapes else 6),
    ]
    for shape, rows in results.pareto.items():
        for r in rows:
            row = ([f"`{shape}`"] if shapes else []) + [
                f"`{r['arm']}`",
                _pareto_load(r["point"]),
                _num(r[PER_USER]),
                _num(r[PER_GPU]),
                "yes" if r["arm_frontier"] else "-",
                "yes" if r["joint_frontier"] else "-",
            ]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


BLOCK_METRICS = (("output_throughput_per_gpu", "output tok/s/GPU"), ("median_tpot_ms", "TPOT p50"))


def _blocks_section(results: Results) -> list[str]:
    """Each pair's ratio per block (with the block's machine and its host CPU, which a
    host-bound arm's speed follows) beside the pooled one."""
    c = results.config
    machines: dict[int, set[str]] = {}
    for cell in results.cells:
        if cell["kind"] == "bench" and cell["status"] == "ok":
            machine = cell.get("machine") or "not recorded"
            cpu = (cell.get("versions") or {}).get("cpu")
            if cpu is not None:
                machine += f": {versions.describe_field('cpu', cpu)}"
            machines.setdefault(cell["block"], set()).add(machine)
    blocks = sorted(machines)
    pairs = [(f"{a.name}/{results.baseline}", results.ratios.get(a.name, {})) for a in c.arms[1:]]
    pairs += list(results.pair_ratios.items())
    lines = [
        "## Ratios per block",
        "",
        "Each block's ratio is the geometric mean of its paired visits (all on the machine "
        "named); the pooled ratio's 95% interval is over blocks.",
        "",
        "| load | pair | metric | pooled [95% interval] | "
        + " | ".join(f"block {b + 1} ({', '.join(sorted(machines[b]))})" for b in blocks)
        + " |",
        "|" + "---|" * (4 + len(blocks)),
    ]
    for point in c.sweep.points():
        label = results.point_key(point)
        for name, by_point in pairs:
            for metric, title in BLOCK_METRICS:
                est = by_point.get(point, {}).get(metric)
                if est is None:
                    continue
                per = {b: f"{r:.3f}x ({n} pairs)" for b, r, n in est.blocks}
                row = [label, f"`{name}`", title, _ratio(est)] + [per.get(b, "-") for b in blocks]
                lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def _gsm8k_section(results: Results) -> list[str]:
    g = results.config.gsm8k
    if not g.enabled:
        return []
    lines = [
        "## GSM8K",
        "",
        f"SGLang's eval (`sglang.test.run_eval`, gsm8k, completion API): {g.num_examples} "
        f"questions, {g.num_shots} shots, max {g.max_tokens} tokens.",
        "",
        "| arm | accuracy [95% Wilson interval] | questions | threshold | judged on | result |",
        "|---|---|---|---|---|---|",
    ]
    for arm in results.config.arms:
        entry = results.gsm8k.get(arm.name)
        if entry is None:
            continue
        threshold = "-" if g.threshold is None else f"{g.threshold:g} ({g.judge})"
        verdict = "-" if "passed" not in entry else ("pass" if entry["passed"] else "FAIL")
        lines.append(
            f"| `{arm.name}` | {entry['score']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}] | "
            f"{entry['n']} | {threshold} | {entry.get('basis', '-')} | {verdict} |"
        )
    lines.append("")
    if results.gsm8k_differences:
        lines += [
            "Each candidate against the baseline on the same questions: the difference of the "
            "two accuracies with its 95% interval (Newcombe's, from the two Wilson intervals; "
            "it treats the arms as independent, the conservative choice for two servers "
            "answering the same questions). An interval that holds 0 shows no difference.",
            "",
            "| candidate - baseline | difference [95% interval] |",
            "|---|---|",
        ]
        for d in results.gsm8k_differences:
            lines.append(
                f"| `{d['candidate']}` - `{d['baseline']}` | {d['difference']:+.3f} "
                f"[{d['low']:+.3f}, {d['high']:+.3f}] |"
            )
        lines.append("")
    return lines


TOKENS_CAVEAT = (
    "the server itself is not deterministic under this batching; differences between arms "
    "mean nothing beyond that"
)


def _where_they_differ(differing: list[dict[str, Any]]) -> str:
    """The first differing output indices of the prompts that differ, summarised."""
    if not differing:
        return "-"
    at = sorted(d["first_index"] for d in differing)
    n = len(at)
    if n == 1:
        return f"1 prompt, from index {at[0]}"
    return f"{n} prompts, from index {at[0]} (median {at[n // 2]}, latest {at[-1]})"


def _equal_count(row: dict[str, Any]) -> str:
    if "equal" not in row:
        return "-"
    if row["equal"] is None:
        return "other prompts (another vocabulary)"
    return f"{row['equal']}/{row['total']}"


def _tokens_section(results: Results) -> list[str]:
    tokens = results.tokens
    if not tokens:
        return []
    t = results.config.tokens
    ref = tokens["reference"]
    low, high = length_bounds(t.input_len)
    lines = [
        "## Greedy tokens",
        "",
        f"{t.prompts} prompts of {low} to {high} random token ids (seed {t.seed}), "
        f"{t.output_len} output tokens each at temperature 0 (`ignore_eos`), sent at once to "
        "`/generate` after each visit's load cells, on the same server and outside their "
        f"timing. The reference is `{ref['arm']}`'s first visit: each visit counts its prompts "
        "whose output ids equal the reference's, and for the others the first output index "
        "where they differ (0: the first generated token).",
        "",
    ]
    if not tokens["visits"]:
        return lines + ["No token check is measured yet.", ""]
    if not ref["measured"]:
        lines += ["The reference visit is not measured yet: no visit is compared with it.", ""]
    lines += ["| arm | visit | equal to the reference | where they differ |", "|---|---|---|---|"]
    for row in tokens["visits"]:
        is_ref = row["arm"] == ref["arm"] and row["visit"] == ref["visit"]
        equal = _equal_count(row) + (" (the reference)" if is_ref else "")
        where = _where_they_differ(row.get("differing", []))
        lines.append(f"| `{row['arm']}` | {row['visit']} | {equal} | {where} |")
    lines.append("")
    lines += _tokens_within_arms(tokens["within_arm"])
    return lines


def _server_steps_section(results: Results) -> list[str]:
    rows = results.server_steps
    if not rows:
        return []
    lines = [
        "## Prefill steps as each server logged them",
        "",
        "From SGLang's prefill batch lines in `servers/<arm>_<visit>.log` (the whole visit: its "
        "warm-up request and every cell): prefill steps, those that replayed a prefill graph, "
        "MIXED ones (decode rows beside the chunk), and the median time between back-to-back "
        "MIXED steps (the previous one left requests queued), eager and replayed, with how "
        "many were timed. No profiler was running. Where the server logged every decode step "
        "(`--decode-log-interval 1`), its largest burst split into the prefill phase and the "
        "decode tail after it: a faster prefill step shortens that burst by about the prefill "
        "share times the step's change, so the share bounds what a prefill-step gain can give "
        "the served tokens.",
        "",
        "| arm | visit | prefill steps | replayed | MIXED | eager MIXED ms apart (timed) | "
        "replayed MIXED ms apart (timed) | largest burst: prefill phase + decode tail (share) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        apart = [
            "-"
            if r[f"{k}_mixed_apart_ms"] is None
            else f"{r[f'{k}_mixed_apart_ms']:.1f} ({r[f'{k}_mixed_timed']})"
            for k in ("eager", "replayed")
        ]
        burst = r.get("largest_burst")
        phases = (
            "-"
            if not burst
            else f"{burst['prefill_phase_s']:.2f} + {burst['decode_tail_s']:.2f} s "
            f"({burst['prefill_share']:.3f})"
        )
        lines.append(
            f"| `{r['arm']}` | {r['visit']} | {r['prefill_batches']} | {r['replayed']} | "
            f"{r['mixed']} | {apart[0]} | {apart[1]} | {phases} |"
        )
    return [*lines, ""]


def _tokens_within_arms(within: dict[str, dict[str, Any]]) -> list[str]:
    """Each arm's visits against its own first: whether the server repeats itself."""
    if not any(w["visits"] > 1 for w in within.values()):
        return [
            "Each arm has one visit measured: nothing shows yet whether a server repeats its own "
            "tokens under this batching.",
            "",
        ]
    differing = [
        (arm, v, w["first_visit"]) for arm, w in within.items() for v in w["differing_visits"]
    ]
    if not differing:
        return ["Every arm's visits gave the same output ids as its first visit.", ""]
    lines = ["Visits that differ from their own arm's first visit:", ""]
    for arm, v, first in differing:
        lines.append(
            f"- `{arm}` visit {v['visit']}: {_equal_count(v)} equal to visit {first}; "
            f"{_where_they_differ(v['differing'])}"
        )
    return lines + ["", f"So {TOKENS_CAVEAT}.", ""]


def _series(results: Results, arm: str, shape: str, kind: str) -> list[tuple[Point, dict]]:
    """(point, metrics) of one arm and shape at points of one kind, in load order."""
    by_point = results.summary.get(arm, {})
    return sorted(
        ((p, m) for p, m in by_point.items() if p.shape == shape and p.kind == kind),
        key=lambda item: item[0].value,
    )


def _curve_label(results: Results, arm: str, shape: str) -> str:
    return f"{arm} {shape}" if len(results.config.sweep.shapes) > 1 else arm


def write_plots(results: Results, run_dir: Path) -> list[str]:
    """The plot files written, or PLOTS_SKIPPED's line when matplotlib is missing."""
    if not results.summary:
        return []  # nothing measured yet
    try:
        import matplotlib  # noqa: F401 -- a missing matplotlib fails here, cached submodules or not
        from matplotlib.figure import Figure
    except ImportError:
        return [PLOTS_SKIPPED]
    metric = "output_throughput_per_gpu"
    shapes = [s.name for s in results.config.sweep.shapes]

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for arm in results.config.arms:
        for shape in shapes:
            color = None
            # A line through the concurrencies; request rates as squares of the same colour
            # (another load axis: a line through both would zigzag).
            for kind, style in ((CONCURRENCY, {"marker": "o"}), (RATE, {"marker": "s", "ls": ""})):
                points = [
                    (by_m[PER_USER].mean, by_m[metric].mean, _point_label(p, True))
                    for p, by_m in _series(results, arm.name, shape, kind)
                    if metric in by_m and PER_USER in by_m
                ]
                if not points:
                    continue
                label = _curve_label(results, arm.name, shape) if color is None else None
                (line,) = ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    color=color,
                    label=label,
                    **style,
                )
                color = line.get_color()
                for x, y, text in points:
                    ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    label = "joint frontier" + (" (per shape)" if len(shapes) > 1 else "")
    for shape in shapes:
        joint = sorted(
            (r[PER_USER], r[PER_GPU]) for r in results.pareto.get(shape, []) if r["joint_frontier"]
        )
        if joint:
            ax.plot(*zip(*joint, strict=True), color="black", ls="--", lw=1, label=label)
            label = None  # one legend entry for every shape's frontier
    ax.set_xlabel("tok/s per user (1000 / median TPOT)")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title("throughput per GPU vs per user (labels: load point)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, run_dir / PLOTS[0])

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for arm in results.config.arms:
        for shape in shapes:
            series = [
                (p.value, m[metric])
                for p, m in _series(results, arm.name, shape, CONCURRENCY)
                if metric in m
            ]
            if not series:
                continue
            ax.errorbar(
                [x for x, _ in series],
                [e.mean for _, e in series],
                yerr=[e.ci95 or 0.0 for _, e in series],
                marker="o",
                capsize=3,
                label=_curve_label(results, arm.name, shape),
            )
    _concurrency_axis(ax, results.config.sweep.concurrencies)
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title("throughput per GPU (error bars: 95% interval over repeats)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    _save(fig, run_dir / PLOTS[1])

    _ratio_plot(results, run_dir / PLOTS[2], Figure)
    return [str(run_dir / name) for name in PLOTS]


def _save(fig: Any, path: Path) -> None:
    # The format is named: the temporary file's suffix is not .png.
    files.replace_file(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))


def _concurrency_axis(ax: Any, concurrencies: tuple[int, ...]) -> None:
    """Log scale (concurrencies double), ticks at the measured ones, written out."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(concurrencies), [str(c) for c in concurrencies])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")


# The ratios plotted: what a flag is usually judged on, throughput and the decode latency.
RATIO_PLOT_METRICS = (
    ("output_throughput_per_gpu", "output tok/s per GPU"),
    ("median_tpot_ms", "median TPOT"),
)


def ratio_plot_caption(intervals: bool) -> str:
    """What the ratio plot's bars are, as drawn."""
    if intervals:
        return "error bars: 95% interval"
    return "no error bars: one pair of repeats per point, no interval"


def _ratio_plot(results: Results, path: Path, figure: type) -> None:
    """Each candidate's ratio to the baseline against concurrency (and request rate)."""
    sw = results.config.sweep
    kinds = [
        k for k, values in ((CONCURRENCY, sw.concurrencies), (RATE, sw.request_rates)) if values
    ]
    fig = figure(figsize=(6 * len(kinds), 3.2 * len(RATIO_PLOT_METRICS)))
    axes = fig.subplots(len(RATIO_PLOT_METRICS), len(kinds), squeeze=False)
    intervals = False  # whether any point has an interval (one repeat: none to draw)
    for row, (metric, title) in enumerate(RATIO_PLOT_METRICS):
        for col, kind in enumerate(kinds):
            ax = axes[row][col]
            for arm in results.config.arms[1:]:
                for shape in sw.shapes:
                    series = sorted(
                        (p.value, by_m[metric])
                        for p, by_m in results.ratios.get(arm.name, {}).items()
                        if p.shape == shape.name and p.kind == kind and metric in by_m
                    )
                    if not series:
                        continue
                    means = [e.mean for _, e in series]
                    intervals |= any(e.low is not None for _, e in series)
                    # Asymmetric bars: the log-ratio interval mapped back with exp.
                    below = [e.mean - (e.low if e.low is not None else e.mean) for _, e in series]
                    above = [(e.high if e.high is not None else e.mean) - e.mean for _, e in series]
                    ax.errorbar(
                        [x for x, _ in series],
                        means,
                        yerr=[below, above],
                        marker="o",
                        capsize=3,
                        label=f"{_curve_label(results, arm.name, shape.name)} / {results.baseline}",
                    )
            ax.axhline(1.0, color="gray", linewidth=1, linestyle="--")
            if kind == CONCURRENCY:
                _concurrency_axis(ax, sw.concurrencies)
            else:
                ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(f"{title} ratio")
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle(f"candidate / {results.baseline} ({ratio_plot_caption(intervals)})")
    fig.tight_layout()
    _save(fig, path)


def build(run_dir: Path) -> tuple[Results, list[str]]:
    """Write report.md, results.json, results.csv and the plots, each whole or not at all
    (files.py: a failed write keeps the previous file and raises an OSError naming it);
    return the results and the plot lines."""
    results = collect(run_dir)
    files.write_text(run_dir / "report.md", render_markdown(results))
    files.write_text(run_dir / "results.json", json.dumps(results_json(results), indent=2) + "\n")
    files.write_text(run_dir / "results.csv", results_csv(results))
    plots = [] if results.accuracy_only else write_plots(results, run_dir)
    return results, plots
