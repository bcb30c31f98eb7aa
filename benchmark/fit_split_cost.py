#!/usr/bin/env python3
"""Fit the adaptive policy's cost model from in-server timings of the split.

Input: a results JSON of benchmark/mixed_split_inserver.py (upstream's ``forward`` with the patch
off and ``always``, per layer kind, context, decode rows D and prefill rows P), best run with
``--queue-ahead-ms`` so its times are GPU work only, as in a replayed step whose host launches run
ahead. Output: the per-ratio coefficients of ``sglang_mixgraph.core.split_cost_model`` fitted by
``kits.cost_fit.fit_coefficients`` (non-negative, relative error), written as the package's
``data/split_cost_<arch>.json``, and each point's measured vs predicted times on stdout.

``--eager`` adds the eager regime's terms (``kits.cost_fit.fit_eager_terms``) from a second
results JSON run without ``--queue-ahead-ms`` (the host exposed: each call's wall and host time),
on top of the GPU coefficients just fitted. ``--report`` writes the re-evaluation page: what
``adaptive`` picks at every recorded point in its regime, before (GPU model only) and after, and
its measured time relative to the better of ``off`` and ``always``.

    python3 benchmark/fit_split_cost.py docs/results/mixed_split_inserver_fit_h200.json \\
        --eager docs/results/mixed_split_inserver_h200.json --arch sm90 \\
        --write python/sglang_mixgraph/data/split_cost_sm90.json \\
        --report docs/results/split_cost_regimes_h200.md

``--step`` fits the step terms (``kits.cost_fit.fit_step_terms``: one chunk-cache build, the
split plan's own work, the decision, per step) from results JSONs of
benchmark/mixed_steady_state.py and writes them as the file's ``step`` block; without the
positional results it keeps the file's per-layer and eager coefficients as they are.
``--step-report`` (with the in-server files as above) writes the re-evaluation of ``adaptive``'s
whole-step decisions with the old and the fitted step terms:

    python3 benchmark/fit_split_cost.py --step \\
        docs/results/mixed_steady_state_h200_run4/steady.json \\
        docs/results/mixed_steady_state_h200_run5/steady.json \\
        --write python/sglang_mixgraph/data/split_cost_sm90.json \\
        --step-report docs/results/split_cost_step_terms_h200.md \\
        --replay-points docs/results/mixed_split_inserver_fit_h200.json \\
        --eager docs/results/mixed_split_inserver_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time

from sglang_mixgraph.core import split_cost_model as cm
from sglang_mixgraph.kits import cost_fit as fit

RATIO_OF_LAYER = {"csa_c4_top1024": 4, "hca_c128": 128}
COMMAND = (
    "python3 benchmark/fit_split_cost.py docs/results/mixed_split_inserver_fit_h200.json "
    "--eager docs/results/mixed_split_inserver_h200.json --arch sm90 "
    "--write python/sglang_mixgraph/data/split_cost_sm90.json "
    "--report docs/results/split_cost_regimes_h200.md"
)


def shape_of(p) -> cm.StepShape:
    ratio = RATIO_OF_LAYER[p["layer"]]
    return cm.StepShape.uniform(ratio, p["context"], p["decode_rows"], p["prefill_rows"])


def samples_of(points):
    return [(shape_of(p), p["off_layer_ms"], p["always_layer_ms"]) for p in points]


def eager_samples_of(points):
    return [
        (
            shape_of(p),
            p["off_layer_host_ms"],
            p["always_layer_host_ms"],
            p["off_layer_wall_ms"],
            p["always_layer_wall_ms"],
        )
        for p in points
    ]


def source_of(path: str, data: dict, what: str) -> str:
    env = data["environment"]
    return (
        f"benchmark/mixed_split_inserver.py on {env['gpu']}, {env['date']}, {what}, "
        f"{len(data['points'])} points ({path}); fitted by benchmark/fit_split_cost.py"
    )


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------------------------
# re-evaluation of recorded timings
# --------------------------------------------------------------------------------------------


def regret(point, split: bool, key: str) -> float:
    """The chosen arm's measured time over the better of off and always (1.0 = the better)."""
    off, always = point[f"off_{key}"], point[f"always_{key}"]
    return (always if split else off) / min(off, always)


def evaluate(points, decide, key: str, shape=shape_of):
    """Per point ``(split?, regret)`` of ``decide(shape(point))`` against the measured ``key``
    times (``shape_of``: one layer kind; ``step_counts_of``: a whole step)."""
    out = []
    for p in points:
        split = decide(shape(p))
        out.append((split, regret(p, split, key)))
    return out


