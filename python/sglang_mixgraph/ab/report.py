"""The report of a run directory: `report.md`, `results.json` and plots, rebuilt from raw outputs.

`report.md` is meant to be pasted into a pull request or an issue: what was compared (model,
server arguments, each arm's environment and arguments), the workload, then per concurrency
each arm's output tok/s per GPU, TPOT, TTFT and ITL (p50 and p99) as mean +/- the 95%
interval over repeats, with each candidate's ratio to the baseline (the first arm): the
geometric mean of the paired ratios with the exp of the t interval of their logarithms;
GSM8K per arm with its Wilson interval against the threshold; the gates with the interval
and the bound each was judged on; every failed or missing cell.
Plots need matplotlib (the `ab` extra); without it they are skipped with one line saying so,
and everything else is written. `pareto.png` is output tok/s per GPU against median TPOT,
one curve per arm through its concurrencies; `throughput.png` is tok/s per GPU against
concurrency with the intervals as error bars.
"""

from __future__ import annotations

import json
from pathlib import Path

from sglang_mixgraph.ab.results import METRICS, Results, collect, results_json
from sglang_mixgraph.ab.stats import Estimate, RatioEstimate

PLOTS = ("pareto.png", "throughput.png")
PLOTS_SKIPPED = "plots skipped: matplotlib is not installed (pip install 'sglang-mixgraph[ab]')"


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(est: Estimate | None) -> str:
    if est is None:
        return "-"
    if est.ci95 is None:
        return _num(est.mean)
    return f"{_num(est.mean)} ± {_num(est.ci95)}"


def _ratio(est: RatioEstimate | dict | None) -> str:
    if est is None:
        return "-"
    if isinstance(est, dict):  # from results.json's gates
        mean, low, high = est["mean"], est["low"], est["high"]
    else:
        mean, low, high = est.mean, est.low, est.high
    if low is None:
        return f"{mean:.3f}x"
    return f"{mean:.3f}x [{low:.3f}, {high:.3f}]"


def _env_args(env: dict[str, str], args: tuple[str, ...]) -> str:
    parts = [f"`{k}={v}`" for k, v in env.items()] + ([f"`{' '.join(args)}`"] if args else [])
    return ", ".join(parts) if parts else "(nothing added)"


def render_markdown(results: Results) -> str:
    c = results.config
    s = c.server
    lines = ["# A/B report", ""]
    if c.note:
        lines += [f"> {line}".rstrip() for line in c.note.strip().splitlines()] + [""]
    lines.append(
        "**Result: PASS**"
        if results.passed
        else f"**Result: FAIL** ({len(results.problems)} problems, listed below)"
    )
    lines.append("")
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
        lines.append(
            f"- load: `sglang.benchmark.serving --backend {sw.backend} --dataset-name {sw.dataset}`, "
            f"input {sw.input_len} / output {sw.output_len} tokens (range ratio {sw.range_ratio:g}), "
            f"max(min_prompts {sw.min_prompts}, {sw.prompts_per_concurrency} x concurrency) "
            f"prompts per cell, warm-up requests: {sw.warmup_requests}"
            + (", prefix cache flushed after the warm-up" if sw.flush_cache else "")
        )
        lines.append(
            f"- {sw.repeats} repeats, arms interleaved per repeat (A B, then B A, ...); a fresh "
            "server per arm and repeat when launched"
        )
        for arm, info in results.gpus.items():
            lines.append(f"- GPUs of `{arm}`: {info['gpus'] or '?'} ({info['source']})")
        for arm, seen in results.server_versions.items():
            lines.append(f"- SGLang of `{arm}`'s server (its /server_info): {', '.join(seen)}")
        lines.append(
            "- values: mean ± half-width of the 95% t interval over repeats; ratios: "
            f"candidate / `{results.baseline}` paired by repeat, the geometric mean of the "
            "paired ratios [95% interval: exp of the t interval of their logarithms]"
        )
    for line, count in results.versions.items():
        lines.append(f"- measured with: {line} ({count} cells)")
    lines.append("")
    if not results.accuracy_only:
        lines += _throughput_section(results)
    lines += _gsm8k_section(results)
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
            verdict = "pass" if gate["passed"] else "FAIL"
            lines.append(
                f"| {gate['gate']} | {_ratio(gate['ratio'])} | {gate['judge']} | "
                f"{gate.get('basis', 'no measurement')} | {verdict} |"
            )
        lines.append("")
    if results.problems:
        lines += ["## Problems", ""]
        lines += [f"- {p.splitlines()[0]}" for p in results.problems]
        lines.append("")
    return "\n".join(lines)


