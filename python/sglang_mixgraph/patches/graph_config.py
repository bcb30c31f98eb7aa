"""Prefill graph configuration derived for mixed chunked prefill (DeepSeek-V4, GLM-5).

Hooks (all during server-argument resolution, except the last):

* AROUND `cuda_graph_hook.disable_breakable_cudagraph_if_incompatible`
  (sglang/srt/arg_groups/cuda_graph_hook.py:170-255), through the shared rule hook: when the DeepSeek-V4
  "capture-pool memory pressure" rule (195-202) is the only rule that holds and
  `SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto`, the blanket disable is deferred: BCG stays on
  for now and the capture-memory estimate decides later, once the bucket list and the
  memory budget are final. Any other matching rule keeps upstream's behaviour.
* AROUND `mega_moe_hook.validate_mega_moe_token_budget_for_model`
  (sglang/srt/arg_groups/mega_moe_hook.py:78-91; the pipeline calls it after the DP split
  of the chunk, the memory settings and speculative resolution, pipeline.py:324). Upstream
  runs first; then
  - derived buckets: replace the generic prefill bucket list (cuda_graph_hook.py:480-497, applied at
    memory_hook.py:265-268 and re-clamped per DP rank at parallel_hook.py:344-362) by the
    derived list of `core.prefill_buckets`, unless the user set `--cuda-graph-bs-prefill`
    or `--cuda-graph-max-bs-prefill`;
  - the capture-memory estimate: settle a deferred DSV4 decision with `core.capture_memory`;
  - startup validation: reject a prefill bucket above `SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK`
    (capture would hit the assert in sglang/srt/layers/moe/mega_moe.py:441-447, because
    `should_use_mega_moe` is always true under capture, 184-185), and report how the
    logits multimem all-gather is sized for mixed steps.
* AROUND `triton_symm_mem_ag.recommended_max_tokens`
  (sglang/srt/distributed/device_communicators/triton_symm_mem_ag.py:427-445), at model
  init in every scheduler: the logits processor sizes its multimem all-gather with
  `include_prefill=False` (sglang/srt/layers/logits_processor.py:517-522), i.e. for
  max_running_requests rows, but a mixed step gathers the decode rows plus the prefill
  requests' rows; larger inputs silently take NCCL (triton_symm_mem_ag.py:495-520). With
  mixed chunk on and no speculative decoding we size it for the mixed bound.

The patch is on with the default `SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto` (so the startup checks run
by default); `upstream` switches all of it off and leaves SGLang untouched. The hooks also
read the flag when they run, so a process that installed them behaves like upstream once
the flag says `upstream`. Configurations it does not handle keep upstream's behaviour,
logged once.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import choice_flag
from sglang_mixgraph.patches.force_bcg import RULES_HOOK
from sglang_mixgraph.registry import Hook, Patch

logger = logging.getLogger("sglang_mixgraph")

PATCH_ID = "graph_config"
VALIDATE_TARGET = "sglang.srt.arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model"
LOGITS_TARGET = (
    "sglang.srt.distributed.device_communicators.triton_symm_mem_ag.recommended_max_tokens"
)

PREFILL_BUCKETS = choice_flag(
    "SGLANG_MIXGRAPH_PREFILL_BUCKETS",
    "auto",
    ("auto", "upstream"),
    "Prefill CUDA-graph buckets: 'auto' derives a short list from the per-rank chunk, the "
    "running requests per DP rank and the MoE cap, and lets the capture-memory estimate "
    "replace the blanket DeepSeek-V4 BCG rule; 'upstream' keeps SGLang's generic list and rule.",
    off_value="upstream",
)

# Upstream's logits all-gather floor (logits_processor.py:518-520).
LOGITS_GATHER_FLOOR = 128


class GraphConfigError(ValueError):
    """A prefill graph configuration that would fail during capture."""


def _auto() -> bool:
    return PREFILL_BUCKETS.get() == "auto"


def is_designed_model(hf_config) -> bool:
    """The sparse-MLA models the derivation and the estimate are built for: DeepSeek-V4, GLM-5."""
    from sglang.srt.configs.model_config import is_deepseek_v4, is_glm_moe_dsa

    return bool(is_deepseek_v4(hf_config) or is_glm_moe_dsa(hf_config))


def out_of_scope(server_args) -> str | None:
    """Why this deployment is left exactly as upstream resolves it, or None when the patch is
    designed for it: mixed chunked prefill on a sparse-MLA model."""
    from sglang.srt.arg_groups.overrides import model_config_of, resolving_view

    if not resolving_view(server_args).enable_mixed_chunk:
        return "mixed chunked prefill is off"
    if not is_designed_model(model_config_of(server_args).hf_config):
        return "not a DeepSeek-V4 or GLM-5 model"
    return None


# --------------------------------------------------------------------------- rules


def estimate_applies(server_args) -> bool:
    """Whether the capture-memory estimate may replace the blanket DeepSeek-V4 BCG rule here
    (the rule hook's estimate mode, `bcg_rules.rules_hook`)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    if not _auto() or out_of_scope(server_args) is not None:
        return False
    if resolving_view(server_args).enable_prefill_cp:
        fallback_once(PATCH_ID, "prefill context parallelism: upstream's DSV4 BCG rule applies")
        return False
    return True


# --------------------------------------------------------------------------- inputs


def _ctx(server_args) -> dict[str, Any]:
    """Everything the derivation, the estimate and the validations read, in one place."""
    from sglang.srt.arg_groups.overrides import model_config_of, resolved_view, resolving_view
    from sglang.srt.runtime_context import attn_dp_enabled_of

    cfg = resolving_view(server_args)
    model_config = model_config_of(server_args)
    hf = model_config.hf_config
    attn_dp_enabled = bool(attn_dp_enabled_of(resolved_view(server_args)))
    attn_dp = cfg.attn_dp_size if attn_dp_enabled else 1
    attn_tp = max(1, cfg.tp_size // max(1, cfg.attn_dp_size) // max(1, cfg.attn_cp_size))
    mrr = cfg.max_running_requests
    return dict(
        cfg=cfg,
        hf=hf,
        model_config=model_config,
        attn_dp_enabled=attn_dp_enabled,
        attn_dp=attn_dp,
        attn_tp=attn_tp,
        chunk=cfg.chunked_prefill_size,
        running_per_rank=(max(1, mrr // attn_dp) if mrr else None),
        a2a=resolved_view(server_args).moe_a2a_backend,
    )


def _mega_moe_cap(server_args) -> int | None:
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_platform

    cfg = resolving_view(server_args)
    if cfg.moe_a2a_backend != "megamoe" or get_platform().is_hip:
        return None
    return int(envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())


def _unhandled(ctx: dict) -> str | None:
    from sglang.srt.model_executor.cuda_graph_config import Backend

    cfg = ctx["cfg"]
    prefill = cfg.cuda_graph_config.prefill
    if prefill.backend != Backend.BREAKABLE:
        return (
            None
            if prefill.backend == Backend.DISABLED
            else f"prefill graph backend {prefill.backend!r}"
        )
    if cfg.pp_size > 1:
        return "pipeline parallelism (upstream's PP bucket policy applies)"
    if cfg.enable_prefill_cp:
        return "prefill context parallelism"
    if cfg.speculative_algorithm is not None:
        return "speculative decoding"
    if cfg.disaggregation_mode == "decode":
        return "PD decode node"
    if getattr(cfg, "dllm_algorithm", None):
        return "diffusion LLM inference"
    if cfg.chunked_prefill_size is None or cfg.chunked_prefill_size <= 0:
        return "chunked prefill disabled"
    return None


def model_shape(server_args, prefill_max_context: int | None = None):
    """The capture-memory model's view of the model (core.capture_memory.ModelShape)."""
    from sglang.srt.arg_groups.overrides import model_config_of, resolving_view
    from sglang.srt.configs.model_config import is_deepseek_v4

    from sglang_mixgraph.core.capture_memory import ModelShape, SparseIndexerShape

    cfg = resolving_view(server_args)
    mc = model_config_of(server_args)
    hf = mc.hf_config
    text = getattr(hf, "text_config", None) or hf
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    hc = int(getattr(text, "hc_mult", 1) or 1)
    sparse = None
    if is_deepseek_v4(hf):
        page = int(cfg.page_size or 256)
        requested = (
            prefill_max_context
            if prefill_max_context is not None
            else cfg.cuda_graph_config.prefill.max_context_size
        )
        if requested:
            width = -(-int(requested) // page) * page  # cuda_graph_hook.py:429 page-aligns it
        else:
            width = int(cfg.context_length or mc.context_len)
        sparse = SparseIndexerShape(
            index_topk=int(getattr(text, "index_topk", 512)),
            context_width=width,
            page_size=page,
            swa_window=int(getattr(text, "sliding_window", 128) or 128),
        )
    return ModelShape(hidden_size=hidden, hidden_multiplier=hc, sparse=sparse)


def memory_for(server_args, chunk_per_rank: int):
    """core.capture_memory.MemoryBudget from the resolved memory settings."""
    from sglang.srt.arg_groups.overrides import resolved_view, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import attn_dp_enabled_of
    from sglang.srt.utils.common import get_device_memory_capacity

    from sglang_mixgraph.core.capture_memory import MiB, decode_graph_reserve_bytes, memory_budget

    cfg = resolving_view(server_args)
    gpu_mib = get_device_memory_capacity(cfg.device)
    if not gpu_mib or cfg.mem_fraction_static is None:
        return None
    decode = cfg.cuda_graph_config.decode
    decode_on = decode.backend != Backend.DISABLED
    prefill_node = cfg.disaggregation_mode == "prefill"
    a2a = resolved_view(server_args).moe_a2a_backend
    return memory_budget(
        total_bytes=int(gpu_mib * MiB),
        mem_fraction_static=float(cfg.mem_fraction_static),
        chunk_per_rank=chunk_per_rank,
        tp_size=cfg.tp_size,
        pp_size=cfg.pp_size,
        decode_reserve_bytes=decode_graph_reserve_bytes(
            decode_max_bs=decode.max_bs or 0,
            decode_graph_on=decode_on,
            attn_dp_enabled=bool(attn_dp_enabled_of(resolved_view(server_args))),
            attn_dp_size=cfg.attn_dp_size,
            prefill_node=prefill_node,
        ),
        # memory_hook.py:402-414
        deepep_reserve_bytes=(
            2 * 1024 * MiB if decode_on and not prefill_node and a2a == "deepep" else 0
        ),
    )


def capture_estimate(server_args, buckets, chunk_per_rank: int) -> dict:
    """Estimate + verdict + advice, JSON-ready (used by the hook and by graph_plan)."""
    from sglang.srt.arg_groups.overrides import post_capture_kv_sizing_planned

    from sglang_mixgraph.core.capture_memory import (
        decide,
        estimate_capture_bytes,
        largest_fitting_prefix,
    )

    shape = model_shape(server_args)
    est = estimate_capture_bytes(buckets, shape)
    budget = memory_for(server_args, chunk_per_rank)
    out = {
        "estimate": est.as_dict(),
        "model": {"hidden": shape.hidden_size, "hc_mult": shape.hidden_multiplier},
    }
    if shape.sparse is not None:
        out["model"]["capture_context_width"] = shape.sparse.context_width
        out["model"]["index_topk"] = shape.sparse.index_topk
    if budget is None:
        out["verdict"] = {"fits": None, "why": "GPU memory or mem_fraction_static unknown"}
        return out
    out["budget"] = budget.as_dict()
    verdict = decide(est.total, budget.available)
    out["verdict"] = verdict.as_dict()
    if post_capture_kv_sizing_planned(server_args):
        out["verdict"]["note"] = (
            "the KV pool is sized after capture: capture memory comes out of the KV pool"
        )
    if not verdict.fits:
        out["advice"] = {
            "max_bs_prefill": largest_fitting_prefix(buckets, shape, budget.available),
            "mem_fraction_static_at_most": _mfs_that_fits(
                est.total, budget, verdict.margin_fraction
            ),
        }
    return out


def _mfs_that_fits(needed: int, budget, margin: float) -> float | None:
    reserves = sum(budget.reserves.values())
    outside = needed / (1.0 - margin) + reserves
    mfs = 1.0 - outside / budget.total_bytes
    return round(mfs, 3) if mfs > 0 else None


# --------------------------------------------------------------------------- derived buckets


def derived_buckets_for(server_args) -> tuple[list[int] | None, str]:
    """(derived list or None, policy label) for the current resolving view."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    from sglang_mixgraph.core.prefill_buckets import (
        BucketDerivationError,
        bucket_alignment,
        ceil_align,
        derive_prefill_buckets,
    )

    ctx = _ctx(server_args)
    cfg = ctx["cfg"]
    prefill = cfg.cuda_graph_config.prefill
    locked = getattr(server_args, "_cuda_graph_config_locked", set()) or set()
    if (Phase.PREFILL, "bs") in locked or (Phase.PREFILL, "max_bs") in locked:
        return None, "user"
    if not _auto():
        return None, "upstream"
    if prefill.backend == Backend.DISABLED:
        return None, "prefill graph off"
    reason = _unhandled(ctx)
    if reason is not None:
        fallback_once(PATCH_ID, f"prefill buckets: {reason}")
        return None, f"upstream (fallback: {reason})"
    top = ctx["chunk"]
    if prefill.max_bs:
        top = min(
            top, prefill.max_bs
        )  # upstream caps: MLA 8192, max_total_tokens (memory_hook.py:233-263)
    cap = _mega_moe_cap(server_args)
    alignment = bucket_alignment(attn_tp_size=ctx["attn_tp"], deepep=ctx["a2a"] == "deepep")
    if cap is not None and ceil_align(top, alignment) > cap:
        # A steady mixed step is C tokens; its bucket cannot fit under the cap. Upstream
        # checks the chunk against the cap only for some checkpoints
        # (mega_moe_hook.py:88-91); with a prefill graph, capture would assert.
        raise GraphConfigError(
            f"MegaMoE: the per-rank chunked prefill size {top} (a steady mixed step, so the "
            f"largest prefill CUDA-graph bucket) exceeds SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK="
            f"{cap}. Raise the variable to at least {ceil_align(top, alignment)}, lower "
            f"--chunked-prefill-size to {cap * ctx['attn_dp']} or less, or --disable-prefill-cuda-graph."
        )
    try:
        derived = derive_prefill_buckets(
            chunk_per_rank=top,
            running_per_rank=ctx["running_per_rank"],
            cap=cap,
            alignment=alignment,
        )
    except BucketDerivationError as e:
        fallback_once(PATCH_ID, f"prefill buckets: {e}")
        return None, f"upstream (fallback: {e})"
    return derived, "auto"


def _apply_buckets(server_args) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Phase, with_phase

    from sglang_mixgraph.bcg_rules import decisions_for

    record = decisions_for(server_args)
    cfg = resolving_view(server_args)
    prefill = cfg.cuda_graph_config.prefill
    record.upstream_buckets = list(prefill.bs) if prefill.bs else None
    derived, policy = derived_buckets_for(server_args)
    record.bucket_policy = policy
    record.derived_buckets = derived
    if derived is None or derived == list(prefill.bs or []):
        return
    declare_resolution(
        server_args,
        "sglang_mixgraph.graph_config",
        cuda_graph_config=with_phase(
            cfg.cuda_graph_config, Phase.PREFILL, bs=derived, max_bs=derived[-1]
        ),
    )
    logger.info(
        "sglang-mixgraph: prefill CUDA-graph buckets derived for mixed chunked prefill "
        "(SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto): %s instead of %d generic buckets up to %s.",
        derived,
        len(record.upstream_buckets or []),
        max(record.upstream_buckets) if record.upstream_buckets else None,
    )


# --------------------------------------------------------------------------- capture-memory estimate


def _settle_deferred_dsv4(server_args) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    from sglang_mixgraph.bcg_rules import Source, decisions_for
    from sglang_mixgraph.core.capture_memory import fmt_bytes

    record = decisions_for(server_args)
    if record.prefill_backend_source is not Source.ESTIMATE_PENDING:
        return
    cfg = resolving_view(server_args)
    prefill = cfg.cuda_graph_config.prefill
    if prefill.backend != Backend.BREAKABLE or not prefill.bs:
        record.prefill_backend_source = Source.UPSTREAM_LATER
        return
    chunk = (
        cfg.chunked_prefill_size
        if cfg.chunked_prefill_size and cfg.chunked_prefill_size > 0
        else max(prefill.bs)
    )
    result = capture_estimate(server_args, prefill.bs, chunk)
    record.estimate = result
    verdict = result["verdict"]
    if verdict.get("fits") is None:
        # Without memory numbers the estimate cannot decide; upstream's rule stands.
        fallback_once(
            PATCH_ID, f"capture-memory estimate: {verdict.get('why')}; upstream's DSV4 rule applies"
        )
        record.prefill_backend_source = Source.UPSTREAM_RULE
        record.deciding_rule = record.rule_matches[0]["name"]
        record.rule_matches[0]["action"] = "disables (estimate unavailable)"
        declare_resolution(
            server_args,
            "sglang_mixgraph.graph_config",
            cuda_graph_config=with_phase(
                cfg.cuda_graph_config, Phase.PREFILL, backend=Backend.DISABLED
            ),
        )
        return
    needed, available = verdict["needed_bytes"], verdict["available_bytes"]
    if verdict["fits"]:
        record.prefill_backend_source = Source.ESTIMATE
        record.rule_matches[0]["action"] = "replaced by the capture-memory estimate: fits"
        logger.info(
            "sglang-mixgraph: breakable prefill CUDA graph kept on for DeepSeek-V4: estimated capture "
            "memory %s for %d buckets up to %d tokens fits in %s (after weights, KV pool and the "
            "static reserve; %d%% margin).",
            fmt_bytes(needed),
            len(prefill.bs),
            max(prefill.bs),
            fmt_bytes(available),
            int(verdict["required_margin_fraction"] * 100),
        )
        return
    advice = result.get("advice", {})
    hints = ["fewer buckets (--cuda-graph-bs-prefill)"]
    if advice.get("max_bs_prefill"):
        hints.append(f"--cuda-graph-max-bs-prefill {advice['max_bs_prefill']}")
    if result["model"].get("capture_context_width"):
        hints.append(
            "a smaller --cuda-graph-prefill-max-context (now %d)"
            % result["model"]["capture_context_width"]
        )
    if advice.get("mem_fraction_static_at_most") is not None:
        hints.append(
            f"--mem-fraction-static {advice['mem_fraction_static_at_most']} or lower (now {cfg.mem_fraction_static})"
        )
    logger.warning(
        "sglang-mixgraph: breakable prefill CUDA graph disabled for DeepSeek-V4: estimated capture "
        "memory %s for %d buckets up to %d tokens does not fit in %s available after weights, KV "
        "pool and the static reserve (with a %d%% margin). To keep it on, try: %s.",
        fmt_bytes(needed),
        len(prefill.bs),
        max(prefill.bs),
        fmt_bytes(available),
        int(verdict["required_margin_fraction"] * 100),
        "; ".join(hints),
    )
    record.prefill_backend_source = Source.ESTIMATE
    record.rule_matches[0]["action"] = (
        "replaced by the capture-memory estimate: does not fit, disabled"
    )
    declare_resolution(
        server_args,
        "sglang_mixgraph.graph_config",
        cuda_graph_config=with_phase(
            cfg.cuda_graph_config, Phase.PREFILL, backend=Backend.DISABLED
        ),
    )


# --------------------------------------------------------------------------- startup validation


def validations(server_args) -> list[dict]:
    """Startup checks of the final prefill graph configuration: name, ok, message."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.core.prefill_buckets import ceil_align

    if out_of_scope(server_args) is not None:
        return []
    cfg = resolving_view(server_args)
    prefill = cfg.cuda_graph_config.prefill
    ctx = _ctx(server_args)
    out = []
    cap = _mega_moe_cap(server_args)
    if cap is not None and prefill.backend != Backend.DISABLED and prefill.bs:
        # The runner rounds capture sizes up to the attention-TP width (prefill_cuda_graph_runner.py:164-170).
        captured = sorted({ceil_align(b, ctx["attn_tp"]) for b in prefill.bs})
        over = [b for b in captured if b > cap]
        if over:
            msg = (
                f"MegaMoE: prefill CUDA-graph buckets {over} (tokens per rank, as captured) exceed "
                f"SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK={cap}; capture would fail the "
                f"MegaMoE token assert (sglang/srt/layers/moe/mega_moe.py:441-447). Raise the variable "
                f"to at least {max(over)}, drop those buckets from --cuda-graph-bs-prefill, set "
                f"--cuda-graph-max-bs-prefill {cap} or lower, or --disable-prefill-cuda-graph."
            )
            out.append({"name": "mega_moe_cap_covers_prefill_buckets", "ok": False, "message": msg})
        else:
            out.append(
                {
                    "name": "mega_moe_cap_covers_prefill_buckets",
                    "ok": True,
                    "message": f"largest prefill bucket {max(captured)} <= MegaMoE cap {cap}",
                }
            )
    out.append(logits_gather_check(server_args))
    return [v for v in out if v is not None]


def logits_gather_check(server_args) -> dict | None:
    """Whether the logits multimem all-gather covers a mixed step's sampling rows."""
    from sglang.srt.arg_groups.overrides import resolving_view

    from sglang_mixgraph.core.prefill_buckets import mixed_sampling_rows_bound

    cfg = resolving_view(server_args)
    ctx = _ctx(server_args)
    name = "logits_multimem_gather_covers_mixed_steps"
    # logits_processor.py:476-488, 517-522: the gatherer serves the TP vocab all-gather
    # unless the DP LM head (attn-TP group) is used.
    if cfg.tp_size <= 1 or cfg.enable_dp_lm_head:
        return {"name": name, "ok": True, "message": "not used (tp 1 or --enable-dp-lm-head)"}
    if not cfg.enable_mixed_chunk:
        return {
            "name": name,
            "ok": True,
            "message": "mixed chunk off: upstream sizing covers decode steps",
        }
    mrr = cfg.max_running_requests
    draft = max(int(cfg.speculative_num_draft_tokens or 0), int(cfg.speculative_eagle_topk or 0), 1)
    upstream_rows = max((mrr or 0) * draft, LOGITS_GATHER_FLOOR)  # triton_symm_mem_ag.py:427-445
    if not mrr:
        return {
            "name": name,
            "ok": False,
            "severity": "warning",
            "message": (
                f"max_running_requests is sized at runtime, so the multimem all-gather is built for "
                f"{LOGITS_GATHER_FLOOR} rows; mixed steps with more sampling rows fall back to NCCL. "
                f"Set --max-running-requests to size it."
            ),
        }
    bound = mixed_sampling_rows_bound(
        running_per_rank=ctx["running_per_rank"],
        attn_dp_size=ctx["attn_dp"],
        attn_dp_enabled=ctx["attn_dp_enabled"],
        draft_tokens=draft,
    )
    if bound <= upstream_rows:
        return {
            "name": name,
            "ok": True,
            "message": f"capacity {upstream_rows} rows >= mixed bound {bound}",
        }
    if cfg.speculative_algorithm is not None:
        return {
            "name": name,
            "ok": False,
            "severity": "warning",
            "message": (
                f"mixed steps gather up to {bound} rows but the multimem all-gather holds "
                f"{upstream_rows}; larger steps fall back to NCCL (not resized under speculative decoding)"
            ),
        }
    return {
        "name": name,
        "ok": True,
        "message": (
            f"sized prefill-aware: {bound} rows (upstream sizes {upstream_rows}, which a mixed step "
            f"of R+1 rows per rank exceeds and would fall back to NCCL)"
        ),
        "rows": bound,
        "upstream_rows": upstream_rows,
    }


def _validate_around(original, server_args, **kwargs):
    from sglang_mixgraph.bcg_rules import decisions_for

    original(server_args, **kwargs)
    if not _auto():  # the patch is off: upstream behaviour only (installed for a test process)
        return
    why = out_of_scope(server_args)
    if why is not None:
        decisions_for(server_args).bucket_policy = f"upstream ({why})"
        return
    _apply_buckets(server_args)
    _settle_deferred_dsv4(server_args)
    record = decisions_for(server_args)
    record.validations = validations(server_args)
    for v in record.validations:
        if not v["ok"] and v.get("severity") != "warning":
            raise GraphConfigError(v["message"])
        if not v["ok"]:
            logger.warning("sglang-mixgraph: %s", v["message"])
        elif v.get("rows"):
            logger.info("sglang-mixgraph: logits multimem all-gather %s", v["message"])


# --------------------------------------------------------------------------- runtime


def _recommended_max_tokens_around(original, *args, **kwargs):
    value = original(*args, **kwargs)
    include_prefill = kwargs.get("include_prefill", args[0] if args else True)
    if include_prefill or not _auto():
        return value
    try:
        from sglang.srt.arg_groups.overrides import model_config_of
        from sglang.srt.runtime_context import get_parallel, get_schedule, get_server_args, get_spec

        from sglang_mixgraph.core.prefill_buckets import mixed_sampling_rows_bound

        schedule = get_schedule()
        if not schedule.enable_mixed_chunk:
            return value
        if not is_designed_model(model_config_of(get_server_args()).hf_config):
            return value
        if get_spec().speculative_algorithm is not None:
            fallback_once(PATCH_ID, "logits all-gather sizing: speculative decoding")
            return value
        mrr = schedule.max_running_requests
        if not isinstance(mrr, int) or mrr <= 0:
            fallback_once(
                PATCH_ID, "logits all-gather sizing: max_running_requests unknown at model init"
            )
            return value
        parallel = get_parallel()
        dp = parallel.attn_dp_size if parallel.attn_dp_enabled else 1
        bound = mixed_sampling_rows_bound(
            running_per_rank=max(1, mrr // dp),
            attn_dp_size=dp,
            attn_dp_enabled=parallel.attn_dp_enabled,
        )
        return max(value, bound)
    except Exception as e:  # sizing must never break model init
        fallback_once(PATCH_ID, f"logits all-gather sizing: {type(e).__name__}: {e}")
        return value


PATCH = Patch(
    id=PATCH_ID,
    summary=(
        "derived prefill buckets, capture-memory estimate instead of the blanket DSV4 "
        "BCG rule, startup validation of the MegaMoE cap and the logits all-gather"
    ),
    flags=(PREFILL_BUCKETS,),
    hooks=(
        RULES_HOOK,
        Hook(VALIDATE_TARGET, "function", "server_args", HookType.AROUND, _validate_around),
        Hook(
            LOGITS_TARGET,
            "function",
            "include_prefill, floor",
            HookType.AROUND,
            _recommended_max_tokens_around,
        ),
    ),
    is_enabled=_auto,
)
