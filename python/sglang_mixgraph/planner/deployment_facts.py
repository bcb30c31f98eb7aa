"""A deployment's facts, read once from SGLang's resolving server arguments.

The one place outside the hooks that reads `ServerArgs` for the planner: `read_deployment`
turns the resolving (or resolved) arguments into a typed, frozen `Deployment` (the per-rank
chunk, the running requests, the MegaMoE cap, the model shape, the memory settings, the graph
configuration as it stands, the BCG rules that hold), and the planner (graph_plan.py,
prefill_settlement.py) takes only that. `out_of_scope` is the scope check the rule hook needs
before the facts are final. Reads go through upstream's resolution views
(`sglang.srt.arg_groups.overrides.resolving_view` / `resolved_view` / `model_config_of`), so a
fact is what SGLang itself will act on. sglang is imported inside the functions only, so the
plugin stays cheap to load.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sglang_mixgraph.bcg_rules import matching_rules
from sglang_mixgraph.core.capture_effects import CaptureEffect
from sglang_mixgraph.core.capture_memory import ModelShape


def is_designed_model(hf_config) -> bool:
    """The sparse-MLA models the derivation and the estimate are built for: DeepSeek-V4, GLM-5."""
    from sglang.srt.configs.model_config import is_deepseek_v4, is_glm_moe_dsa

    return bool(is_deepseek_v4(hf_config) or is_glm_moe_dsa(hf_config))


def out_of_scope(server_args) -> str | None:
    """Why this deployment is left exactly as upstream resolves it, or None when the planner
    is designed for it: mixed chunked prefill on a sparse-MLA model."""
    from sglang.srt.arg_groups.overrides import model_config_of, resolving_view

    if not resolving_view(server_args).enable_mixed_chunk:
        return "mixed chunked prefill is off"
    if not is_designed_model(model_config_of(server_args).hf_config):
        return "not a DeepSeek-V4 or GLM-5 model"
    return None


@dataclass(frozen=True)
class MemoryFacts:
    """What the capture budget reads of a deployment besides its sizes (`memory_for`)."""

    device: str
    pp_size: int
    decode_graph_on: bool
    decode_max_bs: int
    prefill_node: bool  # a PD prefill node: no decode graph reserve
    kv_sized_after_capture: bool  # capture memory then comes out of the KV pool
    kv_cache_dtype: str  # as resolved ("auto": the model's dtype)
    max_total_tokens: int | None  # KV tokens per GPU the user fixed; None: sized at startup


@dataclass(frozen=True)
class PhaseGraph:
    """One phase's CUDA-graph settings as they stand when the facts are read."""

    backend: str  # sglang.srt.model_executor.cuda_graph_config.Backend (a str enum)
    buckets: tuple[int, ...]
    max_bs: int | None
    user_set: frozenset[str]  # the keys the user set explicitly ("backend", "bs", "max_bs")


@dataclass(frozen=True)
class HeldRule:
    """An upstream BCG incompatibility rule that holds for the deployment (bcg_rules)."""

    name: str
    reason: str


@dataclass(frozen=True)
class Deployment:
    """What the derivation, the estimate, the validations and the patches' `explain` read of
    one deployment (`read_deployment`): the planner takes these facts, never the arguments."""

    architectures: tuple[str, ...]
    out_of_scope: str | None  # why the planner leaves the deployment to upstream; None: in scope
    tp_size: int
    attn_dp_size: int  # 1 when DP attention is off
    dp_attention: bool
    attn_tp_size: int
    mixed_chunk: bool
    chunk_per_rank: int | None  # None or <= 0: chunked prefill is off
    max_running_requests: int | None
    running_per_rank: int | None
    moe_a2a_backend: str
    mega_moe_cap: int | None  # MegaMoE's per-rank token cap; None without MegaMoE
    mem_fraction_static: float | None
    model_type: str | None
    deepseek_v4: bool
    dsv4_attn_backend: str | None
    speculative_algorithm: str | None
    context_parallel: bool  # attention CP over more than one rank, or prefill CP
    prefill_cp: bool
    disaggregation_mode: str | None  # "prefill", "decode" or None
    dllm: bool  # diffusion LLM inference
    hisparse: bool
    page_size: int  # the KV page chunks end on (DeepSeek-V4: 256, set by its model override)
    shape: ModelShape  # the capture-memory model's view of the model
    memory: MemoryFacts
    dp_lm_head: bool
    draft_tokens: int  # sampling rows per running request (1 without speculative decoding)
    prefill_graph: PhaseGraph
    decode_graph: PhaseGraph
    rules_holding: tuple[HeldRule, ...]  # upstream's BCG rules that hold, in upstream's order
    # An FP8 checkpoint of 128x128 weight blocks: what DeepSeek-V4's FP8 wo_a GEMM takes
    # (`models.deepseek_v4.wo_a_fp8_gemm_enabled`; SGLang then decides per GPU at startup).
    fp8_block_checkpoint: bool = False

    @property
    def chunked(self) -> bool:
        return bool(self.chunk_per_rank and self.chunk_per_rank > 0)

    @property
    def glm5(self) -> bool:
        from sglang.srt.configs.model_config import is_glm_moe_dsa

        return bool(is_glm_moe_dsa({"architectures": list(self.architectures)}))