_JUDGE_NOTE = (
    "Judged on the 95% interval: `no_regression` (the default) fails only when the whole "
    "interval is beyond the bound (a minimum on its upper bound, a maximum on its lower "
    "bound: the data show the regression); `confirmed` passes only when the whole interval is "
    "within the bounds; `mean` compares the value itself."
)


def _throughput_section(results: Results) -> list[str]:
    lines = ["## Throughput and latency", ""]
    shown = [(key, title) for key, _, title in METRICS if key != "output_throughput"]
    header = "| concurrency | arm | " + " | ".join(t for _, t in shown) + " | repeats |"
    lines += [header, "|" + "---|" * (len(shown) + 3)]
    for conc in results.config.sweep.concurrencies:
        for arm in results.config.arms:
            by_metric = results.summary.get(arm.name, {}).get(conc, {})
            n = max((e.n for e in by_metric.values()), default=0)
            row = [str(conc), f"`{arm.name}`"] + [_cell(by_metric.get(k)) for k, _ in shown]
            lines.append("| " + " | ".join(row) + f" | {n} |")
        for arm in results.config.arms[1:]:
            by_metric = results.ratios.get(arm.name, {}).get(conc, {})
            row = ["", f"`{arm.name}` / `{results.baseline}`"]
            row += [_ratio(by_metric.get(k)) for k, _ in shown]
            lines.append("| " + " | ".join(row) + " | |")
    lines.append("")
    lines += ["![throughput vs TPOT](pareto.png)", "", "![throughput](throughput.png)", ""]
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
    return lines


def write_plots(results: Results, run_dir: Path) -> list[str]:
    """The plot files written, or PLOTS_SKIPPED's line when matplotlib is missing."""
    if not results.summary:
        return []  # nothing measured yet
    try:
        # Figures without pyplot: files only, no backend or REPL hooks (pyplot consults IPython
        # whenever a module of that name is loaded, which broke a run on a GPU machine).
        import matplotlib  # noqa: F401 -- a missing matplotlib fails here, cached submodules or not
        from matplotlib.figure import Figure
    except ImportError:
        return [PLOTS_SKIPPED]
    metric = "output_throughput_per_gpu"
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for arm in results.config.arms:
        points = [
            (by_m["median_tpot_ms"].mean, by_m[metric].mean, conc)
            for conc, by_m in sorted(results.summary.get(arm.name, {}).items())
            if metric in by_m and "median_tpot_ms" in by_m
        ]
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=arm.name)
        for x, y, conc in points:
            ax.annotate(str(conc), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("median TPOT (ms)")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title("throughput vs TPOT (labels: concurrency)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[0], dpi=120)

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for arm in results.config.arms:
        series = [
            (conc, by_m[metric])
            for conc, by_m in sorted(results.summary.get(arm.name, {}).items())
            if metric in by_m
        ]
        if not series:
            continue
        ax.errorbar(
            [conc for conc, _ in series],
            [e.mean for _, e in series],
            yerr=[e.ci95 or 0.0 for _, e in series],
            marker="o",
            capsize=3,
            label=arm.name,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title("throughput per GPU (error bars: 95% interval over repeats)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[1], dpi=120)
    return [str(run_dir / name) for name in PLOTS]


def build(run_dir: Path) -> tuple[Results, list[str]]:
    """Write report.md, results.json and the plots; return the results and the plot lines."""
    results = collect(run_dir)
    (run_dir / "report.md").write_text(render_markdown(results))
    (run_dir / "results.json").write_text(json.dumps(results_json(results), indent=2) + "\n")
    plots = [] if results.accuracy_only else write_plots(results, run_dir)
    return results, plots
