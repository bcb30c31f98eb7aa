"""`plan --preset glm5`: the embedded GLM-5 deployment, resolved by SGLang on a CPU machine.
Run in this process (`cli.main`, the conftest's `plan_env`), as test_plan_memory.py does: a
fresh process per plan cost seconds of imports each."""

from __future__ import annotations

import json

import pytest

from sglang_mixgraph import cli
from sglang_mixgraph.resolution.presets import GLM5_MODEL_DIR


def _plan_json(capsys, *args: str) -> dict:
    code = cli.main(["plan", *args, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    return json.loads(out.out)


def test_embedded_config_is_glm5_for_transformers_and_sglang():
    from sglang.srt.configs.model_config import is_deepseek_dsa, is_glm_moe_dsa
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(GLM5_MODEL_DIR)
    assert type(hf).__name__ == "GlmMoeDsaConfig"
    shape = {
        k: getattr(hf, k)
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "index_topk",
            "index_n_heads",
            "index_head_dim",
            "n_routed_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "first_k_dense_replace",
            "vocab_size",
        )
    }
    assert shape == {
        "num_hidden_layers": 78,
        "hidden_size": 6144,
        "q_lora_rank": 2048,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "v_head_dim": 256,
        "index_topk": 2048,
        "index_n_heads": 32,
        "index_head_dim": 128,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3,
        "vocab_size": 154880,
    }
    assert is_glm_moe_dsa(hf) and is_deepseek_dsa(hf)


@pytest.fixture
def glm5_plan(plan_env, capsys):
    return _plan_json(capsys, "--preset", "glm5")


def test_glm5_preset_plans_breakable_prefill_with_its_dsa_surface(glm5_plan):
    p = glm5_plan
    assert p["default_deployment"] is True and "GLM-5-shaped" in p["preset"]
    assert p["model_path"] == str(GLM5_MODEL_DIR)
    assert p["graph"]["prefill_graph"]["backend"] == "breakable"
    assert p["graph"]["prefill_graph"]["decided_by"]["kind"] == "default"
    assert (
        p["graph"]["prefill_graph"]["buckets"]
        and max(p["graph"]["prefill_graph"]["buckets"]) == 8192
    )
    surface = "\n".join(p["dsa_surface"])
    assert p["dsa_surface"][0] == "DSA split-op surface (78 of 78 layers run the indexer):"
    assert "bcg_dsa_indexer_prefill_split" in surface and "_eager_bmm_attention" in surface
    # the default target (B300): fp8 KV cache and the trtllm DSA backend fuse the RoPE
    assert "every prefill replay has 78 empty segments" in surface
    assert "drop_empty_segments is off" in surface


def test_glm5_on_h200_has_rope_between_the_breaks(plan_env, capsys):
    p = _plan_json(capsys, "--preset", "glm5", "--target-gpu", "H200")
    assert p["dsa_surface"][-1].startswith("  RoPE: a kernel between the two breaks")
    assert "no empty segment" in p["dsa_surface"][-1]


def test_glm5_with_the_patch_on_says_the_segments_are_not_launched(plan_env, capsys):
    plan_env.setenv("SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS", "1")
    p = _plan_json(capsys, "--preset", "glm5")
    assert p["dsa_surface"][-1].endswith("they are kept but never launched")
    (patch,) = [x for x in p["patches"] if x["id"] == "drop_empty_segments"]
    assert patch["status"] == "active" and patch["note"].startswith("prefill graphs are breakable")


def test_mla_prefill_capture_defaults_to_8192_tokens(plan_env, capsys):
    """The behaviour the mla_prefill_capture_default guard reads in upstream's code."""
    plan_env.setenv("SGLANG_MIXGRAPH_PREFILL_BUCKETS", "upstream")
    p = _plan_json(capsys, "--preset", "glm5", "--chunked-prefill-size", "16384")
    assert p["graph"]["deployment"]["chunked_prefill_per_rank"] == 16384
    assert p["graph"]["prefill_graph"]["max_bs"] == 8192


def test_preset_with_a_model_path_is_refused_in_one_line(plan_env, capsys):
    code = cli.main(["plan", "--preset", "glm5", "--model-path", str(GLM5_MODEL_DIR)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "sglang-mixgraph plan: --preset plans an embedded deployment; drop it or --model-path"
    )
    assert "Traceback" not in err


def test_held_break_inputs_are_counted_for_the_planned_model(plan_env, capsys):
    """What holding break inputs would cost, named per model: GLM-5's indexer break takes
    static buffers, DeepSeek-V4's attention break its sink parameter; neither adds memory."""
    from sglang_mixgraph.patches import hold_break_inputs as hbi

    flag = f"{hbi.HOLD_FLAG.name}=1"
    glm5 = _plan_json(capsys, "--preset", "glm5")
    (entry,) = [x for x in glm5["patches"] if x["id"] == hbi.PATCH_ID]
    assert hbi.HELD_GLM5 in entry["if_on"][flag]
    plan_env.setenv("SGLANG_EXPERIMENTAL_FORCE_BCG", "1")
    dsv4 = _plan_json(capsys)
    assert dsv4["graph"]["prefill_graph"]["backend"] == "breakable"
    (entry,) = [x for x in dsv4["patches"] if x["id"] == hbi.PATCH_ID]
    assert hbi.HELD_DSV4 in entry["if_on"][flag]
    assert "capture estimate is unchanged" in entry["if_on"][flag]
