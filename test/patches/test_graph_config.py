"""Forced BCG and the graph configuration through SGLang's real server-argument resolution, for a table of deployments.

The graph_config patch is always installed here and reads SGLANG_MIXGRAPH_PREFILL_BUCKETS when
its hooks run, so the table runs in this process with the flag set per row (``auto`` unless a
test says otherwise: the patch is off by default). The upstream
baseline (no mixgraph plugin at all) and SGLANG_EXPERIMENTAL_FORCE_BCG (its hook is only
installed when the flag is on at load) run in subprocesses.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sglang_mixgraph
from sglang_mixgraph.core.prefill_buckets import padding_profile, replays
from sglang_mixgraph.kits.model_configs import write_model
from sglang_mixgraph.resolution.resolve import resolve

DSV4 = str(Path(sglang_mixgraph.__file__).parent / "data" / "dsv4_pro")
CAP_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"
BUCKETS_ENV = "SGLANG_MIXGRAPH_PREFILL_BUCKETS"
FORCE_ENV = "SGLANG_EXPERIMENTAL_FORCE_BCG"
DSV4_RULE = "DeepSeek-V4 (heavy capture-pool memory pressure)"


def dsv4_dp(tp=8, dp=8):
    """DeepSeek-V4 on `tp` GPUs with attention DP over `dp` ranks."""
    return ["--model-path", DSV4, "--tp", str(tp), "--dp", str(dp), "--enable-dp-attention"]


def reference(chunk_per_rank=2816, tp=8, dp=8, extra=()):
    return [
        *dsv4_dp(tp, dp),
        "--enable-mixed-chunk",
        "--chunked-prefill-size",
        str(chunk_per_rank * dp),
        "--max-running-requests",
        "2048",
        "--moe-a2a-backend",
        "megamoe",
        *extra,
    ]


def dsv4_mixed(chunk, *extra):
    """DeepSeek-V4 on 8 GPUs without attention DP, mixed chunk, `chunk`-token prefill chunks."""
    return [
        "--model-path",
        DSV4,
        "--tp",
        "8",
        "--enable-mixed-chunk",
        "--chunked-prefill-size",
        str(chunk),
        *extra,
    ]


def as_json(resolved):
    """A resolution's server arguments as JSON has them (what the baseline scripts print)."""
    return json.loads(json.dumps(resolved, default=str))


# DeepSeek-V4 with an MoE all-to-all backend upstream has not validated under BCG: two rules hold.
TWO_RULES = [*dsv4_dp(), "--moe-a2a-backend", "mori"]

GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 6144,
    "num_hidden_layers": 78,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 2048,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 192,
    "qk_head_dim": 256,
    "v_head_dim": 256,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "intermediate_size": 12288,
    "first_k_dense_replace": 3,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "rope_theta": 1000000,
    "torch_dtype": "bfloat16",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-5,
}


# A small Kimi-Linear-shaped model (SGLang's own `configs.kimi_linear` config class): KDA
# hybrid linear attention, so upstream's KDA rule holds.
KDA_CONFIG = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "hidden_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 128,
    "intermediate_size": 4096,
    "vocab_size": 32000,
    "torch_dtype": "bfloat16",
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "num_experts": 16,
    "num_experts_per_token": 2,
    "moe_intermediate_size": 512,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3],
        "full_attn_layers": [4],
        "head_dim": 128,
        "num_heads": 16,
        "short_conv_kernel_size": 4,
    },
    "max_position_embeddings": 8192,
}

# A small Qwen2-VL-shaped model: multimodal and not on upstream's BCG allowlist.
QWEN2VL_CONFIG = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "model_type": "qwen2_vl",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 4,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "depth": 2,
        "embed_dim": 256,
        "hidden_size": 1536,
        "num_heads": 4,
        "in_chans": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "image_token_id": 151655,
    "video_token_id": 151656,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "glm5": str(write_model(root / "glm5", GLM5_CONFIG)),
        "dense": str(write_model(root / "dense", max_position_embeddings=8192)),
        "kda": str(write_model(root / "kda", KDA_CONFIG)),
        "qwen2vl": str(write_model(root / "qwen2vl", QWEN2VL_CONFIG)),
    }


@pytest.fixture
def flags(monkeypatch):
    monkeypatch.delenv(FORCE_ENV, raising=False)
    monkeypatch.setenv(BUCKETS_ENV, "auto")
    monkeypatch.setenv(CAP_ENV, "2816")

    def set_(**env):
        for k, v in env.items():
            if v is None:
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, str(v))

    return set_


def plan_of(argv, gpu="B300"):
    """The resolution and the graph part of `plan --json` for it."""
    from sglang_mixgraph.resolution.plan_format import graph_plan_json
    from sglang_mixgraph.resolution.resolve import graph_plan_of

    r = resolve(argv, gpu=gpu)
    d = graph_plan_json(graph_plan_of(r))
    json.dumps(d)  # the plan is JSON-serialisable
    return r, d


