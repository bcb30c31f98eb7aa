"""The mixed split's own cost model applied to the profiled MIXED steps.

Per step: the host counts `adaptive` decides on (core.mixed_step_counts.StepCounts), built from
the step label's aggregates (the prefill requests' rows and KV lengths, the decode rows and
their summed KV length; each group taken as uniform at its mean, since the trace holds sums),
the model's layers per compress ratio from its config.json, and the calibration
`load_coefficients` picks for the GPU the trace names (what `plan` and `doctor` report). An eager
step is priced in the eager regime (host exposed, a wall model) and a replayed one in the replay
regime (GPU time), as the patch decides them (`decide_step`). A replayed step's wall change adds
the split's host per layer call (evidence) to its host and the model's change to its GPU time;
the model's own error (evidence) widens that change into a (low, high) range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sglang_mixgraph.advise.evidence import SPLIT_HOST_PER_LAYER_MS, SPLIT_MODEL_CHANGE_ERROR
from sglang_mixgraph.advise.steps import Step, StepLabel
from sglang_mixgraph.core import split_cost_model as scm


@dataclass(frozen=True)
class ModelLayers:
    """What the cost model reads of a DeepSeek-V4 config.json."""

    layers: dict[int, int]  # {compress ratio: layers}
    index_topk: int
    swa: int
    source: str

    @property
    def count(self) -> int:
        return sum(self.layers.values())


def read_model_layers(path: str) -> ModelLayers:
    """The layer mix of the config.json at `path` (a model directory or the file itself);
    OSError or ValueError when it cannot be read or has no `compress_ratios`."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    config = json.loads(file.read_text())
    text = config.get("text_config") or config
    ratios = text.get("compress_ratios")
    if not isinstance(ratios, list) or not ratios:
        raise ValueError(f"{file} has no compress_ratios")
    layers = int(text.get("num_hidden_layers") or len(ratios))
    return ModelLayers(
        layers=scm.layer_mix(ratios[:layers]),
        index_topk=int(text.get("index_topk") or scm.C4_TOPK),
        swa=int(text.get("sliding_window") or 128),
        source=str(file),
    )


def _spread(total: int, n: int) -> list[int]:
    """`total` split into `n` near-equal integers (the remainder on the first ones)."""
    q, r = divmod(total, n)
    return [q + (i < r) for i in range(n)]


def step_counts(label: StepLabel, model: ModelLayers) -> scm.StepCounts | None:
    """The counts of a MIXED step from its label (None without the annotations)."""
    f = label.fields
    c, g = label.prefill_requests, label.decode_rows
    if c is None or g is None or not {"c_sq", "c_sk", "g_sk"} <= set(f):
        return None
    exts = _spread(f["c_sq"], c) if c else []
    seqs = [max(s, e) for s, e in zip(_spread(f["c_sk"], c), exts, strict=True)] if c else []
    if g:
        seqs += [max(1, round(f["g_sk"] / g))] * g
        exts += [1] * g
    return scm.StepCounts.from_lists(seqs, exts, g, topk=model.index_topk, swa=model.swa)


@dataclass(frozen=True)
class StepPrice:
    """One MIXED step both ways and what `adaptive` would do with it."""

    regime: str
    unsplit_ms: float
    split_ms: float
    eval_ms: float
    splits: bool
    wall_delta_ms: float  # the step's wall with `adaptive` minus without the patch
    wall_low_ms: float  # the same with the model's change at the low end of its error
    wall_high_ms: float


def price_step(step: Step, model: ModelLayers, coeffs: scm.Coefficients) -> StepPrice | None:
    counts = step_counts(step.label, model)
    if counts is None:
        return None
    regime = scm.REPLAY if step.replayed else scm.EAGER
    p = scm.predict_step(counts, model.layers, coeffs, regime=regime)
    splits = scm.decide_step(counts, model.layers, coeffs, regime=regime)
    model_delta = p.adaptive_ms(splits) - p.unsplit_ms
    error = SPLIT_MODEL_CHANGE_ERROR[regime] * p.unsplit_ms if splits else 0.0

    def wall(change: float) -> float:
        if regime == scm.EAGER:
            return change  # the eager model prices the layer calls' wall, host included
        host_extra = SPLIT_HOST_PER_LAYER_MS.high * model.count if splits else 0.0
        before = max(step.host_ms, step.kernel_ms)
        return max(step.host_ms + host_extra, step.kernel_ms + change) - before

    return StepPrice(
        regime,
        p.unsplit_ms,
        p.split_ms,
        p.eval_ms,
        splits,
        wall(model_delta),
        wall(model_delta - error),
        wall(model_delta + error),
    )
