"""The memory line's arithmetic (planner/memory_fit.py), on public configs without SGLang:
parameters per group, bytes per parameter by quantization, the share of one GPU, and the
reserve warning; and where the reserve's chunk is read from (resolution/memory_inputs.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sglang_mixgraph.kits.model_configs import DEEPSEEK_V3, GPT_OSS_120B
from sglang_mixgraph.planner.memory_fit import (
    FP8_BLOCK,
    MXFP4,
    Sharding,
    bytes_per_param,
    reserve_warning,
    weight_groups,
    weights_per_gpu,
)
from sglang_mixgraph.resolution.memory_inputs import chunk_before_dp_division
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

GiB = 1 << 30


def _cfg(raw: dict) -> SimpleNamespace:
    return SimpleNamespace(**raw)


def test_deepseek_v3_counts_its_671b_parameters():
    groups = weight_groups(_cfg(DEEPSEEK_V3))
    total = sum(vars(groups).values())
    assert 670e9 < total < 672e9  # the large matrices of the 671B model (no MTP layer)
    assert groups.routed_experts == 58 * 256 * 3 * 7168 * 2048  # first 3 layers are dense
    assert groups.dense_mlp == 3 * 3 * 7168 * 18432


def test_deepseek_v4_routed_fp4_experts_alone_exceed_90_gib_a_gpu_over_8():
    raw = json.loads((DSV4_MODEL_DIR / "config.json").read_text())
    # transformers fills in a V3-style first_k_dense_replace; every DeepSeek-V4 layer is an MoE
    groups = weight_groups(_cfg({**raw, "first_k_dense_replace": 3}))
    assert groups.routed_experts == 384 * 3 * 3072 * 7168 * 61 and groups.dense_mlp == 0
    shard = Sharding(tp=8, attn_tp=1, pp=1, dp_attention=True, dp_lm_head=False, deepseek_v4=True)
    by_group = weights_per_gpu(groups, shard, 1.0, MXFP4, FP8_BLOCK, 2)
    assert groups.routed_experts * 0.5 / 8 / GiB == pytest.approx(90.07, abs=0.01)
    assert by_group["routed experts"] / GiB == pytest.approx(95.70, abs=0.01)  # with scales
    assert by_group["embedding"] == raw["vocab_size"] * raw["hidden_size"] * 2  # replicated


@pytest.mark.parametrize(
    "quant, method, fp4, rates",
    [
        ({}, None, False, (2, 2)),
        ({"quant_method": "fp8"}, "fp8", False, (FP8_BLOCK, FP8_BLOCK)),
        ({"quant_method": "fp8"}, "fp8", True, (MXFP4, FP8_BLOCK)),
        ({"quant_method": "mxfp4"}, "mxfp4", False, (MXFP4, 2)),  # gpt-oss: experts only
        ({"bits": 4, "group_size": 128}, "awq", False, (0.5 + 4 / 128, 0.5 + 4 / 128)),
        ({}, "bitsandbytes", False, None),
    ],
)
def test_bytes_per_parameter_by_quantization(quant, method, fp4, rates):
    assert bytes_per_param(quant, method, 2, fp4) == rates


def test_gpt_oss_experts_dominate_its_weights():
    groups = weight_groups(_cfg(GPT_OSS_120B))
    assert groups.routed_experts == 36 * 128 * 3 * 2880 * 2880
    assert groups.dense_mlp == 0 and groups.shared_experts == 0


def test_the_reserve_warning_only_when_the_global_chunk_reserved_more():
    assert reserve_warning(None, 100 * GiB, 0.8) is None
    assert reserve_warning((4096, 2048), 100 * GiB, 0.8) is not None
    assert reserve_warning((2048, 256), 100 * GiB, 0.8) is None  # both at the 2048 floor
    text = reserve_warning((22528, 2816), 143771 << 20, 0.619)
    assert "28.9 GiB more of each GPU" in text and "--mem-fraction-static 0.825" in text


def test_the_chunk_before_the_dp_division_is_read_from_upstreams_record():
    record = [
        ("_handle_gpu_memory_settings", {"mem_fraction_static": 0.619}),
        ("_handle_data_parallelism", {"chunked_prefill_size": 2816}),
    ]
    args = SimpleNamespace(chunked_prefill_size=22528, _resolved_overrides=record)
    assert chunk_before_dp_division(args) == (22528, 2816)
    # mem_fraction_static given by the user: SGLang sized no reserve
    args = SimpleNamespace(chunked_prefill_size=22528, _resolved_overrides=record[1:])
    assert chunk_before_dp_division(args) is None