def assert_bucket_properties(d, chunk, cap, running=None, max_count=12):
    buckets = d["prefill_graph"]["buckets"]
    assert chunk in buckets, (chunk, buckets)
    assert max(buckets) == chunk
    if cap is not None:
        assert max(buckets) <= cap
    assert len(buckets) <= max_count
    prof = padding_profile(buckets, lo=16, hi=chunk)
    assert prof.eager_sizes == 0 and prof.worst_factor <= 2.0
    if running is not None and running <= chunk:
        assert replays(running, buckets)
    upstream = d["bucket_lists"]["upstream"]
    assert len(buckets) < upstream["count"]


# ---------------------------------------------------------------- DSV4 table

DSV4_ROWS = [
    # id, argv kwargs, cap, per-rank chunk, running per rank
    ("reference", dict(), 2816, 2816, 256),
    ("chunk-2048", dict(chunk_per_rank=2048), 2048, 2048, 256),
    ("chunk-8192", dict(chunk_per_rank=8192), 8192, 8192, 256),
    ("chunk-16384", dict(chunk_per_rank=16384), 16384, 16384, 256),
    ("tp4-dp4", dict(tp=4, dp=4), 2816, 2816, 512),
    ("max-running-512", dict(extra=("--max-running-requests", "512")), 2816, 2816, 64),
]


@pytest.mark.parametrize("row", DSV4_ROWS, ids=[r[0] for r in DSV4_ROWS])
def test_dsv4_table(flags, row):
    name, kw, cap, chunk, running = row
    flags(**{CAP_ENV: cap})
    r, d = plan_of(reference(**kw))
    pg = d["prefill_graph"]
    assert d["deployment"]["chunked_prefill_per_rank"] == chunk
    assert d["deployment"]["running_per_rank"] == running
    assert pg["backend"] == "breakable"
    assert pg["decided_by"]["kind"] == "estimate"
    assert pg["rules"][0]["name"] == DSV4_RULE and "fits" in pg["rules"][0]["action"]
    assert d["capture_memory"]["verdict"]["fits"] is True
    assert d["bucket_lists"]["policy"] == "auto"
    assert_bucket_properties(d, chunk, cap, running)
    assert r.resolved["cuda_graph_config"]["prefill"]["bs"] == pg["buckets"]
    assert d["bucket_lists"]["ours"]["buckets"] == pg["buckets"]  # plan shows what was applied
    assert d["ok"] and all(v["ok"] for v in d["validations"])
    # upstream's generic list for the same chunk would not fit the same budget
    assert d["bucket_lists"]["upstream"]["capture_fits"] is False


def test_reference_without_dp_attention(flags):
    flags(**{CAP_ENV: 8192})
    argv = dsv4_mixed(8192, "--max-running-requests", "2048", "--moe-a2a-backend", "megamoe")
    _, d = plan_of(argv)
    assert d["deployment"]["dp_attention"] is False
    assert d["deployment"]["running_per_rank"] == 2048
    buckets = d["prefill_graph"]["buckets"]
    assert all(b % 8 == 0 for b in buckets)  # attention TP 8: captured sizes are multiples of 8
    assert_bucket_properties(d, 8192, 8192, 2048)


def test_megamoe_off_has_no_cap_check(flags):
    argv = reference(extra=())
    argv[argv.index("megamoe")] = "none"
    _, d = plan_of(argv)
    assert d["deployment"]["mega_moe_cap_per_rank"] is None
    assert all(v["name"] != "mega_moe_cap_covers_prefill_buckets" for v in d["validations"])
    assert_bucket_properties(d, 2816, None, 256)


def test_reference_plan_contents(flags):
    """What `plan --json` shows for the reference deployment."""
    _, d = plan_of(reference())
    cm = d["capture_memory"]
    assert cm["verdict"]["needed_bytes"] == cm["estimate"]["bytes"] > 0
    assert (
        cm["verdict"]["available_bytes"]
        == cm["budget"]["available_bytes"]
        > cm["verdict"]["needed_bytes"]
    )
    assert set(cm["estimate"]["terms"]) >= {
        "dsv4_indexer_logits",
        "dsv4_captured_metadata",
        "graph_objects",
    }
    bl = d["bucket_lists"]
    assert bl["upstream"]["count"] == 45 and bl["upstream"]["largest"] == 2816
    assert bl["ours"]["buckets"] == [16, 24, 48, 88, 176, 256, 352, 704, 1408, 2816]
    assert bl["ours"]["capture_bytes"] < bl["upstream"]["capture_bytes"]
    names = {v["name"] for v in d["validations"]}
    assert names == {
        "mega_moe_cap_covers_prefill_buckets",
        "logits_multimem_gather_covers_mixed_steps",
    }
    logits = next(v for v in d["validations"] if v["name"].startswith("logits"))
    assert logits["rows"] == 8 * 257 and logits["upstream_rows"] == 2048
    from sglang_mixgraph.resolution.plan_format import format_graph_plan
    from sglang_mixgraph.resolution.resolve import graph_plan_of

    text = format_graph_plan(graph_plan_of(resolve(reference(), gpu="B300")))
    assert (
        "decided by estimate" in text
        and "upstream: 45 buckets" in text
        and "derived : 10 buckets" in text
    )


