"""Split a DeepSeek-V4 mixed step at the prefill/decode boundary.

Upstream sends every row of a MIXED batch through the sparse-prefill path, which dequantizes each
request's SWA window and compressed history into a bf16 workspace
(``DeepseekV4AttnBackend._forward_prefill_sparse``); the decode rows pay for that workspace
although the fp8 decode kernel (``flash_mla_with_kvcache``, upstream's pure-decode path) reads
the paged cache directly. With ``SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1`` the decode rows take the
decode kernel and the workspace covers only the prefill requests, in eager steps and inside
breakable-graph replays. Modules: ``boundary`` (which rows decode), ``plan`` (the per-step
decision), ``forward`` (the split attention), ``state`` (flags, plan, counters). Anything not
handled falls back to upstream for the whole step, said once per reason. docs/mixed-split.md
opens with the hooks in the order a step meets them; the policy is docs/adaptive-split.md.
Why, how, the upstream PR and the retire condition: `PATCH` (`doctor` prints them).
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph.core.capture_effects import CaptureEffect
from sglang_mixgraph.patches.mixed_split.boundary import (
    after_eager_load_batch,
    after_forward_batch_init_new,
    decode_tail_of,
    num_decode_requests,
)
from sglang_mixgraph.patches.mixed_split.forward import (
    around_build_chunk_cache,
    around_forward_prefill_sparse,
    around_forward_prefill_sparse_q8kv8,
)
from sglang_mixgraph.patches.mixed_split.plan import (
    after_init_forward_metadata,
    after_prepare_bcg_replay,
    plan_split,
)
from sglang_mixgraph.patches.mixed_split.state import (
    ALL_RATIOS,
    BACKEND,
    EAGER_RUNNER,
    EAGLE3_REFUSED,
    FALLBACK_REASONS,
    FALLBACKS,
    FALLBACKS_BY_KEY,
    FORWARD_BATCH,
    PATCH_ID,
    POLICY_FLAG,
    SPLIT_FLAG,
    TAIL_GRAPHS_FLAG,
    SplitPlan,
    SplitPlanError,
    get_plan,
    tail_graphs_act,
)
from sglang_mixgraph.registry import Hook, Patch

__all__ = [
    "ALL_RATIOS",
    "FALLBACK_REASONS",
    "FALLBACKS",
    "HOOKS",
    "PATCH",
    "PATCH_ID",
    "POLICY_FLAG",
    "SPLIT_FLAG",
    "TAIL_GRAPHS_FLAG",
    "SplitPlan",
    "SplitPlanError",
    "after_eager_load_batch",
    "after_forward_batch_init_new",
    "after_init_forward_metadata",
    "after_prepare_bcg_replay",
    "around_build_chunk_cache",
    "around_forward_prefill_sparse",
    "around_forward_prefill_sparse_q8kv8",
    "decode_tail_of",
    "tail_graphs_act",
    "explain_for_deployment",
    "get_plan",
    "num_decode_requests",
    "plan_split",
]

_SPARSE_SIG = "self, q, layer_id, compress_ratio, forward_batch, token_to_kv_pool, core_attn_metadata, attn_sink"

HOOKS = (
    Hook(
        f"{FORWARD_BATCH}.init_new",
        "classmethod",
        "cls, batch, model_runner, *, capture_hidden_mode, return_hidden_states_before_norm, "
        "extend_position_info, spec_mrope_positions, kv_loc_plan, write_cols",
        HookType.AFTER,
        after_forward_batch_init_new,
    ),
    Hook(
        f"{EAGER_RUNNER}.load_batch",
        "method",
        "self, forward_batch, pp_proxy_tensors, **kwargs",
        HookType.AFTER,
        after_eager_load_batch,
    ),
    Hook(
        f"{BACKEND}.init_forward_metadata",
        "method",
        "self, forward_batch",
        HookType.AFTER,
        after_init_forward_metadata,
    ),
    Hook(
        f"{BACKEND}.prepare_forward_metadata_for_breakable_cuda_graph_replay",
        "method",
        "self, capture_metadata, forward_batch, *, static_forward_batch",
        HookType.AFTER,
        after_prepare_bcg_replay,
    ),
    Hook(
        f"{BACKEND}._build_sparse_prefill_chunk_cache",
        "method",
        "self, forward_batch, core_attn_metadata, *, num_qo_tokens",
        HookType.AROUND,
        around_build_chunk_cache,
    ),
    Hook(
        f"{BACKEND}._forward_prefill_sparse",
        "method",
        _SPARSE_SIG + ", cos_sin_cache",
        HookType.AROUND,
        around_forward_prefill_sparse,
    ),
    Hook(
        f"{BACKEND}._forward_prefill_sparse_q8kv8",
        "method",
        _SPARSE_SIG,
        HookType.AROUND,
        around_forward_prefill_sparse_q8kv8,
    ),
)


def explain_for_deployment(plan) -> str:
    """For `plan`: what the split would do in a deployment (a graph_plan.GraphPlan).

    The runtime checks in `_unsupported_reason` still decide per step; this names the
    deployment-wide reasons they will hit (the `FALLBACKS` a deployment shows), and the graph
    interaction.
    """
    facts = plan.facts
    if not facts.deepseek_v4:
        return "not a DeepSeek-V4 model: nothing to split"
    if FALLBACKS_BY_KEY["spec_eagle3"].deployment(plan):
        return f"nothing to split: {EAGLE3_REFUSED}, so such a server does not start"
    for fallback in FALLBACKS:
        if fallback.deployment is not None and fallback.deployment(plan):
            return f"falls back to upstream: {fallback.text}"
    dp_attention = facts.attn_dp_size > 1
    if facts.speculative_algorithm and not facts.mixed_chunk:
        return (
            "speculative decoding with mixed chunk off: decode steps are verify steps, nothing "
            "to split"
        )
    if facts.mixed_chunk:
        acts = "splits mixed steps at the prefill/decode boundary"
        if facts.speculative_algorithm:
            acts += (
                f" ({facts.speculative_algorithm}: the target model's mixed steps, whose running "
                "requests are 1-token decodes there; verify steps and the draft model's forwards "
                "keep upstream's path)"
            )
    elif dp_attention:
        acts = "no mixed steps (mixed chunk off); splits DP-attention decode batches relabelled to EXTEND"
    else:
        return "no mixed steps (mixed chunk off) and no DP attention: nothing to split"
    acts += f" (policy {POLICY_FLAG.get()})"
    prefill = plan.prefill
    if prefill.backend == "breakable" and prefill.buckets:
        acts += (
            f"; steps of up to {max(prefill.buckets)} tokens replay breakable prefill graphs and "
            "split inside the replay's attention break, larger ones split in eager steps"
        )
    else:
        acts += "; in eager steps (no breakable prefill graph)"
    return acts


def _calibration() -> dict:
    """For `doctor`: the split cost model's calibration for this machine's GPU (the fallback,
    with its margin, where there is none or no file for it): the file, its architecture and
    the source of each kind of coefficient."""
    from sglang_mixgraph.core import split_cost_model as scm

    return scm.calibration_info(scm.load_coefficients(scm.detect_arch()))


def _is_enabled() -> bool:
    POLICY_FLAG.get()  # a bad policy value stops startup even before the split flag is read
    return bool(SPLIT_FLAG.get())


PATCH = Patch(
    id=PATCH_ID,
    summary="DSV4 mixed prefill/decode split: decode rows via the fp8 decode kernel, "
    "prefill-only sparse workspace, in eager steps and breakable-graph replays",
    flags=(SPLIT_FLAG, POLICY_FLAG, TAIL_GRAPHS_FLAG),
    hooks=HOOKS,
    is_enabled=_is_enabled,
    explain=explain_for_deployment,
    calibration=_calibration,
    capture_effects=lambda: (
        frozenset({CaptureEffect.DECODE_TAIL_GRAPHS}) if tail_graphs_act() else frozenset()
    ),
    why=(
        "upstream sends every row of a DeepSeek-V4 MIXED batch through the sparse-prefill path "
        "(DeepseekV4AttnBackend._forward_prefill_sparse), whose bf16 workspace dequantizes each "
        "request's SWA window and compressed history, decode rows included, although the fp8 "
        "decode kernel (flash_mla_with_kvcache, upstream's pure-decode path) reads the paged "
        "cache directly"
    ),
    how=(
        "the step is planned once (metadata init, or the breakable-graph replay prepare): the "
        "prefill rows keep upstream's sparse-prefill body with a chunk cache over the prefill "
        "requests only, the decode rows take the fp8 decode kernel, in eager steps and inside "
        "replays, with one chunk cache per step; the adaptive policy splits a step only where "
        "the per-GPU cost model (the step's layers and its chunk-cache builds) predicts a gain; "
        "anything not handled falls back to upstream for the whole step, said once per reason"
    ),
    upstream_pr=(
        "SGLang PR #30338 splits DeepSeek-V4 mixed steps at the prefill/decode boundary in the "
        "DSV4 attention backend (it adds SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN, the switch this "
        "patch borrows); SGLang PR #30420 carries the split into breakable-graph replays"
    ),
    retired_by=(
        "an upstream split of mixed steps in the DSV4 backend; once SGLang defines "
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN itself, the patch defers to it"
    ),
    docs_page="docs/mixed-split.md",
)
