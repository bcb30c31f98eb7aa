"""The profiled steps of every rank grouped by kind (forward mode, eager or replayed).

Per kind the medians over its steps: host ms (the step span), GPU kernel ms (the sum of its
kernels), the wall (the longer of the host span and the GPU span), launches, decode rows and
the time in attention, workspace dequant, indexer and GEMMs; the longest context any of its
steps shows at least; and for replayed steps the CUDA-graph bucket and its padding. A bucket
is the smallest of the server's captured sizes that holds the step's rows, as
`BaseCudaGraphRunner._pad_to_bucket` picks it (sglang.srt.model_executor.runner); under
attention DP the ranks pad to the largest rank's rows, so it is a lower bound there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sglang_mixgraph.advise.server import ServerFacts
from sglang_mixgraph.advise.steps import Step, med
from sglang_mixgraph.core import prefill_buckets

MODES = ("MIXED", "EXTEND", "DECODE")
SHOWN_CLASSES = ("attention", "dequant", "indexer", "gemm")


def bucket_for(rows: int | None, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `rows` (None: unknown rows, or larger than every one):
    the patch's own `core.prefill_buckets.bucket_for`, for rows a trace may not tell."""
    return None if rows is None else prefill_buckets.bucket_for(rows, buckets)


def graph_buckets(step: Step, facts: ServerFacts) -> tuple[int, ...]:
    """The buckets of the graph a step of this mode replays: decode's for DECODE, else the
    prefill graph's (EXTEND and MIXED steps)."""
    graph = facts.decode_graph if step.mode == "DECODE" else facts.prefill_graph
    return graph.buckets


def padding_of(step: Step, facts: ServerFacts) -> tuple[int | None, int | None]:
    """(bucket, padding rows) of a step's rows in its graph's bucket list."""
    rows = step.label.rows
    bucket = bucket_for(rows, graph_buckets(step, facts))
    return bucket, None if bucket is None or rows is None else bucket - rows


@dataclass(frozen=True)
class KindRow:
    mode: str
    graph: str  # "replay" or "eager"
    steps: int
    ranks: int
    host_ms: float
    kernel_ms: float
    wall_ms: float
    launches: float
    graph_launches: float
    decode_rows: float | None
    prefill_rows: float | None
    longest_context_at_least: int | None
    bucket: float | None  # replayed steps only
    padding_rows: float | None
    class_ms: dict[str, float]
    bucket_is_lower_bound: bool

    @property
    def host_bound(self) -> bool:
        return self.host_ms > self.kernel_ms

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["bound"] = "host" if self.host_bound else "GPU"
        return out


def kind_rows(steps: list[Step], facts: ServerFacts) -> list[KindRow]:
    """One row per (mode, eager/replay) present, MIXED first, then EXTEND, DECODE, others."""
    groups: dict[tuple[str, str], list[Step]] = {}
    for s in steps:
        groups.setdefault((s.mode, "replay" if s.replayed else "eager"), []).append(s)

    def order(key):
        mode, graph = key
        return (MODES.index(mode) if mode in MODES else len(MODES), mode, graph)

    rows = []
    for (mode, graph), group in sorted(groups.items(), key=lambda kv: order(kv[0])):
        pads = [padding_of(s, facts) for s in group] if graph == "replay" else []
        contexts = [s.label.longest_context_at_least for s in group]
        rows.append(
            KindRow(
                mode=mode,
                graph=graph,
                steps=len(group),
                ranks=len({s.rank for s in group}),
                host_ms=med(s.host_ms for s in group),
                kernel_ms=med(s.kernel_ms for s in group),
                wall_ms=med(s.wall_ms for s in group),
                launches=med(s.launches for s in group),
                graph_launches=med(s.graph_launches for s in group),
                decode_rows=med(s.label.decode_rows for s in group),
                prefill_rows=med(s.label.prefill_rows for s in group),
                longest_context_at_least=max((c for c in contexts if c is not None), default=None),
                bucket=med(b for b, _ in pads),
                padding_rows=med(p for _, p in pads),
                class_ms={c: med(s.class_ms[c] for s in group) for c in SHOWN_CLASSES},
                bucket_is_lower_bound=facts.attn_dp_size > 1,
            )
        )
    return rows