def wall_rules(coeffs: cm.Coefficients):
    """Candidate eager wall models, for the report's comparison: (name, fn(shape) -> times)."""

    def host(shape):
        e = coeffs.eager_for_ratio(shape.ratio)
        hs = e["host_split"] if shape.prefill_rows else e["host_split_decode_only"]
        return e["host_unsplit"], hs

    def combine(f):
        return lambda s: tuple(f(h, g) for h, g in zip(host(s), cm.predict(s, coeffs), strict=True))

    return [
        ("GPU model only (today)", lambda s: cm.predict(s, coeffs)),
        ("max(H, G)", combine(max)),
        ("H + G", combine(lambda h, g: h + g)),
        ("max(H, G + kappa H) (shipped)", lambda s: cm.predict_eager(s, coeffs)),
    ]


def leave_one_out(points, coeffs: cm.Coefficients):
    """Per eager point ``(split?, regret)`` with the eager terms fitted to the other points."""
    gpu_only = dataclasses.replace(coeffs, eager=None, eager_source="")
    samples = eager_samples_of(points)
    out = []
    for i, p in enumerate(points):
        held = fit.fit_eager_terms(samples[:i] + samples[i + 1 :], gpu_only)
        split = cm.should_split(shape_of(p), held, regime=cm.EAGER)
        out.append((split, regret(p, split, "layer_wall_ms")))
    return out


def worst_recorded(points, coeffs: cm.Coefficients, legacy: cm.Coefficients) -> str:
    """A sentence on the eager point where the recorded ``adaptive`` arm did worst."""
    p = max(
        points,
        key=lambda x: x["adaptive_layer_wall_ms"]
        / min(x["off_layer_wall_ms"], x["always_layer_wall_ms"]),
    )
    s = shape_of(p)
    best = min(p["off_layer_wall_ms"], p["always_layer_wall_ms"])
    gu, gs = cm.predict(s, legacy)
    eu, es = cm.predict_eager(s, coeffs)
    return (
        f"The recorded `adaptive` arm did worst at {p['layer']} {p['context'] // 1024}k D "
        f"{p['decode_rows']} P {p['prefill_rows']} ({p['adaptive_layer_wall_ms']:.3f} ms, "
        f"{p['adaptive_layer_wall_ms'] / best:.3f}x the faster arm's wall; "
        f"{p['off_layer_ms'] / p['adaptive_layer_ms']:.2f}x of `off` by CUDA-event time, as on "
        "the results page). It split with the coefficients shipped at the time of that run; the "
        f"GPU model shipped now keeps the layer unsplit there, but by a predicted "
        f"{100 * (gs / gu - 1):.1f} % ({gu:.3f} vs {gs:.3f} ms), while the eager model predicts "
        f"the split {100 * (es / eu - 1):.0f} % slower ({eu:.3f} vs {es:.3f} ms)."
    )


