"""Fitting the adaptive policy's cost model (``sglang_mixgraph.core.split_cost_model``) to timings.

The server only evaluates the model; fitting happens here, offline, from measured
``(shape, unsplit_ms, split_ms)`` samples: per compress ratio, non-negative least squares on the
model's linear features with each equation divided by its measured time (relative error). Used by
benchmark/fit_split_cost.py (in-server timings) and benchmark/mixed_split_kernel.py (kernel
timings); tested in test/core/test_split_cost_model.py.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Tuple

import torch

from sglang_mixgraph.core.split_cost_model import (
    COEFF_NAMES,
    KNOWN_ARCH_MARGIN,
    Coefficients,
    StepShape,
    features,
    predict,
)


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
    samples: Iterable[Tuple[StepShape, float, float]],
    arch: str,
    margin: float = KNOWN_ARCH_MARGIN,
    source: str = "",
) -> Coefficients:
    """Fit per-ratio coefficients from measured ``(shape, unsplit_ms, split_ms)`` samples.

    Minimizes relative squared error (each equation divided by its measured time) with all
    coefficients non-negative.
    """
    by_ratio: Dict[int, List[Tuple[List[float], float]]] = {}
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
    samples: Iterable[Tuple[StepShape, float, float]], coeffs: Coefficients
) -> List[Tuple[float, float]]:
    """Per sample ``(unsplit_rel_err, split_rel_err)`` of the model (NaN where not measured)."""
    out = []
    for shape, u, s in samples:
        pu, ps = predict(shape, coeffs)
        eu = (pu - u) / u if u else float("nan")
        es = (ps - s) / s if (s and shape.num_decode) else float("nan")
        out.append((eu, es))
    return out