def _attn_tp_size(cfg) -> int:
    return max(1, cfg.tp_size // max(1, cfg.attn_dp_size) // max(1, cfg.attn_cp_size))


def _mega_moe_cap(cfg) -> int | None:
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_platform

    if cfg.moe_a2a_backend != "megamoe" or get_platform().is_hip:
        return None
    return int(envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())


def _phase_graph(server_args, cfg, phase: str) -> PhaseGraph:
    """`phase`'s settings ("prefill" or "decode"); which keys the user set is upstream's record
    on the arguments (`cuda_graph_hook.parse_cuda_graph_config`: (phase, key) pairs)."""
    settings = getattr(cfg.cuda_graph_config, phase)
    locked = getattr(server_args, "_cuda_graph_config_locked", set()) or set()
    return PhaseGraph(
        backend=settings.backend,
        buckets=tuple(settings.bs or ()),
        max_bs=settings.max_bs,
        user_set=frozenset(key for p, key in locked if p == phase),
    )


def capture_effects_of(patches: Iterable[Any]) -> frozenset[CaptureEffect]:
    """What the given patches (`registry.Patch`) declare they change in capture memory in this
    process: the union of their `capture_effects`."""
    return frozenset(
        effect for p in patches if p.capture_effects is not None for effect in p.capture_effects()
    )


def read_deployment(
    server_args, *, capture_effects: frozenset[CaptureEffect] = frozenset()
) -> Deployment:
    """The facts of the resolving deployment, with what the patches of this process declare
    they change in capture memory (`capture_effects_of`; this layer imports no patch)."""
    from sglang.srt.arg_groups.overrides import (
        model_config_of,
        post_capture_kv_sizing_planned,
        resolved_view,
        resolving_view,
    )
    from sglang.srt.configs.model_config import is_deepseek_v4
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase
    from sglang.srt.runtime_context import attn_dp_enabled_of

    cfg = resolving_view(server_args)
    mc = model_config_of(server_args)
    hf = mc.hf_config
    dp_attention = bool(attn_dp_enabled_of(resolved_view(server_args)))
    attn_dp = cfg.attn_dp_size if dp_attention else 1
    mrr = cfg.max_running_requests
    decode = _phase_graph(server_args, cfg, Phase.DECODE)
    return Deployment(
        architectures=tuple(getattr(hf, "architectures", None) or ()),
        out_of_scope=out_of_scope(server_args),
        tp_size=cfg.tp_size,
        attn_dp_size=attn_dp,
        dp_attention=dp_attention,
        attn_tp_size=_attn_tp_size(cfg),
        mixed_chunk=bool(cfg.enable_mixed_chunk),
        chunk_per_rank=cfg.chunked_prefill_size,
        max_running_requests=mrr,
        # SGLang's per-rank count (model_executor.pool_configurator, mem_cache.kv_cache_configurator)
        running_per_rank=None if mrr is None else max(1, mrr // attn_dp),
        moe_a2a_backend=resolved_view(server_args).moe_a2a_backend,
        mega_moe_cap=_mega_moe_cap(cfg),
        mem_fraction_static=cfg.mem_fraction_static,
        model_type=getattr(hf, "model_type", None),
        deepseek_v4=bool(is_deepseek_v4(hf)),
        dsv4_attn_backend=getattr(cfg, "dsv4_attn_backend", None),
        speculative_algorithm=cfg.speculative_algorithm,
        context_parallel=(getattr(cfg, "attn_cp_size", 1) or 1) > 1
        or bool(getattr(cfg, "enable_prefill_cp", False)),
        prefill_cp=bool(getattr(cfg, "enable_prefill_cp", False)),
        disaggregation_mode=None if cfg.disaggregation_mode == "null" else cfg.disaggregation_mode,
        dllm=bool(getattr(cfg, "dllm_algorithm", None)),
        hisparse=bool(getattr(cfg, "enable_hisparse", False)),
        page_size=max(1, int(cfg.page_size or 1)),
        shape=_model_shape(cfg, mc, capture_effects),
        memory=MemoryFacts(
            device=cfg.device,
            pp_size=cfg.pp_size,
            decode_graph_on=decode.backend != Backend.DISABLED,
            decode_max_bs=decode.max_bs or 0,
            prefill_node=cfg.disaggregation_mode == "prefill",
            kv_sized_after_capture=bool(post_capture_kv_sizing_planned(server_args)),
            kv_cache_dtype=str(getattr(cfg, "kv_cache_dtype", "auto") or "auto"),
            max_total_tokens=getattr(cfg, "max_total_tokens", None),
        ),
        dp_lm_head=bool(cfg.enable_dp_lm_head),
        draft_tokens=max(
            int(cfg.speculative_num_draft_tokens or 0), int(cfg.speculative_eagle_topk or 0), 1
        ),
        prefill_graph=_phase_graph(server_args, cfg, Phase.PREFILL),
        decode_graph=decode,
        rules_holding=tuple(HeldRule(r.name, r.reason) for r in matching_rules(server_args)),
        fp8_block_checkpoint=_fp8_block_checkpoint(mc),
    )


def _fp8_block_checkpoint(model_config) -> bool:
    quant = dict(getattr(model_config, "hf_quant_config", None) or {})
    method = getattr(model_config, "quantization", None) or quant.get("quant_method")
    return method == "fp8" and list(quant.get("weight_block_size") or ()) == [128, 128]


def _kernel_heads(heads: int, attn_tp_size: int) -> int:
    """The decode kernel's query heads per rank, as `MqaAttentionBase._kernel_num_heads`
    (models.deepseek_v4) pads them off SM120: the local heads with one attention-TP rank,
    else 64 or all heads."""
    local = heads // max(1, attn_tp_size)
    if attn_tp_size <= 1:
        return local
    return 64 if local <= 64 else heads


def _indexer_logits_in_torch(cfg) -> bool:
    """Whether DeepSeek-V4's c4 indexer computes its paged logits in torch, per head (the
    estimate's large torch-logits peak). `C4IndexerBackendMixin.forward_c4_indexer`
    (layers.attention.dsv4.indexer) picks the first of: DeepGEMM's FP4 kernel (the FP4 indexer),
    TileLang, AITER, torch; SGLang sets both TileLang and torch on SM120
    (`arg_groups.model_hook`), where TileLang is the one that runs."""
    from sglang.srt.environ import envs

    if bool(getattr(cfg, "enable_deepseek_v4_fp4_indexer", False)):
        return False
    if envs.SGLANG_OPT_USE_TILELANG_INDEXER.get() or envs.SGLANG_OPT_USE_AITER_INDEXER.get():
        return False
    return bool(envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.get())


def _model_shape(cfg, mc, effects: frozenset[CaptureEffect]) -> ModelShape:
    """The capture-memory model's view of the model (core.capture_memory.ModelShape)."""
    from sglang.srt.configs.model_config import is_deepseek_v4

    from sglang_mixgraph.core.capture_memory import SparseIndexerShape

    hf = mc.hf_config
    text = getattr(hf, "text_config", None) or hf
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    hc = int(getattr(text, "hc_mult", 1) or 1)
    sparse = None
    if is_deepseek_v4(hf):
        page = int(cfg.page_size or 256)
        requested = cfg.cuda_graph_config.prefill.max_context_size
        if requested:
            # page-aligned as `cuda_graph_hook._resolve_max_context_size` does
            width = -(-int(requested) // page) * page
        else:
            width = int(cfg.context_length or mc.context_len)
        sparse = SparseIndexerShape(
            index_topk=int(getattr(text, "index_topk", 512)),
            context_width=width,
            page_size=page,
            swa_window=int(getattr(text, "sliding_window", 128) or 128),
            index_heads=int(getattr(text, "index_n_heads", 64) or 64),
            torch_logits=_indexer_logits_in_torch(cfg),
            logits_eager=CaptureEffect.INDEXER_LOGITS_EAGER in effects,
            decode_tail_heads=_kernel_heads(
                int(getattr(text, "num_attention_heads", 0) or 0),
                _attn_tp_size(cfg),
            )
            if CaptureEffect.DECODE_TAIL_GRAPHS in effects
            else 0,
        )
    return ModelShape(hidden_size=hidden, hidden_multiplier=hc, sparse=sparse)
