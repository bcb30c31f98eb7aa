"""Figures measured on GPUs that advise's predictions borrow where the profile cannot show them.

Each is a (low, high) range with the record it comes from under docs/results/. A prediction
that uses one names it in its basis, so the user sees which part was measured on their server
and which was measured elsewhere. All come from an H200 running SGLang 0.5.23's Python code
with the kit's stand-in kernels (the pages list them); none from a served full install.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    low: float
    high: float
    source: str


# Host time of one replayed MIXED step (prepare plus the graph's launches) of DeepSeek-V4-Pro's
# 61 attention layers: 30.6 ms (`bcg-auto`, commit 4b9259c), 33 ms with the capture width cut
# to the live context, 54 ms at the default width. Per layer, so another layer count scales.
# (With the live-width indexer a replay's host was 451 ms: its c4 indexers run eagerly.)
DSV4_REPLAY_HOST_PER_LAYER = Measured(
    30.6 / 61,
    54.0 / 61,
    "docs/results/rank_slice_h200.md, docs/results/mixed_step_targets_h200.md (H200 rank slice, "
    "61 layers: 30.6-54 ms)",
)

# GPU time of a replayed MIXED step over the same step run eagerly, beyond the bucket's padding:
# 1.00 with the capture width cut to the live context (773 against 705 ms is the padding's
# +9.6%), 1.25 at a width 3.6x the live context (963 against 773 ms: the c4 indexer's work
# grows with the width on upstream's torch logits path).
DSV4_REPLAY_GPU_FACTOR = Measured(
    1.0,
    963 / 773,
    "docs/results/rank_slice_h200.md (H200 rank slice: 773/705 ms with the capture width cut to "
    "the live context, padding only; 963/773 ms at 3.6x the live context)",
)

# Host added per split layer call over upstream's, with the GPU queue ahead: the decode tail
# called eagerly (`always`), and replayed from its CUDA graph (`always+tg`).
SPLIT_HOST_PER_LAYER_MS = Measured(
    0.131,
    0.131,
    "docs/results/split_tail_graphs_h200.md (run 2)",
)
TAIL_GRAPHS_HOST_PER_LAYER_MS = Measured(
    0.102,
    0.102,
    "docs/results/split_tail_graphs_h200.md (run 2)",
)
# GPU time the tail graphs add per split layer: +0.022 ms at 32 decode rows to +0.073 at 256.
TAIL_GRAPHS_GPU_PER_LAYER_MS = Measured(
    0.022,
    0.073,
    "docs/results/split_tail_graphs_h200.md (run 2)",
)

# The split cost model's own error: its predicted change (split minus unsplit) of one layer call
# against the measured change, as a share of the measured unsplit time, at the 90th percentile
# of the in-server points the sm90 calibration was fitted on (replay: GPU time with the queue
# ahead, 72 points; eager: the call's wall, 24 points). Recomputed by the tests.
SPLIT_MODEL_CHANGE_ERROR = {"replay": 0.044, "eager": 0.140}
SPLIT_MODEL_ERROR_SOURCE = (
    "docs/results/mixed_split_inserver_fit_h200.json (replay), "
    "docs/results/mixed_split_inserver_h200.json (eager): the sm90 calibration's change against "
    "the measured one, 90th percentile"
)
