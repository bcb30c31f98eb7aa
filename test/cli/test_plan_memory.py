"""`plan`'s memory line: the weights a GPU against the static pool SGLang resolves, the KV
tokens they leave (DeepSeek-V4's as its own pool configurator sizes them), a plain "DOES NOT FIT" with the shortfall, the warning when SGLang sized
the activation reserve from the chunk before the attention-DP division; and the models whose
quantization SGLang registers only on a GPU (gpt-oss's MXFP4). Each plan runs in this process
(`cli.main`), text and JSON.
"""

from __future__ import annotations

import json
import math

import pytest

from sglang_mixgraph import cli
from sglang_mixgraph.kits.model_configs import DEEPSEEK_V3, GPT_OSS_120B, write_model
from sglang_mixgraph.resolution.presets import GLM5_MODEL_DIR

GiB = 1 << 30

# SGLang 0.5.23's DeepSeek-V4 pool for the reference (61 layers: 30 with a c4 cache, 29 with a
# c128 one), from first principles, so that a change of upstream's formula fails here: the
# FlashMLA paged layout (`select_dsv4_kv_layout`) at page size 256 takes 585 bytes a token of
# an SWA or c4 page and 864 of a c128 page; the c4 indexer 132 (128 fp8 + a 4-byte scale);
# each SWA page carries a ring of 8 c4 compress states of 2 x 2 x (512 + 128) fp32.
SWA_TOKEN = 61 * 585 + 30 * 8 / 256 * (2 * 2 * (512 + 128) * 4)


def _dsv4_full_token(swa_ratio: float) -> float:
    """Bytes a full-attention token costs: its share of SWA, its c4 row and indexer row, its
    c128 row (`DSV4PoolConfigurator._get_bytes_per_full_token`)."""
    return swa_ratio * SWA_TOKEN + 30 * (585 + 132) / 4 + 29 * 864 / 128


# The c128 compress state SGLang sets aside first: (257 request slots x a ring of 128, plus
# 129 rows, padded to 128) x 2 x 512 fp32 on each of the 29 layers.
C128_STATE = math.ceil((257 * 128 + 129) / 128) * 128 * 2 * 512 * 4 * 29


def _dsv4_tokens(budget: int, swa_ratio: float) -> tuple[int, int]:
    """(full-attention tokens, SWA tokens) of pages of 256 in a budget."""
    full = int((budget - C128_STATE) / _dsv4_full_token(swa_ratio)) // 256 * 256
    return full, int(full * swa_ratio) // 256 * 256


