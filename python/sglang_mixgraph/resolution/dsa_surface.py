"""What a DSA model's breakable prefill graph holds, as `plan` lines (GLM-5 and its kin).

:func:`dsa_surface` reads a resolved deployment the way upstream's model will run it: whether
the DSA indexer is the eager split op, whether the absorb bmm and attention are one eager break,
whether the RoPE runs between the two breaks, hence how many empty segments each prefill replay
has and what ``drop_empty_segments`` does with them. Each condition is named by the upstream
function that decides it; sglang is imported inside the functions only.
"""

from __future__ import annotations

from typing import Any


def _deep_gemm_bmm(hf: Any, gpu_sm_major: int) -> bool:
    """Whether the MLA weight loader keeps w_kc in fp8 for DeepGEMM's bmm (which turns the
    bmm+attention composite off): block-128 FP8 weights on Hopper with SGLANG_USE_DEEPGEMM_BMM=1
    (``DeepseekWeightLoader`` post-load, sglang.srt.models.deepseek_common)."""
    from sglang.srt.environ import envs

    quant = getattr(hf, "quantization_config", None) or {}
    blocks = quant.get("weight_block_size") if isinstance(quant, dict) else None
    return (
        gpu_sm_major < 10
        and list(blocks or []) == [128, 128]
        and bool(envs.SGLANG_USE_DEEPGEMM_BMM.get())
        and bool(envs.SGLANG_ENABLE_JIT_DEEPGEMM.get())
    )


def dsa_surface(resolution: Any) -> list[str]:
    """Plan lines for the DSA split-op surface of a DSA model; none for other models."""
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang.srt.configs.model_config import dsa_layer_skips_topk, is_deepseek_dsa
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    from sglang_mixgraph.patches.drop_empty_segments import DROP_FLAG

    r = resolution.resolved
    hf = model_config_of(resolution.server_args).hf_config
    if not is_deepseek_dsa(hf):
        return []
    indexer_layers = sum(1 for i in range(hf.num_hidden_layers) if not dsa_layer_skips_topk(hf, i))
    lines = [
        f"DSA split-op surface ({indexer_layers} of {hf.num_hidden_layers} layers run the indexer):"
    ]
    backend = r["cuda_graph_config"]["prefill"]["backend"]
    if backend != "breakable":
        return lines + [
            f"  prefill graph is {backend}: indexer and attention run in eager steps; no breaks"
        ]
    if r.get("enable_prefill_cp"):
        return lines + [
            "  prefill context parallelism: the indexer takes its CP path, not the split op; "
            "no adjacent breaks"
        ]
    lines.append(
        "  indexer: one eager split op per layer (bcg_dsa_indexer_prefill_split) in every captured "
        "bucket; the k-only decision is taken inside it"
    )
    attention = r["attention_backend"]
    why_not = None
    if attention not in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:
        why_not = f"attention backend {attention!r}"
    elif r.get("dcp_size", 1) > 1 or r.get("dcp_replicate_q_proj"):
        why_not = "decode context parallelism"
    elif _deep_gemm_bmm(hf, resolution.gpu.sm_major):
        why_not = "DeepGEMM bmm on fp8 w_kc (SGLANG_USE_DEEPGEMM_BMM=1)"
    if why_not:
        return lines + [
            f"  bmm+attention: not fused ({why_not}): the absorb bmm is captured between the "
            "breaks; no empty segment"
        ]
    lines.append(
        "  bmm+attention: one eager break (DeepseekMLAForwardMixin._eager_bmm_attention), "
        "right after the indexer's"
    )
    rope_fused = "trtllm" in (r.get("dsa_prefill_backend"), r.get("dsa_decode_backend")) and str(
        r.get("kv_cache_dtype")
    ).startswith("fp8_e4m3")
    if not rope_fused:
        return lines + [
            f"  RoPE: a kernel between the two breaks (KV cache {r.get('kv_cache_dtype')}, DSA "
            f"prefill backend {r.get('dsa_prefill_backend')}); no empty segment"
        ]
    lines.append(
        "  RoPE: fused into the attention kernel (DSA trtllm backend, fp8 KV cache): nothing runs "
        f"between the two breaks, so every prefill replay has {indexer_layers} empty segments"
    )
    if DROP_FLAG.get():
        lines.append(
            f"  drop_empty_segments ({DROP_FLAG.name}=1): they are kept but never launched"
        )
    else:
        lines.append(
            f"  drop_empty_segments is off: each is launched on every replay ({DROP_FLAG.name}=1 "
            "skips them)"
        )
    return lines