def test_live_width_indexer_takes_the_logits_out_of_the_estimate(flags):
    """With the patch acting, the indexer's logits are eager: neither logits term is counted;
    with upstream's stream overlap on the patch falls back, so the estimate keeps them."""
    flags(SGLANG_FP8_PAGED_MQA_LOGITS_TORCH="1")
    base = plan_of(reference())[1]["capture_memory"]["estimate"]
    flags(SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER="1", SGLANG_OPT_USE_MULTI_STREAM_OVERLAP="1")
    assert plan_of(reference())[1]["capture_memory"]["estimate"] == base
    flags(SGLANG_OPT_USE_MULTI_STREAM_OVERLAP="0")
    eager = plan_of(reference())[1]["capture_memory"]["estimate"]
    assert eager["terms"]["dsv4_indexer_logits"] == 0 < base["terms"]["dsv4_indexer_logits"]
    # the pool keeps the largest bucket's activations alone, not its per-head logits at 1M
    assert eager["terms"]["graph_pool_activations"] == 2816 * int(1.5 * (1 << 20))
    assert base["terms"]["graph_pool_activations"] > 300 * eager["terms"]["graph_pool_activations"]
    # at the reference's 1M width only the estimate without the logits fits the mixed band
    assert (base["buckets"], eager["buckets"]) == (10, 17)


