"""Fitting the adaptive policy's cost model (``sglang_mixgraph.core.split_cost_model``) to timings.

The server only evaluates the model; fitting happens here, offline, from measured
``(shape, unsplit_ms, split_ms)`` samples: per compress ratio, non-negative least squares on the
model's linear features with each equation divided by its measured time (relative error). Used by
benchmark/fit_split_cost.py (in-server timings) and benchmark/mixed_split_kernel.py (kernel
timings); tested in test/core/test_split_cost_model.py.

The eager regime's terms (``fit_eager_terms``) come on top of fitted GPU coefficients, from eager
in-server timings: per ratio, the host time per layer call of each path (a median: the timings
show no trend with the counts, only noise) and ``kappa``, the share of that host time the wall
adds to the GPU model (relative least squares through the origin).

The step terms (``fit_step_terms``: ``STEP_NAMES`` of the model) come from whole-step timings,
the host time of the server's own plan functions within each replayed step that
benchmark/mixed_steady_state.py records (``kits.host_timers``); see that function for how each
term maps to the measured parts.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable

import torch

from sglang_mixgraph.core.split_cost_model import (
    COEFF_NAMES,
    KNOWN_ARCH_MARGIN,
    STEP_NAMES,
    Coefficients,
    StepShape,
    features,
    predict,
)

# (shape, unsplit host ms, split host ms, unsplit wall ms, split wall ms) of one eager point;
# the split pair is ignored where the shape has no decode rows.
EagerSample = tuple[StepShape, float, float | None, float, float | None]


def _nnls(a: torch.Tensor, b: torch.Tensor, iters: int = 50) -> torch.Tensor:
    """Non-negative least squares by an active-set loop over ``torch.linalg.lstsq`` (float64)."""
    n = a.shape[1]
    free = torch.ones(n, dtype=torch.bool)
    x = torch.zeros(n, dtype=torch.float64)
    for _ in range(iters):
        x = torch.zeros(n, dtype=torch.float64)
        if free.any():
            sol = torch.linalg.lstsq(a[:, free], b.unsqueeze(1)).solution.squeeze(1)
            x[free] = sol
        neg = x < 0
        if not neg.any():
            # KKT check: a dropped variable whose gradient says it would help comes back.
            grad = a.T @ (b - a @ x)
            back = (~free) & (grad > 1e-12 * (b.abs().sum() + 1))
            if not back.any():
                break
            free |= back
            continue
        free &= ~neg
    return x.clamp_min(0)


def fit_coefficients(
    samples: Iterable[tuple[StepShape, float, float]],
    arch: str,
    margin: float = KNOWN_ARCH_MARGIN,
    source: str = "",
) -> Coefficients:
    """Fit per-ratio coefficients from measured ``(shape, unsplit_ms, split_ms)`` samples.

    Minimizes relative squared error (each equation divided by its measured time) with all
    coefficients non-negative.
    """
    by_ratio: dict[int, list[tuple[list[float], float]]] = {}
    for shape, unsplit_ms, split_ms in samples:
        fu, fs = features(shape)
        rows = by_ratio.setdefault(shape.ratio, [])
        if unsplit_ms is not None and math.isfinite(unsplit_ms) and unsplit_ms > 0:
            rows.append((fu, unsplit_ms))
        if (
            shape.num_decode > 0
            and split_ms is not None
            and math.isfinite(split_ms)
            and split_ms > 0
        ):
            rows.append((fs, split_ms))
    per_ratio = {}
    for ratio, rows in by_ratio.items():
        a = torch.tensor([r[0] for r in rows], dtype=torch.float64)
        y = torch.tensor([r[1] for r in rows], dtype=torch.float64)
        w = 1.0 / y
        # Column scaling keeps the solve well conditioned (counts span 1 .. 1e7).
        scale = a.abs().amax(dim=0).clamp_min(1.0)
        x = _nnls(a / scale * w[:, None], y * w) / scale
        per_ratio[ratio] = {k: float(v) for k, v in zip(COEFF_NAMES, x.tolist(), strict=False)}
    return Coefficients(arch=arch, per_ratio=per_ratio, margin=margin, source=source)


def relative_errors(
    samples: Iterable[tuple[StepShape, float, float]], coeffs: Coefficients
) -> list[tuple[float, float]]:
    """Per sample ``(unsplit_rel_err, split_rel_err)`` of the model (NaN where not measured)."""
    out = []
    for shape, u, s in samples:
        pu, ps = predict(shape, coeffs)
        eu = (pu - u) / u if u else float("nan")
        es = (ps - s) / s if (s and shape.num_decode) else float("nan")
        out.append((eu, es))
    return out


def _ok(x) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def fit_eager_terms(
    samples: Iterable[EagerSample], coeffs: Coefficients, source: str = ""
) -> Coefficients:
    """``coeffs`` with eager terms (``EAGER_NAMES``) fitted per ratio from eager timings.

    Host times are medians per path: unsplit; split with prefill rows; split of decode rows
    only (when no such sample exists, the split-with-prefill median, the larger and so the
    safer). ``kappa`` minimizes the relative error of ``wall = G + kappa * H`` over both paths,
    with ``G`` the GPU model of ``coeffs`` and ``H`` the fitted host time, clamped to [0, 1]
    (the GPU cannot wait longer than the host works).
    """
    by_ratio: dict[int, list[EagerSample]] = {}
    for sample in samples:
        by_ratio.setdefault(sample[0].ratio, []).append(sample)
    eager = {}
    for ratio, rows in by_ratio.items():
        host_u = [hu for _, hu, _, _, _ in rows if _ok(hu)]
        host_s = [hs for s, _, hs, _, _ in rows if s.num_decode and s.prefill_rows and _ok(hs)]
        host_d = [hs for s, _, hs, _, _ in rows if s.num_decode and not s.prefill_rows and _ok(hs)]
        if not host_u or not host_s:
            raise ValueError(f"ratio {ratio}: no unsplit or split host times to fit")
        terms = {
            "host_unsplit": statistics.median(host_u),
            "host_split": statistics.median(host_s),
        }
        terms["host_split_decode_only"] = (
            statistics.median(host_d) if host_d else terms["host_split"]
        )
        num = den = 0.0
        for shape, _, _, wall_u, wall_s in rows:
            gpu_u, gpu_s = predict(shape, coeffs)
            host_split = (
                terms["host_split"] if shape.prefill_rows else terms["host_split_decode_only"]
            )
            pairs = [(terms["host_unsplit"], gpu_u, wall_u)]
            if shape.num_decode:
                pairs.append((host_split, gpu_s, wall_s))
            for h, g, w in pairs:
                if _ok(w):
                    num += h * (w - g) / (w * w)
                    den += h * h / (w * w)
        terms["kappa"] = min(1.0, max(0.0, num / den)) if den else 1.0
        eager[ratio] = terms
    return dataclasses.replace(coeffs, eager=eager, eager_source=source)


# --------------------------------------------------------------------------------------------
# step terms, from benchmark/mixed_steady_state.py's results
# --------------------------------------------------------------------------------------------

PATCH_ARMS = ("adaptive", "always")


def _arm_steps(arm: dict) -> list[dict]:
    """Per-step ``{phase: {part: ms}}`` of one arm: the per-step records where the run kept them
    (``host_parts_samples``), else the arm's medians as one step (``host_parts_ms``)."""
    steps = arm.get("host_parts_samples")
    if steps:
        return steps
    parts = arm.get("host_parts_ms")
    return [parts] if parts else []


