"""The steps grouped by kind (advise/summary.py): medians per kind, the bucket a replayed step
padded to and its padding, what stays unknown, and the attention-DP lower bound."""

from __future__ import annotations

import dataclasses

import pytest
from advise_standin import recorded_server_info
from make_traces import TRACES

from sglang_mixgraph.advise.server import ServerFacts
from sglang_mixgraph.advise.steps import read_steps
from sglang_mixgraph.advise.summary import bucket_for, kind_rows, padding_of
from sglang_mixgraph.core.kernel_classes import read_trace

MODEL_INFO = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}


def facts(**changes) -> ServerFacts:
    f = ServerFacts.read("http://x", recorded_server_info(), MODEL_INFO)
    return dataclasses.replace(f, **changes)


def steps_of(scenario: str):
    paths = sorted((TRACES / scenario).glob("*.trace.json.gz"))
    return [s for p in paths for s in read_steps(read_trace(str(p)), p.name).steps]


@pytest.mark.parametrize(
    "rows, buckets, bucket",
    [
        (23, (1, 2, 4, 8, 16, 24, 32), 24),
        (24, (32, 24, 16), 24),  # exact fit, any order
        (33, (8, 16, 32), None),  # larger than every bucket: no replay
        (None, (8, 16), None),  # rows unknown
        (5, (), None),
    ],
)
def test_a_step_pads_to_the_smallest_bucket_that_holds_it(rows, buckets, bucket):
    assert bucket_for(rows, buckets) == bucket


def test_decode_and_prefill_steps_pad_in_their_own_graphs_list():
    f = facts()
    decode, *_ = [s for s in steps_of("dsv4_eager_h200") if s.mode == "DECODE"]
    assert decode.label.rows == 23 and padding_of(decode, f) == (24, 1)
    mixed = next(s for s in steps_of("dsv4_eager_h200") if s.mode == "MIXED")
    # 2584 rows in the server's prefill list (upstream's: ... 2560, 2816, ...)
    assert padding_of(mixed, f) == (2816, 232)


def test_kinds_are_rowed_mixed_first_with_their_medians():
    rows = kind_rows(steps_of("dsv4_eager_h200"), facts())
    assert [(r.mode, r.graph, r.steps, r.ranks) for r in rows] == [
        ("MIXED", "eager", 6, 2),
        ("EXTEND", "eager", 2, 2),
        ("DECODE", "replay", 8, 2),
    ]
    mixed, _, decode = rows
    assert (mixed.host_ms, mixed.kernel_ms, mixed.launches) == (212.0, 140.0, 6)
    assert mixed.host_bound and mixed.to_json()["bound"] == "host"
    assert mixed.class_ms == pytest.approx(
        {"attention": 30.0, "dequant": 12.0, "indexer": 8.0, "gemm": 50.0}
    )
    assert (mixed.decode_rows, mixed.longest_context_at_least) == (24, 4608)
    assert mixed.bucket is None and mixed.padding_rows is None  # eager: no bucket
    # one step of 23 rows among eight: median bucket 24, median padding 0
    assert (decode.bucket, decode.padding_rows, decode.graph_launches) == (24, 0, 1)
    assert not decode.host_bound and decode.bucket_is_lower_bound  # attention DP 2


def test_without_attention_dp_the_bucket_is_exact():
    (row,) = kind_rows(steps_of("dsv4_replay_h200"), facts(attn_dp_size=1))
    assert (row.mode, row.graph, row.bucket, row.padding_rows) == ("MIXED", "replay", 2816, 0)
    assert not row.bucket_is_lower_bound


def test_without_annotations_rows_and_contexts_stay_unknown():
    from sglang_mixgraph.kits.profiler_trace import TraceBuilder

    b = TraceBuilder()
    b.annotation("step[MIXED bs=12]", 0, 100)
    b.launch(10, [("a", 20, 5), ("b", 25, 5)], call="cudaGraphLaunch")
    (row,) = kind_rows(read_steps(b.document(), "TP-0").steps, facts())
    assert row.graph == "replay" and row.decode_rows is None
    assert row.bucket is None and row.padding_rows is None and row.longest_context_at_least is None
