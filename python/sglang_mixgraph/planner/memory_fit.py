"""Do the weights fit, and how many KV tokens do they leave: `plan`'s memory line.

From the model's `config.json` alone (no weights): the parameters of each group (routed and
shared experts, dense MLPs, attention, embedding, LM head), the bytes a parameter takes under
the checkpoint's quantization, and each group's share on one GPU as SGLang's DeepSeek-family
models shard it (routed experts over tp = ep x moe-tp, attention over the attention-TP group,
the embedding replicated under DP attention for DeepSeek-V4, layers over pp). Against that,
the static pool SGLang resolves (`mem_fraction_static` of the GPU) and SGLang's KV budget
(`KVCacheConfigurator._profile_available_bytes`: what the loaded weights leave of the static
part) divided by its per-token cell (`DefaultPoolConfigurator._compute_cell_size`), or for
DeepSeek-V4 sized by SGLang's own `DSV4PoolConfigurator` (`MemoryInputs.kv_pool`). The
figures count the large matrices only (no norms, biases, routers, compressors): a lower bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the model's configs and the deployment's facts, read by attribute
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from transformers import PretrainedConfig

    from sglang_mixgraph.planner.deployment_facts import Deployment

GiB = 1 << 30
MiB = 1 << 20

# Bytes of one parameter, with its scales: FP8 with a 4-byte scale per 128x128 block, MXFP4
# (e2m1 pairs) with a 1-byte ue8m0 scale per 32, NVFP4 with a 1-byte FP8 scale per 16.
FP8_BLOCK = 1 + 4 / (128 * 128)
MXFP4 = 0.5 + 1 / 32
NVFP4 = 0.5 + 1 / 16
_FP8_METHODS = {"fp8", "mxfp8", "modelopt", "modelopt_fp8", "w8a8_fp8", "fbgemm_fp8"}
_INT_METHODS = {"awq", "awq_marlin", "gptq", "gptq_marlin", "moe_wna16", "auto-round"}


@dataclass(frozen=True)
class WeightGroups:
    """Parameters per group over the whole model (unsharded)."""

    routed_experts: int = 0
    shared_experts: int = 0
    dense_mlp: int = 0
    attention: int = 0
    embedding: int = 0
    lm_head: int = 0


@dataclass(frozen=True)
class Sharding:
    tp: int
    attn_tp: int
    pp: int
    dp_attention: bool
    dp_lm_head: bool
    deepseek_v4: bool


@dataclass(frozen=True)
class MemoryFit:
    """The memory line of one deployment on one GPU."""

    gpu_bytes: int
    mem_fraction_static: float
    static_bytes: int  # the static pool: weights + KV cache
    weights_bytes: int | None  # per GPU; None: the quantization is not modelled
    weights_by_group: dict[str, int] = field(default_factory=dict)  # bytes per GPU
    weights_note: str = ""  # the dtype/quantization the figure assumes
    kv_budget_bytes: int | None = None  # what the weights leave of the static pool
    # SGLang's bytes per KV token per GPU (DeepSeek-V4: a full token's, SWA share included,
    # fractional as upstream's coefficient is); None: not modelled
    kv_cell_bytes: float | None = None
    kv_tokens: int | None = None
    kv_swa_tokens: int | None = None  # DeepSeek-V4: the SWA pool SGLang sizes beside them
    kv_note: str = ""
    reserve_warning: str | None = None  # the activation reserve sized from the global chunk

    @property
    def fits(self) -> bool | None:
        return None if self.weights_bytes is None else self.weights_bytes < self.static_bytes

    @property
    def shortfall_bytes(self) -> int:
        return 0 if self.weights_bytes is None else max(0, self.weights_bytes - self.static_bytes)


def _get(cfg: PretrainedConfig, *names: str, default: int = 0) -> Any:
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return default


def _attention_params(cfg: PretrainedConfig) -> int:
    """One layer's attention projections: DeepSeek-V4's grouped low-rank output, MLA (with a
    DSA indexer where the config has one), else multi-head/grouped-query attention."""
    h = int(cfg.hidden_size)
    heads = int(_get(cfg, "num_attention_heads"))
    q_lora = int(_get(cfg, "q_lora_rank"))
    if getattr(cfg, "model_type", None) == "deepseek_v4":  # models.deepseek_v4 attention
        hd = int(cfg.head_dim)
        o_lora = int(_get(cfg, "o_lora_rank"))
        groups = int(_get(cfg, "o_groups", default=1))
        return h * q_lora + q_lora * heads * hd + h * hd + heads * hd * o_lora + groups * o_lora * h
    kv_lora = int(_get(cfg, "kv_lora_rank"))
    if kv_lora:
        nope, rope = int(_get(cfg, "qk_nope_head_dim")), int(_get(cfg, "qk_rope_head_dim"))
        v = int(_get(cfg, "v_head_dim"))
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        params = q + h * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * h
        if getattr(cfg, "index_topk", None):
            ih, idim = int(_get(cfg, "index_n_heads")), int(_get(cfg, "index_head_dim"))
            params += (q_lora or h) * ih * idim + h * idim + h * ih
        return params
    hd = int(_get(cfg, "head_dim", default=0)) or h // max(1, heads)
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    return 2 * h * heads * hd + 2 * h * kv_heads * hd


def weight_groups(cfg: PretrainedConfig) -> WeightGroups:
    """The parameters of each group of a decoder-only (MoE or dense) text config."""
    h, layers = int(cfg.hidden_size), int(cfg.num_hidden_layers)
    experts = int(_get(cfg, "n_routed_experts", "num_local_experts", "num_experts"))
    dense_i = int(_get(cfg, "intermediate_size"))
    moe_i = int(_get(cfg, "moe_intermediate_size")) or dense_i
    dense_layers = min(layers, int(_get(cfg, "first_k_dense_replace"))) if experts else layers
    if getattr(cfg, "model_type", None) == "deepseek_v4":
        # every layer is an MoE (models.deepseek_v4 `DeepseekV4DecoderLayerBase`), whatever
        # the config's inherited first_k_dense_replace says
        dense_layers = 0
    moe_layers = layers - dense_layers
    shared_i = int(_get(cfg, "n_shared_experts")) * moe_i or int(
        _get(cfg, "shared_expert_intermediate_size")
    )
    vocab = int(cfg.vocab_size)
    return WeightGroups(
        routed_experts=moe_layers * experts * 3 * h * moe_i,
        shared_experts=moe_layers * 3 * h * shared_i,
        dense_mlp=dense_layers * 3 * h * dense_i,
        attention=layers * _attention_params(cfg),
        embedding=vocab * h,
        lm_head=0 if getattr(cfg, "tie_word_embeddings", False) else vocab * h,
    )


def bytes_per_param(quant: dict, method: str | None, dtype_bytes: int, fp4_experts: bool):
    """(bytes of a routed-expert parameter, of another linear layer's) under the
    checkpoint's quantization, or None for a method not modelled here."""
    if not method:
        return dtype_bytes, dtype_bytes
    method = method.lower()
    if method in _FP8_METHODS:
        return (MXFP4 if fp4_experts else FP8_BLOCK), FP8_BLOCK
    if method == "mxfp4":  # gpt-oss: the experts only (attention, router, embeddings stay)
        return MXFP4, dtype_bytes
    if method in ("modelopt_fp4", "nvfp4_online", "petit_nvfp4"):
        return NVFP4, NVFP4
    if method in _INT_METHODS:
        bits = int(quant.get("bits", quant.get("w_bit", 4)) or 4)
        group = int(quant.get("group_size", quant.get("q_group_size", 128)) or 128)
        per = bits / 8 + (4 / group if group > 0 else 0)  # a 2-byte scale and zero per group
        return per, per
    return None


def weights_per_gpu(
    groups: WeightGroups,
    shard: Sharding,
    layer_share: float,
    expert_b: float,
    linear_b: float,
    dtype_b: int,
) -> dict[str, int]:
    """Bytes of each group on one GPU; `layer_share`: the largest pp stage's share of layers."""
    embed_div = (
        1
        if shard.deepseek_v4 and shard.dp_attention
        else (shard.attn_tp if shard.dp_attention else shard.tp)
    )
    out = {
        "routed experts": groups.routed_experts * expert_b * layer_share / shard.tp,
        "shared experts": groups.shared_experts * linear_b * layer_share / shard.tp,
        "dense MLP": groups.dense_mlp * linear_b * layer_share / shard.tp,
        "attention": groups.attention * linear_b * layer_share / shard.attn_tp,
        "embedding": groups.embedding * dtype_b / embed_div,
        "LM head": groups.lm_head * dtype_b / (shard.attn_tp if shard.dp_lm_head else shard.tp),
    }
    if shard.pp > 1:  # the first stage holds the embedding, the last the LM head
        out["embedding"] = max(out["embedding"], out.pop("LM head"))
    return {k: int(v) for k, v in out.items() if v}


def _dtype_bytes(dtype: torch.dtype) -> int:
    return int(getattr(dtype, "itemsize", 2) or 2)


def kv_cell_bytes(
    mc: ModelConfig, kv_cache_dtype: str, attn_tp: int, layers: int
) -> tuple[int | None, str]:
    """SGLang's KV bytes per token on one GPU (`DefaultPoolConfigurator._compute_cell_size`,
    with `calculate_mla_kv_cache_dim` and `_compute_dsa_indexer_cell_size` for MLA and DSA
    models), or None with the reason where another pool configurator sizes the cache."""
    from sglang.srt.configs.model_config import (
        AttentionArch,
        get_dsa_index_head_dim,
        get_dsa_index_kpool,
        is_deepseek_dsa,
        is_deepseek_v4,
    )
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    hf = mc.hf_config
    if is_deepseek_v4(hf):
        # no single cell: `MemoryInputs.kv_pool` runs SGLang's own V4 sizing instead
        return None, "SGLang's DeepSeek-V4 pool splits it over SWA, c4, c128 and indexer caches"
    if getattr(mc, "is_hybrid_swa", False):
        return None, "SGLang sizes a hybrid sliding-window pool (full and SWA caches)"
    if kv_cache_dtype.startswith("fp4"):
        return None, "FP4 KV cache (its scale layout is not modelled)"
    fp8 = kv_cache_dtype.startswith("fp8")
    elem = 1 if fp8 else _dtype_bytes(mc.dtype)
    if mc.attention_arch == AttentionArch.MLA:
        kv_lora, rope = int(mc.kv_lora_rank), int(mc.qk_rope_head_dim)
        if not is_deepseek_dsa(hf):
            return (kv_lora + rope) * layers * elem, ""
        block = DSATokenToKVPool.quant_block_size
        row = (
            kv_lora + kv_lora // block * 4 + rope * DSATokenToKVPool.rope_storage_dtype.itemsize
            if fp8
            else (kv_lora + rope) * elem
        )
        index_dim = get_dsa_index_head_dim(hf)
        indexer = -(-(index_dim + index_dim // block * 4) // get_dsa_index_kpool(hf))
        return (row + indexer) * layers, ""
    heads = mc.get_num_kv_heads(attn_tp)
    return heads * (int(mc.head_dim) + int(mc.v_head_dim)) * layers * elem, ""


def reserve_warning(chunks: tuple[int, int] | None, gpu_bytes: int, mfs: float) -> str | None:
    """Why SGLang's mem_fraction_static holds back more than the per-rank chunk needs:
    `chunks` is (the chunk its memory settings saw, the per-rank chunk), see `MemoryInputs`.
    `memory_hook.handle_gpu_memory_settings` reserves max(chunk, 2048) x 1.5 MiB for
    activations."""
    if chunks is None:
        return None
    seen, per_rank = chunks
    extra = (max(seen, 2048) - max(per_rank, 2048)) * 1.5 * MiB
    if extra <= 0:
        return None
    sized = min(0.99, round(mfs + extra / gpu_bytes, 3))
    return (
        f"SGLang sized the activation reserve behind mem_fraction_static {mfs} from the chunk "
        f"before the attention-DP division ({seen} tokens, not the {per_rank} per rank each GPU "
        f"runs): {extra / GiB:.1f} GiB more of each GPU kept out of the static pool; "
        f"--mem-fraction-static {sized} sizes it for the per-rank chunk"
    )


@dataclass(frozen=True)
class MemoryInputs:
    """What the memory line reads of a resolution besides its facts (`resolution.memory_inputs`)."""

    model_config: Any  # SGLang's ModelConfig of the deployment
    quant: dict[str, Any]  # the checkpoint's quantization_config
    method: str | None  # the quantization method SGLang resolved
    fp4_experts: bool  # routed experts stored as MXFP4 (and kept so at load)
    chunks_before_dp: tuple[int, int] | None  # `reserve_warning`'s (seen, per rank)
    # DeepSeek-V4: SGLang's own pool sizing of a budget (`resolution.dsv4_kv_pool.size_dsv4_pool`),
    # which answers full tokens, SWA tokens and bytes a full token; None for other models
    kv_pool: Callable[[int], Any] | None = None


def memory_fit(inputs: MemoryInputs, gpu_bytes: int, facts: Deployment) -> MemoryFit | None:
    """The memory line of a resolved deployment (`facts`: its `deployment_facts.Deployment`)
    on a GPU of `gpu_bytes`; None when mem_fraction_static is not resolved."""
    mfs = facts.mem_fraction_static
    if mfs is None or not gpu_bytes:
        return None
    mc = inputs.model_config
    text = mc.hf_text_config
    static = int(gpu_bytes * float(mfs))
    method = inputs.method
    dtype_b = _dtype_bytes(mc.dtype)
    fp4_experts = inputs.fp4_experts
    rates = bytes_per_param(inputs.quant, method, dtype_b, fp4_experts)
    warning = reserve_warning(inputs.chunks_before_dp, gpu_bytes, float(mfs))
    base = dict(
        gpu_bytes=gpu_bytes,
        mem_fraction_static=float(mfs),
        static_bytes=static,
        reserve_warning=warning,
    )
    if rates is None:
        return MemoryFit(
            **base, weights_bytes=None, weights_note=f"quantization {method!r} is not modelled"
        )
    layers = int(text.num_hidden_layers)
    pp = max(1, int(facts.memory.pp_size or 1))
    stage_layers = -(-layers // pp)
    shard = Sharding(
        tp=max(1, facts.tp_size),
        attn_tp=max(1, facts.attn_tp_size),
        pp=pp,
        dp_attention=facts.dp_attention,
        dp_lm_head=facts.dp_lm_head,
        deepseek_v4=facts.deepseek_v4,
    )
    by_group = weights_per_gpu(
        weight_groups(text), shard, stage_layers / layers, rates[0], rates[1], dtype_b
    )
    weights = sum(by_group.values())
    note = f"{method} checkpoint" if method else f"{mc.dtype} weights".replace("torch.", "")
    if fp4_experts:
        note += ", MXFP4 routed experts"
    cell, kv_note = kv_cell_bytes(mc, facts.memory.kv_cache_dtype, shard.attn_tp, stage_layers)
    budget = static - weights
    tokens = swa_tokens = None
    if cell and budget > 0:
        page = max(1, facts.page_size)
        tokens = budget // cell // page * page
    elif inputs.kv_pool is not None and budget > 0:
        try:
            pool = inputs.kv_pool(budget)
        except (AssertionError, RuntimeError, ValueError) as e:  # SGLang refuses the pool
            reason = (str(e) or type(e).__name__).splitlines()[0]
            kv_note = f"SGLang would not size its DeepSeek-V4 pool: {reason}"
        except Exception as e:  # noqa: BLE001 -- upstream's sizing changed: no count, no crash
            first = str(e).splitlines()[0] if str(e) else ""
            kv_note = f"SGLang's DeepSeek-V4 pool sizing failed ({type(e).__name__}: {first})"
        else:
            tokens, swa_tokens = pool.full_tokens, pool.swa_tokens
            cell = pool.bytes_per_full_token
            kv_note = ""
    return MemoryFit(
        **base,
        weights_bytes=weights,
        weights_by_group=by_group,
        weights_note=note,
        kv_budget_bytes=budget,
        kv_cell_bytes=cell,
        kv_tokens=tokens,
        kv_swa_tokens=swa_tokens,
        kv_note=kv_note,
    )