def test_the_split_decode_tail_graphs_are_counted_in_the_estimate(flags):
    """With the split's decode-tail graphs on, their buffers and pool are a term of the
    estimate: the decode kernel's 128 heads (one attention-TP rank), the reference's 1M
    capture width for the c128 indices."""
    from sglang_mixgraph.core.decode_tail_graphs import tail_graph_bytes

    base = plan_of(reference())[1]["capture_memory"]["estimate"]
    assert "dsv4_decode_tail_graphs" not in base["terms"]
    flags(SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN="1", SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS="1")
    on = plan_of(reference())[1]["capture_memory"]["estimate"]
    widths = {0: (128, 0), 4: (128, 1024), 128: (128, (1 << 20) // 128)}
    assert on["terms"]["dsv4_decode_tail_graphs"] == tail_graph_bytes(128, widths)
    assert on["terms"] == {
        **base["terms"],
        "dsv4_decode_tail_graphs": tail_graph_bytes(128, widths),
    }
    flags(SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN="0")  # the graphs come with the split only
    assert plan_of(reference())[1]["capture_memory"]["estimate"] == base


BAND = [2592, 2624, 2656, 2688, 2720, 2752, 2784]  # 256-token pages: mixed steps 2561..2816


def test_mixed_band_where_its_capture_fits(flags):
    """DeepSeek-V4 ends chunks on 256-token pages, so mixed steps are 2561..2816 tokens: with a
    context width whose capture fits, the band buckets are applied, and plan shows them."""
    r, d = plan_of(reference(extra=("--context-length", "8192")))
    pg = d["prefill_graph"]
    assert pg["buckets"] == [16, 24, 48, 88, 176, 256, 352, 704, 1408, *BAND, 2816]
    assert r.resolved["cuda_graph_config"]["prefill"]["bs"] == pg["buckets"]
    assert d["bucket_lists"]["ours"]["buckets"] == pg["buckets"]
    assert d["capture_memory"]["verdict"]["fits"] is True
    said = [m for m in r.messages("sglang_mixgraph") if "buckets derived" in m]
    assert len(said) == 1 and "mixed-band" not in said[0]


def test_mixed_band_left_out_where_only_it_breaks_the_fit(flags):
    """At the reference's 1M context width each band bucket pins gigabytes of indexer logits:
    the list without the band fits and is applied, and the log says the band was left out."""
    r, d = plan_of(reference())
    pg = d["prefill_graph"]
    assert pg["backend"] == "breakable" and not set(BAND) & set(pg["buckets"])
    assert d["bucket_lists"]["ours"]["buckets"] == pg["buckets"]
    said = [m for m in r.messages("sglang_mixgraph") if "buckets derived" in m]
    assert len(said) == 1 and "without the 7 mixed-band buckets below 2816" in said[0]


def test_estimate_turns_bcg_off_with_numbers(flags, caplog):
    caplog.set_level(logging.INFO, logger="sglang_mixgraph")
    r, d = plan_of(reference(extra=("--mem-fraction-static", "0.9")), gpu="H200")
    pg = d["prefill_graph"]
    assert pg["backend"] == "disabled"
    assert pg["decided_by"]["kind"] == "estimate"
    assert "does not fit" in pg["rules"][0]["action"]
    msgs = [m for m in r.messages("sglang_mixgraph") if "disabled for DeepSeek-V4" in m]
    assert len(msgs) == 1
    assert (
        "GiB" in msgs[0]
        and "--mem-fraction-static" in msgs[0]
        and "--cuda-graph-bs-prefill" in msgs[0]
    )


def test_two_rules_keep_upstream(flags):
    """DSV4 plus another matching rule: the deferral does not apply."""
    _, d = plan_of(TWO_RULES)
    pg = d["prefill_graph"]
    assert pg["backend"] == "disabled"
    assert pg["decided_by"] == {
        "kind": "upstream rule",
        "rule": DSV4_RULE,
        "reason": pg["rules"][0]["reason"],
    }
    assert [m["name"] for m in pg["rules"]] == [DSV4_RULE, "unvalidated a2a backend"]


# ---------------------------------------------------------------- explicit settings win


def test_explicit_bucket_list_is_kept(flags):
    r, d = plan_of(reference(extra=("--cuda-graph-bs-prefill", "512", "1024", "2048")))
    assert d["prefill_graph"]["buckets"] == [512, 1024, 2048]
    assert d["bucket_lists"]["policy"] == "user"
    assert (
        d["prefill_graph"]["decided_by"]["kind"] == "estimate"
    )  # the user's list is what is estimated
    assert d["capture_memory"]["estimate"]["buckets"] == 3


def test_explicit_max_bs_is_kept(flags):
    from sglang.srt.arg_groups.cuda_graph_hook import generate_prefill_cuda_graph_batch_sizes

    _, d = plan_of(reference(extra=("--cuda-graph-max-bs-prefill", "1024")))
    assert d["prefill_graph"]["buckets"] == generate_prefill_cuda_graph_batch_sizes(1024)
    assert d["bucket_lists"]["policy"] == "user"


def test_explicit_backend_is_kept(flags):
    _, d = plan_of(reference(extra=("--cuda-graph-backend-prefill", "breakable")))
    assert d["prefill_graph"]["backend"] == "breakable"
    assert d["prefill_graph"]["decided_by"]["kind"] == "user"
    _, d = plan_of(reference(extra=("--disable-prefill-cuda-graph",)))
    assert d["prefill_graph"]["backend"] == "disabled"
    assert d["prefill_graph"]["decided_by"]["kind"] == "user"


# ---------------------------------------------------------------- startup validation errors


def test_bucket_above_megamoe_cap_is_rejected(flags):
    from sglang_mixgraph.planner.graph_plan import GraphConfigError

    with pytest.raises(GraphConfigError) as e:
        resolve(reference(extra=("--cuda-graph-bs-prefill", "1024", "2816", "4096")))
    msg = str(e.value)
    assert "[4096]" in msg and f"{CAP_ENV}=2816" in msg and "at least 4096" in msg


def test_plan_shows_the_list_the_patch_applies_under_upstreams_cap(flags):
    """Upstream caps the prefill max_bs below the per-rank chunk (--max-total-tokens): the
    derived list `plan` shows is the one the patch applied, and upstream's list is the one
    upstream would have captured under the same cap."""
    from sglang.srt.arg_groups.cuda_graph_hook import generate_prefill_cuda_graph_batch_sizes

    r, d = plan_of(reference(extra=("--max-total-tokens", "2000")))
    final = d["prefill_graph"]["buckets"]
    assert d["bucket_lists"]["policy"] == "auto"
    assert max(final) == 2000 and d["deployment"]["chunked_prefill_per_rank"] == 2816
    assert d["bucket_lists"]["ours"]["buckets"] == final
    assert d["bucket_lists"]["upstream"]["buckets"] == generate_prefill_cuda_graph_batch_sizes(2000)


def test_cap_below_chunk_is_rejected(flags):
    flags(**{CAP_ENV: 2048})
    with pytest.raises(ValueError, match=CAP_ENV):
        resolve(reference())


# ---------------------------------------------------------------- other models


def test_glm5_shaped(flags, models):
    _, d = plan_of(
        [
            "--model-path",
            models["glm5"],
            "--tp",
            "8",
            "--enable-mixed-chunk",
            "--max-running-requests",
            "512",
        ],
        gpu="B200",
    )
    assert d["prefill_graph"]["backend"] == "breakable"
    assert d["prefill_graph"]["decided_by"]["kind"] == "default"
    assert d["prefill_graph"]["rules"] == []
    # MLA caps the prefill capture at 8192 tokens (memory_hook.py:233-238); B200 chunk is 16384
    assert d["deployment"]["chunked_prefill_per_rank"] == 16384
    assert_bucket_properties(d, 8192, None, 512)
    _, d = plan_of(
        [
            "--model-path",
            models["glm5"],
            "--tp",
            "8",
            "--dp",
            "8",
            "--enable-dp-attention",
            "--enable-mixed-chunk",
            "--max-running-requests",
            "1024",
        ],
        gpu="B200",
    )
    assert_bucket_properties(d, 2048, None, 128)


def test_dense_is_left_to_upstream(flags, models):
    """A model the patch is not designed for keeps upstream's generic buckets, even with mixed chunk."""
    _, d = plan_of(
        [
            "--model-path",
            models["dense"],
            "--enable-mixed-chunk",
            "--chunked-prefill-size",
            "4096",
            "--max-running-requests",
            "128",
        ],
        gpu="H100",
    )
    assert d["prefill_graph"]["backend"] == "breakable"
    assert d["prefill_graph"]["buckets"] == d["bucket_lists"]["upstream"]["buckets"]
    assert d["bucket_lists"]["policy"] == "upstream (not a DeepSeek-V4 or GLM-5 model)"
    assert d["validations"] == []


def test_dsv4_without_mixed_chunk_is_left_to_upstream(flags):
    argv = reference()
    argv.remove("--enable-mixed-chunk")
    _, d = plan_of(argv)
    assert d["prefill_graph"]["backend"] == "disabled"
    assert d["prefill_graph"]["decided_by"] == {
        "kind": "upstream rule",
        "rule": DSV4_RULE,
        "reason": d["prefill_graph"]["rules"][0]["reason"],
    }
    assert d["bucket_lists"]["policy"] == "upstream (mixed chunked prefill is off)"


def test_mixed_chunk_off_is_left_to_upstream(flags, models):
    _, d = plan_of(
        ["--model-path", models["glm5"], "--tp", "8", "--max-running-requests", "512"], gpu="B200"
    )
    assert d["prefill_graph"]["buckets"] == d["bucket_lists"]["upstream"]["buckets"]
    assert d["bucket_lists"]["policy"] == "upstream (mixed chunked prefill is off)"


# ---------------------------------------------------------------- flags off = upstream

IDENTITY_ROWS = {
    "reference": reference(),
    "no-dp-attention": dsv4_mixed(2816, "--moe-a2a-backend", "megamoe"),
    "explicit-bs": reference(extra=("--cuda-graph-bs-prefill", "512", "1024", "2048")),
    "glm5": ["--model-path", "{glm5}", "--tp", "8", "--enable-mixed-chunk"],
    "dense": ["--model-path", "{dense}", "--enable-mixed-chunk", "--chunked-prefill-size", "4096"],
    "dense-tp1": ["--model-path", "{dense}", "--tp", "1"],
    "dsv4-no-mixed-chunk": [
        *dsv4_dp(),
        "--chunked-prefill-size",
        "22528",
        "--moe-a2a-backend",
        "megamoe",
    ],
    "glm5-no-mixed-chunk": ["--model-path", "{glm5}", "--tp", "8"],
}
# Deployments the default-on graph configuration is not designed for: resolved exactly as
# upstream with every flag at its default.
OUT_OF_SCOPE = ("dense", "dense-tp1", "dsv4-no-mixed-chunk", "glm5-no-mixed-chunk")

_BASELINE = textwrap.dedent(
    """
    import json, sys
    from sglang_mixgraph.resolution.resolve import select_described_platform, resolve
    select_described_platform()
    rows = json.loads(sys.argv[1])
    out = {k: json.loads(json.dumps(resolve(v).resolved, default=str)) for k, v in rows.items()}
    print("BASELINE" + json.dumps(out))
    """
)


def _run_rows(script: str, marker: str, rows: dict, **env) -> tuple[dict, str]:
    """Run `script` on `rows` in a fresh interpreter with `env` on top of ours: (the JSON it
    prints after `marker`, its stderr)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(rows)],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split(marker, 1)[1]), proc.stderr


def _rows_for(models):
    # a fixed seed: resolution draws a random one otherwise
    return {
        k: [a.format(**models) for a in v] + ["--random-seed", "7"]
        for k, v in IDENTITY_ROWS.items()
    }


def _unchunked_row(chunk: str) -> list[str]:
    return dsv4_mixed(chunk, "--random-seed", "7")


UNCHUNKED = ("0", "-1")


@pytest.fixture(scope="module")
def upstream_baseline(models) -> tuple[dict, str]:
    """SGLang's own resolution of the identity rows and the unchunked rows, on the described
    GPU with no mixgraph plugin, in one fresh interpreter (a process per test cost seconds of
    imports each), under the environment the `flags` fixture sets."""
    rows = {**_rows_for(models), **{f"unchunked{c}": _unchunked_row(c) for c in UNCHUNKED}}
    env = {k: v for k, v in os.environ.items() if k != FORCE_ENV}
    env.update({BUCKETS_ENV: "auto", CAP_ENV: "2816", "SGLANG_PLUGINS": "mixgraph_target"})
    proc = subprocess.run(
        [sys.executable, "-c", _BASELINE, json.dumps(rows)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("BASELINE", 1)[1]), proc.stderr


def test_flags_off_resolve_exactly_like_upstream(flags, models, upstream_baseline):
    rows = _rows_for(models)
    # the described GPU, no mixgraph patches
    baseline, stderr = upstream_baseline
    assert "sglang-mixgraph" not in stderr  # really no plugin
    for value in ("upstream", None):  # off, and unset: the default is off
        flags(**{BUCKETS_ENV: value})
        for name, argv in rows.items():
            ours = as_json(resolve(argv).resolved)
            assert ours == baseline[name], (value, name)
    # switched on, deployments out of the patch's scope still resolve exactly as upstream
    flags(**{BUCKETS_ENV: "auto"})
    for name in OUT_OF_SCOPE:
        assert as_json(resolve(rows[name]).resolved) == baseline[name], name
    # and the reference does change (the test can fail)
    assert as_json(resolve(rows["reference"]).resolved) != baseline["reference"]


# Chunked prefill 0 in the fast tier, -1 (the same rule) slow; SGLang's own resolution of both
# comes from the one baseline process (upstream_baseline).
@pytest.mark.parametrize("chunk", ["0", pytest.param("-1", marks=pytest.mark.slow)])
def test_unchunked_dsv4_settles_the_deferred_rule_as_upstream(flags, chunk, upstream_baseline):
    """DSV4 with mixed chunk but chunked prefill off (0 or -1) and no MegaMoE: the rule hook
    defers upstream's DSV4 rule, and no bucket list is left to estimate. The deferral used to
    stay open, leaving a breakable prefill graph with 0 buckets where SGLang alone turns it
    off; now upstream's rule stands and the resolution equals SGLang's own."""
    argv = _unchunked_row(chunk)
    assert chunk in UNCHUNKED
    baseline = upstream_baseline[0][f"unchunked{chunk}"]
    assert baseline["cuda_graph_config"]["prefill"]["backend"] == "disabled"
    r, d = plan_of(argv)
    assert as_json(r.resolved) == baseline
    pg = d["prefill_graph"]
    assert pg["backend"] == "disabled" and pg["buckets"] == []
    assert pg["decided_by"] == {
        "kind": "upstream rule",
        "rule": DSV4_RULE,
        "reason": pg["rules"][0]["reason"],
    }
    assert pg["rules"][0]["action"] == "disables (no prefill buckets to estimate)"


# ---------------------------------------------------------------- FORCE_BCG

_FORCE = textwrap.dedent(
    """
    import json, sys
    from sglang_mixgraph.resolution.resolve import select_described_platform, resolve
    select_described_platform()
    from sglang_mixgraph.resolution.plan_format import format_graph_plan, graph_plan_json
    from sglang_mixgraph.resolution.resolve import graph_plan_of
    out = {}
    for name, (argv, gpu) in json.loads(sys.argv[1]).items():
        r = resolve(argv, gpu=gpu)
        plan = graph_plan_json(graph_plan_of(r))
        out[name] = {
            "plan": plan,
            "text": format_graph_plan(graph_plan_of(r)),
            "messages": r.messages("sglang_mixgraph"),
            "resolved": json.loads(json.dumps(r.resolved, default=str)),
        }
    print("FORCE" + json.dumps(out))
    """
)


A2A_RULE = "unvalidated a2a backend"
GLM5_MORI = ["--tp", "8", "--moe-a2a-backend", "mori", "--chunked-prefill-size", "4096"]

# Deployments for SGLANG_EXPERIMENTAL_FORCE_BCG, one or more per upstream rule (all seven):
# name -> (argv, GPU, the rules that hold). FORCE overrides the DSV4 and a2a rules only.
FORCE_OVERRIDDEN = {
    "dsv4": (reference(), "B300", [DSV4_RULE]),  # the upstream PR's deployment
    "dsv4+a2a": (TWO_RULES, "B300", [DSV4_RULE, A2A_RULE]),
    "a2a": (["--model-path", "{glm5}", *GLM5_MORI], "B200", [A2A_RULE]),
    "estimate-would-disable": (
        reference(extra=("--mem-fraction-static", "0.9")),
        "H200",
        [DSV4_RULE],
    ),
}
FORCE_KEPT = {
    "kda": (["--model-path", "{kda}", "--tp", "1"], "H100", ["KDA hybrid linear attention"]),
    "attn-cp": (
        ["--model-path", "{dense}", "--tp", "2", "--attn-cp-size", "2"],
        "H100",
        ["attention context parallel without CP-BCG support"],
    ),
    "dcp": (
        ["--model-path", "{dense}", "--tp", "2", "--dcp-size", "2"],
        "H100",
        ["decode context parallel (dcp_size > 1)"],
    ),
    "tbo": (
        [
            "--model-path",
            "{glm5}",
            "--tp",
            "8",
            "--moe-a2a-backend",
            "deepep",
            "--enable-two-batch-overlap",
        ],
        "B200",
        ["two-batch overlap"],
    ),
    "multimodal": (["--model-path", "{qwen2vl}", "--tp", "1"], "H100", ["multimodal model"]),
    # an overridable rule together with a kept one: the kept one decides
    "dsv4+dcp": (
        [*dsv4_dp(), "--dcp-size", "2"],
        "B300",
        [DSV4_RULE, "decode context parallel (dcp_size > 1)"],
    ),
    "dsv4+tbo": (
        [
            "--model-path",
            DSV4,
            "--tp",
            "8",
            "--moe-a2a-backend",
            "deepep",
            "--enable-two-batch-overlap",
        ],
        "B300",
        [DSV4_RULE, "two-batch overlap"],
    ),
}

_BASELINE_ON_GPU = textwrap.dedent(
    """
    import json, sys
    from sglang_mixgraph.resolution.resolve import select_described_platform, resolve
    select_described_platform()
    rows = json.loads(sys.argv[1])
    out = {k: json.loads(json.dumps(resolve(v, gpu=g).resolved, default=str)) for k, (v, g) in rows.items()}
    print("BASELINE" + json.dumps(out))
    """
)


def test_force_bcg_rule_table_covers_every_rule():
    """Rule-evaluation level: FORCE overrides exactly the two DSV4-deployment rules, and the
    action on each rule follows from which rules hold."""
    from sglang_mixgraph.bcg_rules import FORCEABLE_RULES, forced_actions, rules

    table = {r.name: r for r in rules()}
    assert len(table) == 7
    assert FORCEABLE_RULES == {DSV4_RULE, A2A_RULE} and FORCEABLE_RULES <= set(table)
    covered = {
        n for rows in (FORCE_OVERRIDDEN, FORCE_KEPT) for *_, names in rows.values() for n in names
    }
    assert covered == set(table)  # every rule has a deployment below
    dsv4, a2a, dcp = (
        table[DSV4_RULE],
        table[A2A_RULE],
        table["decode context parallel (dcp_size > 1)"],
    )
    assert forced_actions([dsv4, a2a]) == (["overridden by FORCE_BCG"] * 2, None)
    actions, kept = forced_actions([dsv4, dcp])
    assert kept is dcp
    assert actions == [
        f"overridable by FORCE_BCG, but rule {dcp.name!r} is kept",
        f"kept: {dcp.reason}",
    ]
    assert forced_actions([]) == ([], None)


# Slow tier (about 25 s, two fresh processes per rule row); the forced actions per rule are
# checked in-process by test_force_bcg_rule_table_covers_every_rule and forced_actions' tests.
@pytest.mark.slow
def test_force_bcg(models):
    def fill(rows):
        return {
            k: ([a.format(**models) for a in v] + ["--random-seed", "7"], g)
            for k, (v, g, _) in rows.items()
        }

    rows = {**fill(FORCE_OVERRIDDEN), **fill(FORCE_KEPT)}
    env = {FORCE_ENV: "1", BUCKETS_ENV: "upstream", CAP_ENV: "2816"}
    out, _ = _run_rows(_FORCE, "FORCE", rows, **env)
    # SGLang alone, no mixgraph plugin: what "upstream's decision" is
    kept_rows = {k: rows[k] for k in FORCE_KEPT}
    baseline, _ = _run_rows(
        _BASELINE_ON_GPU, "BASELINE", kept_rows, SGLANG_PLUGINS="mixgraph_target", CAP_ENV="2816"
    )
    for name, (_, _, names) in FORCE_OVERRIDDEN.items():
        pg = out[name]["plan"]["prefill_graph"]
        assert [m["name"] for m in pg["rules"]] == names, name
        assert pg["backend"] == "breakable", name
        assert pg["decided_by"]["kind"] == "force", name
        assert all(m["action"] == "overridden by FORCE_BCG" for m in pg["rules"]), name
        logged = [
            m for m in out[name]["messages"] if "SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps the" in m
        ]
        assert len(logged) == len(names) and all(
            n in m for n, m in zip(names, logged, strict=True)
        ), name
    for name, (_, _, names) in FORCE_KEPT.items():
        row = out[name]
        pg = row["plan"]["prefill_graph"]
        assert [m["name"] for m in pg["rules"]] == names, name
        assert pg["backend"] == "disabled", name
        assert row["resolved"] == baseline[name], name  # exactly SGLang's own resolution
        kept = next(m for m in pg["rules"] if m["name"] not in (DSV4_RULE, A2A_RULE))
        assert pg["decided_by"] == {
            "kind": "upstream rule",
            "rule": kept["name"],
            "reason": kept["reason"],
        }, name
        for m in pg["rules"]:
            if m is kept:
                assert m["action"] == f"kept: {m['reason']}", name
            else:
                assert m["action"] == f"overridable by FORCE_BCG, but rule {kept['name']!r} is kept"
        said = [
            m for m in row["messages"] if "SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps upstream rule" in m
        ]
        assert len(said) == 1 and repr(kept["name"]) in said[0] and kept["reason"] in said[0], name
        assert not [m for m in row["messages"] if "SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps the" in m]
    # upstream buckets (policy upstream), clamped per DP rank by upstream
    ref = out["dsv4"]["plan"]
    assert ref["prefill_graph"]["buckets"] == ref["bucket_lists"]["upstream"]["buckets"]
    # what `plan` prints per rule
    assert f"rule {DSV4_RULE!r}: overridden by FORCE_BCG" in out["dsv4"]["text"]
    assert "rule 'two-batch overlap': kept: TBO capture is unsupported" in out["dsv4+tbo"]["text"]


def test_force_bcg_wrong_value_is_rejected():
    env = dict(os.environ, **{FORCE_ENV: "maybe"})
    code = (
        "from sglang_mixgraph.resolution.resolve import select_described_platform, resolve; select_described_platform(); "
        f"resolve(['--model-path', {DSV4!r}])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "SGLANG_EXPERIMENTAL_FORCE_BCG='maybe' is not a valid value" in proc.stderr


@pytest.mark.parametrize("env,value", [(FORCE_ENV, "2"), (BUCKETS_ENV, "generic")])
def test_bad_flag_values_fail_patch_evaluation(monkeypatch, env, value):
    from sglang_mixgraph.patches import graph_config
    from sglang_mixgraph.registry import evaluate

    monkeypatch.setenv(env, value)
    patch = graph_config.PATCH
    status = evaluate(patch)
    assert status.state == "cannot apply"
    assert f"{env}={value!r} is not a valid value" in status.error


# ---------------------------------------------------------------- speculative decoding

# The reference deployment with EAGLE (one next-n layer) and a memory fraction under which the
# capture estimate keeps the graph on over upstream's list (no derived list under speculation).
SPECULATIVE = reference(
    extra=(
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
        "--mem-fraction-static",
        "0.75",
    )
)


@pytest.mark.parametrize(
    "switch, env",
    [
        ("SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto", {}),
        ("SGLANG_EXPERIMENTAL_FORCE_BCG=1", {FORCE_ENV: "1", BUCKETS_ENV: "upstream"}),
    ],
)
def test_a_speculative_deployment_kept_on_is_warned_once_in_the_log_and_in_plan(flags, switch, env):
    """Either switch keeps DeepSeek-V4's breakable prefill graph on under EAGLE, where SGLang
    keeps it off: the server log says so once, by the switch's name and with the upstream
    issue, `plan` prints the same line and `--json` has it; the graph stays on (allowed)."""
    from sglang_mixgraph.resolution.plan_format import format_graph_plan
    from sglang_mixgraph.resolution.resolve import graph_plan_of

    flags(**env)
    r, d = plan_of(SPECULATIVE)
    pg = d["prefill_graph"]
    assert pg["backend"] == "breakable"
    warning = pg["speculative_warning"]
    assert warning.startswith(f"{switch} keeps the breakable prefill CUDA graph on for")
    assert "(EAGLE)" in warning and "SGLang issue #29985" in warning and DSV4_RULE in warning
    assert "hidden states fed to the draft model" in warning
    logged = [m for m in r.messages("sglang_mixgraph") if "#29985" in m]
    assert logged == [f"sglang-mixgraph: {warning}"]
    assert f"    WARNING: {warning}" in format_graph_plan(graph_plan_of(r)).splitlines()


@pytest.mark.parametrize(
    "argv, env",
    [
        (reference(), {}),  # no speculative decoding
        (reference(), {FORCE_ENV: "1", BUCKETS_ENV: "upstream"}),
        (SPECULATIVE, {BUCKETS_ENV: "upstream"}),  # both switches off: upstream keeps it off
        # the estimate turns the graph off: nothing of ours runs under speculation
        ([*SPECULATIVE[:-2], "--mem-fraction-static", "0.9"], {}),
    ],
    ids=["no_spec_auto", "no_spec_force", "spec_switches_off", "spec_estimate_off"],
)
def test_no_speculative_warning_where_no_switch_keeps_the_graph_on_under_speculation(
    flags, argv, env
):
    flags(**env)
    r, d = plan_of(argv)
    assert d["prefill_graph"]["speculative_warning"] is None
    assert not [m for m in r.messages("sglang_mixgraph") if "#29985" in m]


# ---------------------------------------------------------------- rule table drift


def test_rule_table_matches_upstream_source():
    from sglang.srt.arg_groups import cuda_graph_hook

    from sglang_mixgraph.bcg_rules import rules

    tree = ast.parse(
        textwrap.dedent(
            inspect.getsource(cuda_graph_hook.disable_breakable_cudagraph_if_incompatible)
        )
    )
    lists = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.targets[0].id == "rules"]
    assert len(lists) == 1
    upstream_names = [
        elt.elts[0].value if isinstance(elt.elts[0], ast.Constant) else None
        for elt in lists[0].value.elts
    ]
    assert upstream_names == [r.upstream_name for r in rules()]


# ---------------------------------------------------------------- logits all-gather sizing (runtime hook)


class _Bag:
    def __init__(self, **kw):
        self.__dict__.update(kw)


V4 = "DeepseekV4ForCausalLM"


@pytest.mark.parametrize(
    "mixed, dp_on, spec, mrr, expected, arch",
    [
        (True, True, None, 2048, 8 * 257, V4),  # mixed steps on 8 DP ranks: 8 x (256 + 1)
        (True, False, None, 2048, 2049, V4),  # no DP attention: one rank's rows
        (False, True, None, 2048, 2048, V4),  # no mixed chunk: upstream's sizing stands
        (True, True, "EAGLE", 2048, 2048, V4),  # speculative decoding: not resized
        (True, True, None, None, 128, V4),  # unknown request cap: upstream's floor
        (True, True, None, 2048, 2048, "LlamaForCausalLM"),  # a model the patch is not for
        (True, True, None, 2048, 8 * 257, "GlmMoeDsaForCausalLM"),
    ],
)
def test_logits_gather_sizing_hook(monkeypatch, flags, mixed, dp_on, spec, mrr, expected, arch):
    import sglang.srt.arg_groups.overrides as overrides
    import sglang.srt.runtime_context as rc

    from sglang_mixgraph.patches.graph_config import _recommended_max_tokens_around

    monkeypatch.setattr(rc, "get_server_args", lambda: "server-args")
    monkeypatch.setattr(
        overrides,
        "model_config_of",
        lambda sa: _Bag(hf_config=_Bag(architectures=[arch])) if sa == "server-args" else None,
    )
    monkeypatch.setattr(
        rc, "get_schedule", lambda: _Bag(enable_mixed_chunk=mixed, max_running_requests=mrr)
    )
    monkeypatch.setattr(rc, "get_spec", lambda: _Bag(speculative_algorithm=spec))
    monkeypatch.setattr(rc, "get_parallel", lambda: _Bag(attn_dp_size=8, attn_dp_enabled=dp_on))

    def upstream(
        include_prefill, floor=0
    ):  # what triton_symm_mem_ag.recommended_max_tokens returns here
        return max(mrr or 0, floor)

    assert _recommended_max_tokens_around(upstream, include_prefill=False, floor=128) == expected
    # prefill-inclusive callers and the upstream policy are untouched
    assert _recommended_max_tokens_around(upstream, include_prefill=True, floor=128) == max(
        mrr or 0, 128
    )
    flags(**{BUCKETS_ENV: "upstream"})
    assert _recommended_max_tokens_around(upstream, include_prefill=False, floor=128) == max(
        mrr or 0, 128
    )