def step_term_samples(runs: Iterable[dict]) -> dict[str, list[tuple[int, float]]]:
    """``{term: [(context, ms), ...]}`` of every step term measured in ``runs`` (results of
    benchmark/mixed_steady_state.py), one value per arm, context and run.

    How each term maps to the measured host parts (``kits.host_timers.SPLIT_PLAN_PARTS``; a part
    a step did not call is 0 and is skipped):

    * ``cache_build_ms``: the backend's chunk-cache builder, either kind, as the model prices
      both with this one term: the split's prefill-only cache (``chunk_cache`` within the
      prepare of ``adaptive`` and ``always``) and upstream's cache over every request
      (``chunk_cache`` within ``off``'s replay, where upstream builds it in the first break).
    * ``split_plan_ms``: the plan's own work where it splits, ``plan - decision - chunk_cache``
      in the prepare of a patch arm that split (the decode tail's inputs ``tail_inputs``, the
      boundary and the plan's checks, the ``SplitPlan``). The checks before the decision are
      paid by ``adaptive`` either way; they are counted on the split's side, since the model's
      unsplit step is upstream's, where no check runs.
    * ``eval_ms``: ``decision`` (``_adaptive_splits``: the step's counts and ``decide_step``) in
      ``adaptive``'s prepare.

    Per arm the value is the median over its steps of the per-step figure (per-step records), or
    the figure of the arm's per-part medians where only those were recorded.
    """
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in STEP_NAMES}
    for run in runs:
        for point in run["points"]:
            ctx = int(point["context"])
            for name in ("off", *PATCH_ARMS):
                steps = _arm_steps(point.get(name) or {})
                if not steps:
                    continue
                builds, plans, evals = [], [], []
                for st in steps:
                    pre, rep = st.get("prepare", {}), st.get("replay", {})
                    if name == "off":
                        builds.append(rep.get("chunk_cache", 0.0))
                        continue
                    cache, dec, plan = (
                        pre.get(k, 0.0) for k in ("chunk_cache", "decision", "plan")
                    )
                    builds.append(cache)
                    if pre.get("tail_inputs", 0.0) > 0:  # the step was split
                        plans.append(plan - dec - cache)
                    evals.append(dec)
                for term, vals in (
                    ("cache_build_ms", builds),
                    ("split_plan_ms", plans),
                    ("eval_ms", evals),
                ):
                    vals = [v for v in vals if v > 0]
                    if vals:
                        out[term].append((ctx, statistics.median(vals)))
    return out


def fit_step_terms(runs: Iterable[dict]) -> tuple[dict[str, float], dict]:
    """The step terms (``STEP_NAMES``) fitted from benchmark/mixed_steady_state.py results: each
    the median of its values over every arm, context and run (``step_term_samples``: one value
    per arm; no trend with context is modelled, the terms are constants per step). Returns
    ``(terms, per_context)``, ``per_context[term][context]`` the median at that context alone,
    for the report."""
    samples = step_term_samples(runs)
    terms, per_context = {}, {}
    for term in STEP_NAMES:
        vals = samples[term]
        if not vals:
            raise ValueError(f"no measured values for {term} in the runs given")
        terms[term] = round(statistics.median(v for _, v in vals), 4)
        by_ctx: dict[int, list[float]] = {}
        for ctx, v in vals:
            by_ctx.setdefault(ctx, []).append(v)
        per_context[term] = {c: statistics.median(v) for c, v in sorted(by_ctx.items())}
    return terms, per_context