def time_calls(coeffs: cm.Coefficients, reps: int = 20000):
    """CPU cost per call: ``should_split`` in each regime on a prepared shape, and
    ``StepShape.from_lists`` (the only part that grows with the requests) for a few sizes."""
    shape = cm.StepShape.uniform(4, 8192, 32, 512)
    out = {}
    for regime in cm.REGIMES:
        t0 = time.perf_counter()
        for _ in range(reps):
            cm.should_split(shape, coeffs, regime=regime)
        out[f"should_split ({regime})"] = (time.perf_counter() - t0) / reps * 1e6
    for n in (33, 257):
        seqs, exts = cm.uniform_step_lists(8192, n - 1, 512)
        k = max(reps // 20, 200)
        t0 = time.perf_counter()
        for _ in range(k):
            cm.StepShape.from_lists(4, seqs, exts, n - 1)
        out[f"StepShape.from_lists, {n} requests"] = (time.perf_counter() - t0) / k * 1e6
    return out


def _pick(split: bool) -> str:
    return "split" if split else "off"


def _worst(rows):
    return max(rows, key=lambda r: r[1])


def report(eager_data, replay_data, coeffs: cm.Coefficients, paths) -> str:
    legacy = dataclasses.replace(coeffs, eager=None, eager_source="")
    E, Q = eager_data["points"], replay_data["points"]
    before_e = evaluate(E, lambda s: cm.should_split(s, legacy), "layer_wall_ms")
    after_e = evaluate(E, lambda s: cm.should_split(s, coeffs, regime=cm.EAGER), "layer_wall_ms")
    before_q = evaluate(Q, lambda s: cm.should_split(s, legacy), "layer_ms")
    after_q = evaluate(Q, lambda s: cm.should_split(s, coeffs, regime=cm.REPLAY), "layer_ms")
    # Same code measured twice: the recorded adaptive arm ran the code of the arm it chose.
    spread = {}
    for p in E:
        same = p[f"{_arm(p['adaptive_split'])}_layer_wall_ms"]
        spread.setdefault(p["layer"], []).append(abs(p["adaptive_layer_wall_ms"] / same - 1))
    spread_text = "; ".join(
        f"{layer}: median {100 * statistics.median(v):.1f} %, up to {100 * max(v):.1f} %"
        for layer, v in spread.items()
    )

    def label(p):
        return f"{p['layer']} | {p['context']} | {p['decode_rows']} | {p['prefill_rows']}"

    def name(i, pts):
        p = pts[i]
        return f"{p['layer']} {p['context'] // 1024}k D {p['decode_rows']} P {p['prefill_rows']}"

    def worst_line(rows, pts):
        i = max(range(len(rows)), key=lambda j: rows[j][1])
        return f"{rows[i][1]:.3f} ({name(i, pts)}, {_pick(rows[i][0])})"

    def over(rows):
        return sum(r[1] > 1.01 for r in rows)

    ee, eq = eager_data["environment"], replay_data["environment"]
    lines = [
        "# Split cost model in both regimes (H200): a re-evaluation of recorded timings",
        "",
        f"Generated {datetime.date.today().isoformat()} on the CPU by `{COMMAND}`. **No new GPU "
        "run**: the decisions of `adaptive` are re-evaluated against timings already recorded, "
        "and each point's time is the measured time of the arm the decision picks.",
        "",
        "Source data:",
        "",
        f"- eager (host exposed): `{paths[0]}`, {len(E)} points, {ee['gpu']}, {ee['date']}, "
        f"`{ee['command']}`; times: `*_layer_wall_ms` (synchronize, call, synchronize).",
        f"- queue ahead (as in a replay): `{paths[1]}`, {len(Q)} points, {eq['gpu']}, "
        f"{eq['date']}, `{eq['command']}`; times: `*_layer_ms` (CUDA events: GPU time; the "
        f"wall there includes the {eq.get('queue_ahead_ms', 0)} ms queued ahead).",
        "",
        "`before`: today's call, `should_split(shape, coeffs)` (the GPU model in every step). "
        "`after`: `should_split(shape, coeffs, regime=...)` in the point's regime, eager for the "
        "eager points, replay for the queue-ahead points. x = the picked arm's time / the better "
        "of `off` and `always` at that point (1.000 = the better arm; target: at most 1.010).",
        "",
        "## Summary",
        "",
        "| regime | points | before: worst x | before: points > 1.01 | after: worst x | after: points > 1.01 |",
        "|---|---|---|---|---|---|",
        f"| eager | {len(E)} | {worst_line(before_e, E)} | {over(before_e)} | "
        f"{worst_line(after_e, E)} | {over(after_e)} |",
        f"| replay | {len(Q)} | {worst_line(before_q, Q)} | {over(before_q)} | "
        f"{worst_line(after_q, Q)} | {over(after_q)} |",
        "",
        f"Replay decisions changed: {sum(a[0] != b[0] for a, b in zip(after_q, before_q, strict=True))} "
        f"of {len(Q)}. Resolution of the eager run: the recorded `adaptive` arm ran the same "
        f"code as the arm it picked, and its wall differs from that arm's by ({spread_text}); "
        "gaps between `off` and `always` of that size are not resolved by the run.",
        "",
        worst_recorded(E, coeffs, legacy),
        "",
        "## The eager wall model",
        "",
        "Host time per layer call `H` (median per ratio and path of `*_layer_host_ms`; no trend "
        "with context, D or P in either file, only noise), `G` the GPU model, and the eager run's "
        "wall. Candidate rules, decisions re-evaluated on the eager points:",
        "",
        "| eager wall rule | worst x | points > 1.01 | mean x |",
        "|---|---|---|---|",
    ]
    for rule, fn in wall_rules(coeffs):

        def decide(s, fn=fn):
            if not s.num_decode:
                return False
            u, sp = fn(s)
            return sp <= (1 - coeffs.margin) * u

        rows = evaluate(E, decide, "layer_wall_ms")
        lines.append(
            f"| {rule} | {worst_line(rows, E)} | {over(rows)} | "
            f"{statistics.mean(r[1] for r in rows):.4f} |"
        )
    loo = leave_one_out(E, coeffs)
    lines.append(
        f"| the same, each point decided with H and kappa refitted without it | "
        f"{worst_line(loo, E)} | {over(loo)} | {statistics.mean(r[1] for r in loo):.4f} |"
    )
    lines += [
        "",
        "`max(H, G)` assumes the call's host work overlaps its GPU work; in the eager run the GPU "
        "waits for most of it (fitted kappa 0.8: as if the kernels that carry the GPU time were "
        "launched near the end of "
        "the call), so it under-counts the split's extra host time where the GPU work is long "
        "(c4, D 32 with a prefill chunk). `H + G` over-counts it where the split's decode kernel "
        "runs while the host prepares the prefill (D 256). The fitted share `kappa` sits between. "
        "Fitted terms:",
        "",
        "| ratio | H unsplit ms | H split ms (b0 > 0) | H split ms (decode rows only) | kappa |",
        "|---|---|---|---|---|",
    ]
    for r, e in sorted(coeffs.eager.items()):
        lines.append(
            f"| c{r} | {e['host_unsplit']:.3f} | {e['host_split']:.3f} | "
            f"{e['host_split_decode_only']:.3f} | {e['kappa']:.3f} |"
        )
    lines += [
        "",
        "SWA-only layers (ratio 0) borrow the c4 terms, as for the GPU model. The eager run's "
        "calls start with an idle GPU (a synchronize before each): in a real eager step the "
        "previous layer's GPU work can still be queued and hide part of the host time, so these "
        "terms are the pessimistic end for the split.",
        "",
        "## Eager points (regime `eager`)",
        "",
        "ms = measured wall of one layer call. `recorded adaptive` is the `adaptive` arm of that "
        "run, which used the coefficients shipped at the time (fitted to the kernel sweep), not "
        "today's.",
        "",
        "| layer | context | D | P | off ms | always ms | before pick | before x | after pick | after x | recorded adaptive ms (x) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, b, a in zip(E, before_e, after_e, strict=True):
        best = min(p["off_layer_wall_ms"], p["always_layer_wall_ms"])
        lines.append(
            f"| {label(p)} | {p['off_layer_wall_ms']:.3f} | {p['always_layer_wall_ms']:.3f} | "
            f"{_pick(b[0])} | {b[1]:.3f} | {_pick(a[0])} | {a[1]:.3f} | "
            f"{p['adaptive_layer_wall_ms']:.3f} ({p['adaptive_layer_wall_ms'] / best:.3f}) |"
        )
    lines += [
        "",
        "## Queue-ahead points (regime `replay`)",
        "",
        "ms = measured GPU time of one layer call with the GPU queue kept ahead of the host.",
        "",
        "| layer | context | D | P | off ms | always ms | before pick | before x | after pick | after x |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, b, a in zip(Q, before_q, after_q, strict=True):
        lines.append(
            f"| {label(p)} | {p['off_layer_ms']:.3f} | {p['always_layer_ms']:.3f} | "
            f"{_pick(b[0])} | {b[1]:.3f} | {_pick(a[0])} | {a[1]:.3f} |"
        )
    lines += [
        "",
        "## Cost per decision (this CPU)",
        "",
        "`should_split` is a fixed number of multiply-adds on the step's counts in either regime; "
        "only `StepShape.from_lists` (unchanged) walks the requests.",
        "",
        "| call | µs per call |",
        "|---|---|",
    ]
    for k, us in time_calls(coeffs).items():
        lines.append(f"| {k} | {us:.2f} |")
    return "\n".join(lines) + "\n"


def _arm(split: bool) -> str:
    return "always" if split else "off"


# --------------------------------------------------------------------------------------------
# step terms: fit and re-evaluation of whole-step decisions
# --------------------------------------------------------------------------------------------

STEP_COMMAND = (
    "python3 benchmark/fit_split_cost.py --step "
    "docs/results/mixed_steady_state_h200_run4/steady.json "
    "docs/results/mixed_steady_state_h200_run5/steady.json "
    "--write python/sglang_mixgraph/data/split_cost_sm90.json "
    "--step-report docs/results/split_cost_step_terms_h200.md "
    "--replay-points docs/results/mixed_split_inserver_fit_h200.json "
    "--eager docs/results/mixed_split_inserver_h200.json"
)
# DSV4-Pro's layers that benchmark/mixed_split_inserver.py times (its two SWA-only layers are not
# timed there): a whole step of the in-server points is these layers of each arm.
TIMED_STEP_LAYERS = {4: 30, 128: 29}
DSV4_PRO_LAYERS = {0: 2, 4: 30, 128: 29}


def step_source_of(paths, runs) -> str:
    """The step block's source: the runs (paths; GPU, date, contexts and command once where
    they share them) and how it was fitted."""
    groups: dict[tuple, list[str]] = {}
    for path, run in zip(paths, runs, strict=True):
        env = run["environment"]
        ctx = "/".join(str(p["context"]) for p in run["points"])
        groups.setdefault((env["gpu"], env["date"], ctx, env["command"]), []).append(path)
    runs_text = "; ".join(
        f"{gpu}, {date}, {', '.join(where)} (contexts {ctx}), `{command}`"
        for (gpu, date, ctx, command), where in groups.items()
    )
    return (
        f"benchmark/mixed_steady_state.py on {runs_text}; fitted by "
        "benchmark/fit_split_cost.py --step (medians of the plan's host parts)"
    )


def step_counts_of(p) -> cm.StepCounts:
    seqs, exts = cm.uniform_step_lists(p["context"], p["decode_rows"], p["prefill_rows"])
    return cm.StepCounts.from_lists(seqs, exts, p["decode_rows"], topk=cm.C4_TOPK)


def whole_steps(points, key: str, terms) -> list[dict]:
    """In-server per-layer points grouped into whole steps of ``TIMED_STEP_LAYERS``: each arm's
    step = its measured layer times (``*_{key}``) times the layers, plus the step's own parts at
    ``terms`` (the H200's measured host parts: ``off`` one chunk-cache build; ``always`` one
    build where it has prefill rows, and the plan)."""
    by: dict[tuple, dict] = {}
    for p in points:
        k = (p["context"], p["decode_rows"], p["prefill_rows"])
        by.setdefault(k, {})[RATIO_OF_LAYER[p["layer"]]] = p
    out = []
    for (ctx, d, pre), layers in by.items():
        if set(layers) != set(TIMED_STEP_LAYERS) or not d:
            continue

        def arm(name, layers=layers):
            return sum(n * layers[r][f"{name}_{key}"] for r, n in TIMED_STEP_LAYERS.items())

        build = terms["cache_build_ms"]
        out.append(
            dict(
                layer="step",
                context=ctx,
                decode_rows=d,
                prefill_rows=pre,
                off_step_ms=arm("off") + build,
                always_step_ms=arm("always") + (build if pre else 0.0) + terms["split_plan_ms"],
            )
        )
    return out


def steady_steps(paths, runs) -> list[dict]:
    """The recorded whole steps of benchmark/mixed_steady_state.py (prepare + replay medians)."""
    out = []
    for path, run in zip(paths, runs, strict=True):
        for p in run["points"]:
            out.append(
                dict(
                    layer=path,
                    context=p["context"],
                    decode_rows=p["decode_rows"],
                    prefill_rows=p["prefill_rows"],
                    off_step_ms=p["off"]["step_ms"],
                    always_step_ms=p["always"]["step_ms"],
                )
            )
    return out


def step_report(
    step_paths, step_runs, replay_data, eager_data, coeffs: cm.Coefficients, per_context, paths
) -> str:
    """The re-evaluation page of the step terms: ``adaptive``'s whole-step decisions with the old
    step terms (``DEFAULT_STEP_TERMS``) and with ``coeffs``' fitted ones."""
    old = dataclasses.replace(coeffs, step=None, step_source="")
    terms = dict(coeffs.step_terms())
    sets = []
    if replay_data is not None:
        sets.append(
            (
                "replay",
                "in-server, queue ahead",
                whole_steps(replay_data["points"], "layer_ms", terms),
                TIMED_STEP_LAYERS,
            )
        )
    if eager_data is not None:
        sets.append(
            (
                "eager",
                "in-server, eager",
                whole_steps(eager_data["points"], "layer_wall_ms", terms),
                TIMED_STEP_LAYERS,
            )
        )
    sets.append(
        (
            "replay",
            "steady state (recorded whole steps)",
            steady_steps(step_paths, step_runs),
            DSV4_PRO_LAYERS,
        )
    )

    def decider(c, regime, mix):
        return lambda counts: cm.decide_step(counts, mix, c, regime=regime)

    def name(p):
        return f"{p['context'] // 1024}k D {p['decode_rows']} P {p['prefill_rows']}"

    def worst(rows, pts):
        i = max(range(len(rows)), key=lambda j: rows[j][1])
        if rows[i][1] <= 1.0:
            return "1.0000 (every step: the faster arm)"
        return f"{rows[i][1]:.4f} ({name(pts[i])}, {_pick(rows[i][0])})"

    def closest(pts, c, regime, mix):
        """The step whose predicted split - unsplit is nearest 0, and that margin."""
        margins = [
            (lambda q: q.split_ms - q.unsplit_ms)(
                cm.predict_step(step_counts_of(p), mix, c, regime=regime)
            )
            for p in pts
        ]
        i = min(range(len(pts)), key=lambda j: abs(margins[j]))
        return f"{margins[i]:+.3f} ms ({name(pts[i])})"

    results = []
    for regime, label, pts, mix in sets:
        before = evaluate(pts, decider(old, regime, mix), "step_ms", step_counts_of)
        after = evaluate(pts, decider(coeffs, regime, mix), "step_ms", step_counts_of)
        results.append((regime, label, pts, mix, before, after))

    lines = [
        "# Split cost model: the step terms fitted from recorded H200 steps",
        "",
        f"Generated {datetime.date.today().isoformat()} on the CPU by `{STEP_COMMAND}`. **No new "
        "GPU run**: the step terms are fitted from host times already recorded, and `adaptive`'s "
        "whole-step decisions are re-evaluated against timings already recorded.",
        "",
        "PREDICTION",
        "",
        "## Source data",
        "",
    ]
    for path, run in zip(step_paths, step_runs, strict=True):
        env = run["environment"]
        lines.append(
            f"- step terms: `{path}`, {env['gpu']}, {env['date']}, `{env['command']}`: per "
            "context and arm the host ms of the plan's parts within each replayed step "
            "(`host_parts_ms`, medians per arm; `host_parts_samples` per step where recorded)."
        )
    for regime, label, data, key in (
        ("replay", "queue ahead", replay_data, "layer_ms"),
        ("eager", "eager", eager_data, "layer_wall_ms"),
    ):
        if data is not None:
            env = data["environment"]
            path = paths[regime]
            lines.append(
                f"- {label} layer times ({regime} decisions): `{path}`, {len(data['points'])} "
                f"points, {env['gpu']}, {env['date']}, `{env['command']}`; `*_{key}`."
            )
    lines += [
        "",
        "## The step terms",
        "",
        "How each term maps to the measured parts (`kits.cost_fit.step_term_samples`): "
        "`cache_build_ms` = the chunk-cache builder, both kinds (the split's prefill-only cache "
        "in the patch arms' prepare, upstream's over every request in `off`'s replay); "
        "`split_plan_ms` = `plan - decision - chunk_cache` in the prepare of a patch arm that "
        "split (the decode tail's inputs, the boundary and the plan's checks); `eval_ms` = "
        "`decision` in `adaptive`'s prepare. Each term is the median of one value per arm, "
        "context and run. Host time only: GPU work a part launches is not in it.",
        "",
        "| term | old constant (not fitted) | fitted | fitted / old | "
        + " | ".join(f"median at {c // 1024}k" for c in sorted(per_context[cm.STEP_NAMES[0]]))
        + " |",
        "|---|---|---|---|" + "---|" * len(per_context[cm.STEP_NAMES[0]]),
    ]
    for t in cm.STEP_NAMES:
        cells = " | ".join(f"{v:.3f}" for _, v in sorted(per_context[t].items()))
        lines.append(
            f"| `{t}` | {cm.DEFAULT_STEP_TERMS[t]:.3f} | {terms[t]:.3f} | "
            f"{terms[t] / cm.DEFAULT_STEP_TERMS[t]:.1f}x | {cells} |"
        )
    lines += [
        "",
        "Only `cache_build_ms` and `split_plan_ms` can move a decision: `eval_ms` is paid "
        "whichever way `adaptive` decides, and a step with prefill rows builds one cache either "
        "way, so there only the plan counts against the split; a step without prefill rows "
        "saves the whole build by splitting.",
        "",
        "## Decisions re-evaluated",
        "",
        "`before`: `decide_step` with the old constants; `after`: with the fitted terms, in the "
        "points' regime. Whole steps of the in-server points: DSV4-Pro's 30 c4 and 29 c128 layers "
        "(its two SWA-only layers are not timed there), each arm's step = its measured layer "
        "times plus the step's own parts at the fitted terms (the measured H200 host parts: "
        "`off` one cache build, `always` one build where it has prefill rows, plus the plan); "
        "the steady-state steps are the recorded whole steps (prepare + replay medians, 61 "
        "layers), decided for 61 layers. x = the picked arm's step / the better of `off` and "
        "`always` (1.0000 = the better).",
        "",
        "| points | regime | steps | decisions changed | before: worst x | before: steps > 1.001 | after: worst x | after: steps > 1.001 | after: closest decision (predicted split - unsplit) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for regime, label, pts, mix, before, after in results:
        changed = sum(a[0] != b[0] for a, b in zip(after, before, strict=True))
        lines.append(
            f"| {label} | {regime} | {len(pts)} | {changed} | {worst(before, pts)} | "
            f"{sum(r[1] > 1.001 for r in before)} | {worst(after, pts)} | "
            f"{sum(r[1] > 1.001 for r in after)} | {closest(pts, coeffs, regime, mix)} |"
        )
    lines += ["", "AGAINST"]
    for regime, label, pts, mix, before, after in results:
        lines += [
            "",
            f"### {label} ({regime})",
            "",
            "| context | D | P | off ms | always ms | predicted split - unsplit, before | after | before pick | before x | after pick | after x |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p, b, a in zip(pts, before, after, strict=True):
            counts = step_counts_of(p)
            pb = cm.predict_step(counts, mix, old, regime=regime)
            pa = cm.predict_step(counts, mix, coeffs, regime=regime)
            mark = " **changed**" if a[0] != b[0] else ""
            lines.append(
                f"| {p['context']} | {p['decode_rows']} | {p['prefill_rows']} | "
                f"{p['off_step_ms']:.3f} | {p['always_step_ms']:.3f} | "
                f"{pb.split_ms - pb.unsplit_ms:+.3f} | {pa.split_ms - pa.unsplit_ms:+.3f} | "
                f"{_pick(b[0])} | {b[1]:.4f} | {_pick(a[0])}{mark} | {a[1]:.4f} |"
            )
    return "\n".join(lines) + "\n"


def _keep_reproduced_digits(coeffs: cm.Coefficients, path: str) -> cm.Coefficients:
    """The file's GPU coefficients where the refit reproduces them (the solver's last digits
    vary with the BLAS), so that re-running the fit on the same data leaves them as they are."""
    try:
        old = cm.Coefficients.from_json(_load(path))
    except (OSError, ValueError, KeyError):
        return coeffs
    if old.per_ratio.keys() != coeffs.per_ratio.keys():
        return coeffs
    for r, new in coeffs.per_ratio.items():
        for k, v in new.items():
            if abs(v - old.per_ratio[r][k]) > 1e-9 * max(abs(v), 1e-12):
                return coeffs
    return dataclasses.replace(coeffs, per_ratio=old.per_ratio)


def _keep_step_terms(coeffs: cm.Coefficients, path: str) -> cm.Coefficients:
    """The file's step terms (``cm.STEP_NAMES``: chunk-cache build, plan, evaluation per step),
    which this fit does not touch: they come from whole-step timings, not per-layer ones."""
    try:
        old = cm.Coefficients.from_json(_load(path))
    except (OSError, ValueError, KeyError):
        return coeffs
    return dataclasses.replace(coeffs, step=old.step, step_source=old.step_source)


def _fit_layers(args, eager_data):
    """The per-layer fit (and the eager terms when ``eager_data``), printed point by point."""
    data = _load(args.results)
    samples = samples_of(data["points"])
    queue = f"queue ahead {data['environment'].get('queue_ahead_ms', 0)} ms"
    source = source_of(args.results, data, queue)
    coeffs = fit.fit_coefficients(samples, args.arch, margin=args.margin, source=source)
    if args.write:
        coeffs = _keep_reproduced_digits(coeffs, args.write)
    print("ratio context D P | off ms (pred) | split ms (pred) | measured x | predicted x | splits")
    wrong = 0
    for p, (shape, off, split) in zip(data["points"], samples, strict=True):
        pu, ps = cm.predict(shape, coeffs)
        decided = cm.should_split(shape, coeffs)
        wrong += decided != (split < off)
        print(
            f"c{shape.ratio} {p['context']} {shape.num_decode} {shape.prefill_rows} | "
            f"{off:.3f} ({pu:.3f}) | {split:.3f} ({ps:.3f}) | {off / split:.2f} | "
            f"{pu / ps:.2f} | {'yes' if decided else 'no'}"
        )
    print(f"decisions that disagree with the measurement: {wrong} of {len(samples)}")
    if eager_data is not None:
        esamples = eager_samples_of(eager_data["points"])
        esource = source_of(args.eager, eager_data, "eager (host exposed)")
        coeffs = fit.fit_eager_terms(esamples, coeffs, source=esource)
        print("eager: ratio context D P | off wall (pred) | split wall (pred) | splits")
        wrong = 0
        for p, (shape, _, _, off, split) in zip(eager_data["points"], esamples, strict=True):
            pu, ps = cm.predict_eager(shape, coeffs)
            decided = cm.should_split(shape, coeffs, regime=cm.EAGER)
            wrong += decided != (split < off)
            print(
                f"c{shape.ratio} {p['context']} {shape.num_decode} {shape.prefill_rows} | "
                f"{off:.3f} ({pu:.3f}) | {split:.3f} ({ps:.3f}) | {'yes' if decided else 'no'}"
            )
        print(f"eager decisions that disagree with the measurement: {wrong} of {len(esamples)}")
    return coeffs, data


def _package_file(arch: str) -> str:
    from importlib import resources

    return str(resources.files("sglang_mixgraph").joinpath("data", f"split_cost_{arch}.json"))


# The step page's hand-written sections, kept when it is regenerated: (placeholder, heading).
KEPT_SECTIONS = (("PREDICTION", "## Prediction"), ("AGAINST", "## Against the prediction"))


def _kept_section(path: str, heading: str) -> str | None:
    """A hand-written section of the page at ``path`` (from its heading to the next section),
    or None."""
    try:
        text = open(path).read()
    except OSError:
        return None
    if heading not in text:
        return None
    rest = text[text.index(heading) :]
    end = rest.find("\n## ", len(heading))
    return (rest if end < 0 else rest[:end]).strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", help="mixed_split_inserver.py results JSON (queue ahead)")
    ap.add_argument("--eager", metavar="PATH", help="mixed_split_inserver.py results JSON (eager)")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--margin", type=float, default=cm.KNOWN_ARCH_MARGIN)
    ap.add_argument("--write", metavar="PATH", help="where to write the coefficients JSON")
    ap.add_argument("--report", metavar="PATH", help="where to write the re-evaluation page")
    ap.add_argument(
        "--step",
        nargs="+",
        metavar="JSON",
        help="mixed_steady_state.py results JSONs: fit the step terms from them (the file's "
        "`step` block); without the positional results the file's other coefficients are kept",
    )
    ap.add_argument(
        "--step-report", metavar="PATH", help="where to write the step terms' re-evaluation page"
    )
    ap.add_argument(
        "--replay-points",
        metavar="PATH",
        help="mixed_split_inserver.py queue-ahead JSON whose points --step-report re-evaluates as "
        "whole replayed steps (default: the positional results)",
    )
    args = ap.parse_args()
    if args.results is None and not args.step:
        ap.error("give the in-server results to fit, --step, or both")
    if args.step_report and not args.step:
        ap.error("--step-report needs --step")
    eager_data = _load(args.eager) if args.eager else None
    data = None
    if args.results:
        coeffs, data = _fit_layers(args, eager_data)
    else:
        # Only the step terms: the file's per-layer and eager coefficients stay as they are.
        coeffs = cm.Coefficients.from_json(_load(args.write or _package_file(args.arch)))
    per_context = None
    if args.step:
        runs = [_load(p) for p in args.step]
        terms, per_context = fit.fit_step_terms(runs)
        coeffs = dataclasses.replace(
            coeffs, step=terms, step_source=step_source_of(args.step, runs)
        )
        print("step terms (ms): " + ", ".join(f"{k} {v:.4f}" for k, v in terms.items()))
        for k, by_ctx in per_context.items():
            print(f"  {k} per context: " + ", ".join(f"{c}: {v:.4f}" for c, v in by_ctx.items()))
    elif args.write:
        coeffs = _keep_step_terms(coeffs, args.write)
    if args.write:
        with open(args.write, "w") as f:
            json.dump(coeffs.to_json(), f, indent=1)
            f.write("\n")
        print("wrote", args.write)
    if args.report:
        if eager_data is None or data is None:
            ap.error("--report needs the in-server results and --eager")
        with open(args.report, "w") as f:
            f.write(report(eager_data, data, coeffs, (args.eager, args.results)))
        print("wrote", args.report)
    if args.step_report:
        replay_path = args.replay_points or args.results
        replay_data = _load(replay_path) if replay_path else None
        text = step_report(
            args.step,
            runs,
            replay_data,
            eager_data,
            coeffs,
            per_context,
            {"replay": replay_path, "eager": args.eager},
        )
        for placeholder, heading in KEPT_SECTIONS:
            kept = _kept_section(args.step_report, heading) or f"{heading}\n\nNone written."
            text = text.replace(f"\n{placeholder}\n", f"\n{kept}\n", 1)
        with open(args.step_report, "w") as f:
            f.write(text)
        print("wrote", args.step_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