def _plan(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _plan_json(capsys, *args: str) -> dict:
    code, out, _ = _plan(capsys, "--json", *args)
    assert code == 0
    return json.loads(out)


def _line(text: str, start: str) -> str:
    """The first line of `text` that starts with `start` after its indent, without the indent."""
    return next(line.strip() for line in text.splitlines() if line.strip().startswith(start))


def test_reference_on_h200_weights_do_not_fit_its_static_pool(plan_env, capsys):
    code, text, _ = _plan(capsys, "--target-gpu", "H200")
    assert code == 0
    memory = _line(text, "memory:")
    assert "mem_fraction_static 0.619 (static pool 86.9 GiB of 140.4 GiB a GPU)" in memory
    weights = _line(text, "weights:")
    # 384 experts x 3 x 3072 x 7168 x 61 layers in MXFP4 over 8 GPUs: 90.1 GiB before scales
    assert "routed experts 95.7" in weights and "MXFP4 routed experts" in weights
    assert ": DOES NOT FIT: 28.2 GiB over the static pool (86.9 GiB)" in weights
    assert _line(text, "KV cache:") == "KV cache: none left"
    warning = _line(text, "WARNING:")
    assert "(22528 tokens, not the 2816 per rank each GPU runs)" in warning
    assert "28.9 GiB more of each GPU" in warning

    memory = _plan_json(capsys, "--target-gpu", "H200")["graph"]["memory"]
    assert memory["weights_fit"] is False and memory["kv_tokens_per_gpu"] == 0
    assert memory["weights_by_group"]["routed experts"] >= 90.1 * GiB
    assert (
        memory["shortfall_bytes"] == memory["weights_bytes_per_gpu"] - memory["static_pool_bytes"]
    )
    assert memory["static_pool_bytes"] == int(143771 * (1 << 20) * 0.619)


@pytest.mark.parametrize(
    "args, swa_ratio",
    [
        (("--target-gpu", "B300"), 0.1),  # upstream's DeepSeek-V4 default ratio
        (("--target-gpu", "H200", "--mem-fraction-static", "0.909"), 0.1),
        (("--target-gpu", "B300", "--swa-full-tokens-ratio", "0.2"), 0.2),
    ],
)
def test_reference_kv_tokens_as_sglangs_deepseek_v4_pool_sizes_them(
    plan_env, capsys, args, swa_ratio
):
    from sglang.srt.runtime_context import get_context

    published = get_context().is_config_namespace_published("exec")
    memory = _plan_json(capsys, *args)["graph"]["memory"]
    # the plan published its arguments to SGLang's runtime context for the sizing only
    assert get_context().is_config_namespace_published("exec") == published
    assert memory["weights_fit"] is True and memory["kv_note"] is None
    assert memory["kv_bytes_per_token"] == pytest.approx(_dsv4_full_token(swa_ratio))
    full, swa = _dsv4_tokens(memory["kv_budget_bytes"], swa_ratio)
    assert full > 900_000
    assert (memory["kv_tokens_per_gpu"], memory["kv_swa_tokens_per_gpu"]) == (full, swa)

    code, text, _ = _plan(capsys, *args)
    assert code == 0
    kv = _line(text, "KV cache:")
    assert kv.endswith(
        f"left by the weights: about {full} tokens a GPU (full-attention tokens; SWA tokens "
        f"{swa}) at about {round(_dsv4_full_token(swa_ratio))} bytes a full-attention token"
    )


def test_reference_kv_budget_below_sglangs_fixed_pools_says_why_no_tokens(plan_env, capsys):
    code, text, _ = _plan(capsys, "--target-gpu", "H200", "--mem-fraction-static", "0.83")
    assert code == 0
    kv = _line(text, "KV cache:")
    # 1.4 GiB left: less than the c128 compress state SGLang sets aside before any token
    assert kv.startswith("KV cache: 1.4 GiB left by the weights; tokens not estimated: ")
    assert "SGLang would not size its DeepSeek-V4 pool: SWA pool (0 tokens) cannot hold" in kv


def test_an_upstream_sizing_that_breaks_is_a_note_not_a_traceback(plan_env, capsys, monkeypatch):
    """The V4 sizing drives SGLang's pool configurator with the fields it reads today; a release
    that reads another one fails there, and the memory line says so instead of plan crashing."""
    from sglang.srt.model_executor import pool_configurator

    def changed(self, *args, **kwargs):
        raise AttributeError("'types.SimpleNamespace' object has no attribute 'new_field'")

    monkeypatch.setattr(pool_configurator.DSV4PoolConfigurator, "calculate_pool_sizes", changed)
    code, text, _ = _plan(capsys, "--target-gpu", "B300")
    assert code == 0
    assert _line(text, "KV cache:").endswith(
        "tokens not estimated: SGLang's DeepSeek-V4 pool sizing failed (AttributeError: "
        "'types.SimpleNamespace' object has no attribute 'new_field')"
    )


def test_reference_on_h100_warns_about_the_global_chunk_reserve(plan_env, capsys):
    code, text, _ = _plan(capsys, "--target-gpu", "H100")
    assert code == 0
    assert "mem_fraction_static 0.328" in _line(text, "memory:")
    assert "--mem-fraction-static 0.691 sizes it for the per-rank chunk" in _line(text, "WARNING:")
    assert "DOES NOT FIT" in _line(text, "weights:")


def test_reference_with_a_chunk_of_its_own_per_rank_has_no_reserve_warning(plan_env, capsys):
    args = ("--target-gpu", "B300", "--attn-dp-size", "1", "--chunked-prefill-size", "2816")
    code, text, _ = _plan(capsys, *args)
    assert code == 0
    assert "WARNING:" not in text


@pytest.mark.parametrize("gpu, fits", [("H100", False), ("B200", True)])
def test_deepseek_v3_fp8_at_tp8(plan_env, capsys, tmp_path, gpu, fits):
    model = write_model(tmp_path / "dsv3", DEEPSEEK_V3)
    code, text, _ = _plan(capsys, "--model-path", str(model), "--tp", "8", "--target-gpu", gpu)
    assert code == 0
    weights = _line(text, "weights:")
    assert weights.startswith(
        "weights: at least 78.3 GiB a GPU (fp8 checkpoint; routed experts 76.1"
    )
    kv = _line(text, "KV cache:")
    if fits:
        assert "DOES NOT FIT" not in weights
        # MLA: (kv_lora_rank 512 + rope 64) x 61 layers x 2 bytes
        assert kv.endswith("tokens a GPU at 70272 bytes a token")
    else:
        assert ": DOES NOT FIT: 14.7 GiB over the static pool (63.6 GiB)" in weights
        assert kv == "KV cache: none left"


def test_glm5_fp8_at_tp8_on_h100_does_not_fit(plan_env, capsys):
    code, text, _ = _plan(capsys, "--preset", "glm5", "--target-gpu", "H100")
    assert code == 0
    assert "DOES NOT FIT" in _line(text, "weights:")
    memory = _plan_json(
        capsys, "--model-path", str(GLM5_MODEL_DIR), "--tp", "8", "--target-gpu", "B300"
    )
    memory = memory["graph"]["memory"]
    # the DSA FP8 row (512 + 4 x 4 scale bytes + 64 x 2 rope bytes) plus the indexer's 132
    assert memory["weights_fit"] is True and memory["kv_bytes_per_token"] == (656 + 132) * 78


@pytest.mark.parametrize("gpu", ["H100", "B300"])
def test_gpt_oss_mxfp4_plans_on_every_gpu(plan_env, capsys, tmp_path, gpu):
    model = write_model(tmp_path / "gpt-oss-120b", GPT_OSS_120B)
    code, text, err = _plan(capsys, "--model-path", str(model), "--tp", "8", "--target-gpu", gpu)
    assert code == 0, err
    assert "Unknown quantization method" not in err
    weights = _line(text, "weights:")
    assert weights.startswith(
        "weights: at least 7.6 GiB a GPU (mxfp4 checkpoint; routed experts 7.1"
    )
    assert "tokens not estimated: SGLang sizes a hybrid sliding-window pool" in _line(
        text, "KV cache:"
    )


def test_mxfp4_registration_stays_inside_the_described_gpu(plan_env, capsys, tmp_path):
    from sglang.srt.layers import quantization

    before = dict(quantization.QUANTIZATION_METHODS)
    model = write_model(tmp_path / "gpt-oss-120b", GPT_OSS_120B)
    assert _plan(capsys, "--model-path", str(model), "--target-gpu", "H100")[0] == 0
    assert quantization.QUANTIZATION_METHODS == before


def test_out_of_scope_text_has_no_none_no_empty_header_and_auto_resolves_as_upstream(
    plan_env, capsys, tmp_path
):
    model = write_model(tmp_path / "gpt-oss-120b", GPT_OSS_120B)
    args = ("--model-path", str(model), "--tp", "8", "--target-gpu", "H100")
    code, text, _ = _plan(capsys, *args)
    assert code == 0
    assert "None" not in text
    assert "running requests sized at startup from the KV pool" in text
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):  # a header is followed by its indented entries
        if line.endswith(":") and not line.startswith(" "):
            assert lines[i + 1].startswith("  "), line
    assert "Validations:" not in text  # no startup check applies out of scope
    auto = _line(text, "with SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto:")
    assert auto.endswith(
        "resolves as upstream: the patch acts on mixed chunked prefill of DeepSeek-V4 and "
        "GLM-5 only (mixed chunked prefill is off)"
    )
    assert "captures" not in auto
    graph = _plan_json(capsys, *args)["graph"]
    assert graph["capture_memory"]["applies"] is False
    for side in ("upstream", "ours"):  # no grade where the estimate does not apply
        assert graph["bucket_lists"][side]["capture_fits"] is None
        assert graph["bucket_lists"][side]["capture_bytes"] is None


