"""advise prices a replay in the prefill buckets `SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto` would
capture (advise/auto_buckets.py): the same list the patch resolves for the same launch, the one
an H100 server logged, and the server's own list where `auto` would keep it."""

from __future__ import annotations

import dataclasses

import pytest
from advise_standin import recorded_server_info
from make_traces import reference_argv

from sglang_mixgraph.advise.auto_buckets import auto_prefill_buckets, unhandled
from sglang_mixgraph.advise.server import PhaseGraph, ServerFacts

DSV4 = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
GLM5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}


def facts(model_info=DSV4, **changes) -> ServerFacts:
    read = ServerFacts.read("http://x", recorded_server_info(), model_info)
    return dataclasses.replace(read, **changes)


def test_the_list_is_the_one_the_patch_resolves_for_the_same_launch(plan_env):
    """The recorded `/server_info` is SGLang's resolution without the patch; resolving the same
    arguments with `auto` gives one of the two lists advise derives from that `/server_info`
    (on two H200s the one without the band: its capture estimate does not fit)."""
    from sglang_mixgraph.resolution.presets import DSV4_PRO
    from sglang_mixgraph.resolution.resolve import resolve, select_described_platform

    select_described_platform("H200")
    for key, value in DSV4_PRO.env.items():
        plan_env.setenv(key, value)
    plan_env.setenv("SGLANG_MIXGRAPH_PREFILL_BUCKETS", "auto")
    patched = resolve(reference_argv(), "H200").resolved["cuda_graph_config"]["prefill"]["bs"]
    f = facts()
    auto = auto_prefill_buckets(f)
    assert tuple(patched) in (auto.banded, auto.narrow) and auto.banded != auto.narrow
    assert set(auto.banded) - set(auto.narrow) == set(range(2592, 2816, 32))
    assert tuple(patched) != f.prefill_graph.buckets  # upstream's 53 generic buckets


def test_the_list_an_h100_server_logged_for_chunk_1280():
    """The FP8 slice's `bcg-auto-lean` server (H100, 2026-12-07) logged its derived buckets."""
    one_rank = facts(tp_size=1, attn_dp_size=1, chunked_prefill_size=1280, max_running_requests=256)
    logged = (16, 24, 40, 80, 160, 256, 320, 640, 1056, 1088, 1120, 1152, 1184, 1216, 1248, 1280)
    assert auto_prefill_buckets(one_rank).banded == logged
    # GLM-5: no band below the chunk (the patch keeps it for DeepSeek-V4 only)
    glm5 = dataclasses.replace(one_rank, architectures=tuple(GLM5["architectures"]))
    narrow = (16, 24, 40, 80, 160, 256, 320, 640, 1280)
    assert auto_prefill_buckets(glm5) == auto_prefill_buckets(glm5).__class__(narrow, narrow)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"prefill_buckets_user_set": True}, "set on the command line"),
        ({"speculative_algorithm": "EAGLE"}, "speculative decoding"),
        ({"pp_size": 2}, "pipeline parallelism"),
        ({"context_parallel": True}, "context parallelism"),
        ({"chunked_prefill_size": None}, "chunked prefill"),
        ({"prefill_graph": PhaseGraph("full", (512, 2816))}, "prefill graph backend 'full'"),
    ],
)
def test_where_auto_keeps_the_servers_list_advise_prices_that_list(change, why):
    f = facts(**change)
    assert why in unhandled(f) and auto_prefill_buckets(f) is None


def test_the_user_set_buckets_are_read_from_the_server_arguments():
    info = dict(recorded_server_info(), cuda_graph_bs_prefill=[512, 2816])
    assert ServerFacts.read("http://x", info, DSV4).prefill_buckets_user_set
    info = dict(recorded_server_info(), cuda_graph_max_bs_prefill=2816)
    assert ServerFacts.read("http://x", info, DSV4).prefill_buckets_user_set
    assert not facts().prefill_buckets_user_set
    assert facts().page_size == 256 and facts().max_running_requests == 512
