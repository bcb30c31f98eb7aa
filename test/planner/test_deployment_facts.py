"""deployment_facts: the facts the planner takes are what SGLang's own resolution decided.

Each deployment goes through SGLang's real resolution (`resolve`, a described B300); the facts
are compared with the resolved arguments SGLang reports (`ServerArgs.resolved_dict`) and with
upstream's rule table evaluated on the same arguments, not with numbers written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sglang_mixgraph
from sglang_mixgraph.bcg_rules import A2A_RULE, DSV4_RULE, matching_rules
from sglang_mixgraph.planner.deployment_facts import out_of_scope, read_deployment
from sglang_mixgraph.resolution.resolve import resolve
from sglang_mixgraph.target_gpu import described_gpu

DSV4 = str(Path(sglang_mixgraph.__file__).parent / "data" / "dsv4_pro")
DP_ATTENTION = ["--model-path", DSV4, "--tp", "8", "--dp", "8", "--enable-dp-attention"]
MIXED = ["--enable-mixed-chunk", "--chunked-prefill-size", str(2816 * 8)]


def facts_of(argv):
    resolution = resolve(argv, gpu="B300")
    with described_gpu("B300"):
        return read_deployment(resolution.server_args), resolution


def test_the_facts_are_what_sglang_resolved():
    facts, resolution = facts_of(
        [*DP_ATTENTION, *MIXED, "--max-running-requests", "2048", "--moe-a2a-backend", "megamoe"]
    )
    resolved = resolution.resolved
    assert facts.out_of_scope is None
    assert facts.deepseek_v4 and facts.mixed_chunk and facts.dp_attention
    # SGLang splits the chunk over the DP ranks; the fact is its per-rank value
    assert facts.chunk_per_rank == resolved["chunked_prefill_size"] == 2816
    assert facts.running_per_rank == resolved["max_running_requests"] // facts.attn_dp_size
    assert facts.page_size == resolved["page_size"]
    assert facts.mem_fraction_static == resolved["mem_fraction_static"]
    graphs = resolved["cuda_graph_config"]
    for phase, fact in (("prefill", facts.prefill_graph), ("decode", facts.decode_graph)):
        assert fact.backend == graphs[phase]["backend"]
        assert fact.buckets == tuple(graphs[phase]["bs"] or ())
        assert fact.max_bs == graphs[phase]["max_bs"]
        assert fact.user_set == frozenset()
    assert facts.mega_moe_cap is not None
    assert [r.name for r in facts.rules_holding] == [
        r.name for r in matching_rules(resolution.server_args)
    ]


def test_keys_the_user_set_are_facts_of_their_phase():
    facts, _ = facts_of([*DP_ATTENTION, *MIXED, "--cuda-graph-bs-prefill", "256", "512"])
    assert facts.prefill_graph.user_set == {"bs"}
    assert facts.prefill_graph.buckets == (256, 512)
    assert facts.decode_graph.user_set == frozenset()


def test_rules_that_hold_in_upstreams_order():
    facts, _ = facts_of([*DP_ATTENTION, "--moe-a2a-backend", "mori"])
    assert [r.name for r in facts.rules_holding] == [DSV4_RULE, A2A_RULE]
    assert all(r.reason for r in facts.rules_holding)


@pytest.mark.parametrize(
    "argv,why",
    [
        (DP_ATTENTION, "mixed chunked prefill is off"),
        ([*DP_ATTENTION, *MIXED], None),
    ],
)
def test_scope_is_mixed_chunk_on_a_sparse_mla_model(argv, why):
    facts, resolution = facts_of(argv)
    assert facts.out_of_scope == out_of_scope(resolution.server_args) == why


def test_the_facts_take_what_patches_declare_they_change_in_capture_memory(monkeypatch):
    """A patch tells the planner what it changes through its `Patch.capture_effects`: the facts
    read the union of what the patches declare in this process, and the model shape follows."""
    from sglang_mixgraph.core.capture_effects import CaptureEffect
    from sglang_mixgraph.patches import all_patches, live_width_indexer, mixed_split
    from sglang_mixgraph.planner.deployment_facts import capture_effects_of

    patches = all_patches()
    monkeypatch.setenv("SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER", "0")
    monkeypatch.setenv("SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN", "0")
    assert capture_effects_of(patches) == frozenset()
    monkeypatch.setenv("SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER", "1")
    monkeypatch.setenv("SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN", "1")
    monkeypatch.setenv("SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS", "1")
    monkeypatch.setenv("SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", "1")  # the indexer then stays out
    assert capture_effects_of(patches) == {CaptureEffect.DECODE_TAIL_GRAPHS}
    monkeypatch.setenv("SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", "0")
    assert capture_effects_of(patches) == set(CaptureEffect)
    declaring = {p.id for p in patches if p.capture_effects is not None}
    assert declaring == {live_width_indexer.PATCH.id, mixed_split.PATCH.id}

    resolution = resolve([*DP_ATTENTION, *MIXED], gpu="B300")
    with described_gpu("B300"):
        plain = read_deployment(resolution.server_args).shape.sparse
        both = read_deployment(
            resolution.server_args, capture_effects=frozenset(CaptureEffect)
        ).shape.sparse
    assert (plain.logits_eager, plain.decode_tail_heads) == (False, 0)
    assert both.logits_eager and both.decode_tail_heads > 0


def test_an_fp8_checkpoint_of_128_blocks_is_a_fact_of_the_model_not_of_the_environment(tmp_path):
    """The reference checkpoint (FP8, 128x128 blocks) is one; a copy without its quantization
    config is not (what SGLang's FP8 wo_a GEMM needs, `models.deepseek_v4.wo_a_fp8_gemm_enabled`)."""
    import json
    import shutil

    assert facts_of([*DP_ATTENTION, *MIXED])[0].fp8_block_checkpoint
    bf16 = tmp_path / "bf16"
    shutil.copytree(DSV4, bf16)
    config = json.loads((bf16 / "config.json").read_text())
    del config["quantization_config"]
    (bf16 / "config.json").write_text(json.dumps(config))
    argv = ["--model-path", str(bf16), *DP_ATTENTION[2:], *MIXED]
    assert not facts_of(argv)[0].fp8_block_checkpoint
