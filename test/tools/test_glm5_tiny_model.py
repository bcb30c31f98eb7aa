"""The tiny GLM-5 generator (tools/glm5/make_tiny_glm5.py).

SGLang 0.5.23's own config loader must take its output as a GLM-5 (``GlmMoeDsaForCausalLM``, a
DSA model whose every layer runs the indexer) with GLM-5's attention shapes and the tiny MoE the
script describes. test/gpu_e2e/test_e2e_glm5.py checks the harness's copy of it and has `plan`
resolve the harness's Engine arguments for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tool_scripts import load

ROOT = Path(__file__).resolve().parents[2]
GLM5 = json.loads((ROOT / "python/sglang_mixgraph/data/glm5/config.json").read_text())


@pytest.fixture(scope="module")
def gen():
    return load("make_tiny_glm5", "glm5")


@pytest.fixture
def model_dir(gen, tmp_path) -> Path:
    assert gen.main([str(tmp_path / "tiny")]) == 0
    return tmp_path / "tiny"


def test_sglang_loads_it_as_glm5_with_the_shapes_the_script_says(model_dir):
    from sglang.srt.configs.model_config import dsa_layer_skips_topk, is_deepseek_dsa
    from sglang.srt.utils.hf_transformers_utils import get_config

    hf = get_config(str(model_dir), trust_remote_code=False)
    assert hf.architectures == ["GlmMoeDsaForCausalLM"] and is_deepseek_dsa(hf)
    attention = (
        "hidden_size",
        "num_attention_heads",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "index_topk",
        "index_n_heads",
        "index_head_dim",
        "vocab_size",
    )
    assert {k: getattr(hf, k) for k in attention} == {k: GLM5[k] for k in attention}
    assert (hf.num_hidden_layers, hf.first_k_dense_replace) == (4, 1)
    assert (hf.n_routed_experts, hf.num_experts_per_tok, hf.moe_intermediate_size) == (8, 2, 256)
    # read as plain attributes by SGLang's DeepSeek-V2 MoE; transformers' GLM-5 config has none
    assert (hf.topk_method, hf.scoring_func, hf.moe_layer_freq) == ("noaux_tc", "sigmoid", 1)
    assert getattr(hf, "quantization_config", None) is None
    assert hf.num_nextn_predict_layers == 0
    assert not any(dsa_layer_skips_topk(hf, i) for i in range(4))  # every layer has an indexer


def test_layers_sets_the_depth_and_too_few_are_refused(gen, tmp_path, capsys):
    assert gen.tiny_config(78)["num_hidden_layers"] == 78
    assert gen.main([str(tmp_path / "x"), "--layers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["make_tiny_glm5: --layers 1: at least 2 (one dense layer, then MoE layers)"]