def test_auto_with_the_variable_set_resolves_what_the_preview_said(plan_env, capsys):
    """The preview for GLM-5 without mixed chunk says upstream; with the variable set, plan
    resolves upstream's list."""
    args = ("--model-path", str(GLM5_MODEL_DIR), "--tp", "8", "--target-gpu", "B300")
    code, text, _ = _plan(capsys, *args)
    assert code == 0
    assert "resolves as upstream" in _line(text, "with SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto:")
    off = _plan_json(capsys, *args)["graph"]["prefill_graph"]["buckets"]
    plan_env.setenv("SGLANG_MIXGRAPH_PREFILL_BUCKETS", "auto")
    on = _plan_json(capsys, *args)["graph"]["prefill_graph"]["buckets"]
    assert on == off and len(on) > 10


def test_deepseek_v4_flash_gets_a_hedged_capture_verdict(plan_env, capsys, tmp_path):
    from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

    pro = json.loads((DSV4_MODEL_DIR / "config.json").read_text())
    flash = write_model(
        tmp_path / "flash",
        pro,
        hidden_size=4096,
        num_hidden_layers=43,
        num_attention_heads=64,
        q_lora_rank=1024,
        o_groups=8,
        n_routed_experts=256,
        moe_intermediate_size=2048,
        compress_ratios=[0, 0] + [4, 128] * 20 + [4, 0],
    )
    args = ["--model-path", str(flash), "--tp", "8", "--attn-dp-size", "8", "--enable-mixed-chunk"]
    args += ["--target-gpu", "H200", "--cuda-graph-backend-prefill", "breakable"]
    code, text, _ = _plan(capsys, *args)
    assert code == 0, text
    assert "uncalibrated for DeepSeek-V4-Flash" in text
    assert not any(line.endswith("(fits)") for line in text.splitlines())
    graph = _plan_json(capsys, *args)["graph"]
    assert graph["capture_calibration"]["not_calibrated_for"] == "DeepSeek-V4-Flash"
