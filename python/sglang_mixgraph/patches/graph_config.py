"""`graph_config`: prefill CUDA graphs sized for mixed chunked prefill (DeepSeek-V4, GLM-5).

What: two switches. ``SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto`` (off by default) acts for mixed
chunked prefill of a sparse-MLA model only (anything else resolves exactly as upstream): the
rule hook (`rules_hook`) defers upstream's blanket DeepSeek-V4 BCG rule; AROUND
`mega_moe_hook.validate_mega_moe_token_budget_for_model` (late in resolution) the planner's
derived bucket list is applied, the deferred rule settled by the capture-memory estimate and the
startup validations run; AROUND `triton_symm_mem_ag.recommended_max_tokens` the logits
all-gather is sized for mixed steps. ``SGLANG_EXPERIMENTAL_FORCE_BCG=1`` runs the same rule hook
in forced mode (below). graph_plan.py computes; this module decides and applies. Off by default
because on a DeepSeek-V4-Pro rank slice on the H200 breakable replays of mixed steps were slower
than eager steps (docs/results/rank_slice_h200.md). Why and retire condition: `PATCH`.
"""

from __future__ import annotations

import enum
import logging

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph.bcg_rules import (
    A2A_RULE,
    DSV4_RULE,
    FORCEABLE_RULES,
    RULES_TARGET,
    GraphDecisions,
    Rule,
    RuleMatch,
    Source,
    decisions_for,
    forced_actions,
    matching_rules,
    recorded,
)
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag, choice_flag
from sglang_mixgraph.registry import Hook, Patch

logger = logging.getLogger("sglang_mixgraph")

PATCH_ID = "graph_config"
VALIDATE_TARGET = "sglang.srt.arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model"
LOGITS_TARGET = (
    "sglang.srt.distributed.device_communicators.triton_symm_mem_ag.recommended_max_tokens"
)

PREFILL_BUCKETS = choice_flag(
    "SGLANG_MIXGRAPH_PREFILL_BUCKETS",
    "upstream",
    ("auto", "upstream"),
    "Prefill CUDA-graph buckets: 'auto' derives a short list from the per-rank chunk, the "
    "running requests per DP rank and the MoE cap, and lets the capture-memory estimate "
    "replace the blanket DeepSeek-V4 BCG rule; 'upstream' keeps SGLang's generic list and rule.",
    off_value="upstream",
)
FORCE_BCG = bool_flag(
    "SGLANG_EXPERIMENTAL_FORCE_BCG",
    False,
    "Keep the breakable prefill CUDA graph on where upstream's DeepSeek-V4 capture-pool rule or "
    "its unvalidated a2a backend rule would turn it off; any other rule keeps upstream's "
    "decision. Each rule is logged by name, as overridden or kept.",
)


def _auto() -> bool:
    return PREFILL_BUCKETS.get() == "auto"


def _on() -> bool:
    return _auto() or bool(FORCE_BCG.get())


def estimate_applies(server_args) -> bool:
    """Whether the capture-memory estimate may replace the blanket DeepSeek-V4 BCG rule here
    (the rule hook's estimate mode)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    from sglang_mixgraph.graph_plan import out_of_scope

    if not _auto() or out_of_scope(server_args) is not None:
        return False
    if resolving_view(server_args).enable_prefill_cp:
        fallback_once(PATCH_ID, "prefill context parallelism: upstream's DSV4 BCG rule applies")
        return False
    return True


# --------------------------------------------------------------------------- the rule hook


class RuleMode(enum.Enum):
    """How the rule hook runs upstream's rule function for one resolution."""

    UPSTREAM = "upstream"  # call it: the first matching rule decides
    # SGLANG_EXPERIMENTAL_FORCE_BCG: override the FORCEABLE_RULES that hold; any other rule
    # that holds keeps upstream's decision (call the function). Upstream's only way past the
    # rules is an explicit --cuda-graph-backend-prefill, which also skips the pipeline-parallel
    # default and every later automatic choice; those other places that turn the prefill graph
    # off are not rules of that function and stay in force here.
    FORCED = "forced"
    ESTIMATE = "estimate"  # defer the DeepSeek-V4 rule, alone, to the capture-memory estimate


def rule_mode(server_args) -> RuleMode:
    if FORCE_BCG.get():
        return RuleMode.FORCED
    return RuleMode.ESTIMATE if estimate_applies(server_args) else RuleMode.UPSTREAM


def _upstream_decides(record: GraphDecisions, matches: list[Rule]) -> None:
    record.prefill_backend_source = Source.UPSTREAM_RULE
    record.deciding_rule = matches[0].name
    for m in record.rule_matches[1:]:
        m.action = "holds (not reached: an earlier rule decided)"


def _say_once(record: GraphDecisions, line: str) -> None:
    if line not in record.said:
        record.said.add(line)
        logger.warning("%s", line)


def _forced(original, server_args, record: GraphDecisions, matches: list[Rule], kwargs):
    actions, kept = forced_actions(matches)
    for rule, m, action in zip(matches, record.rule_matches, actions, strict=True):
        m.action = action
        if rule.name not in FORCEABLE_RULES:
            _say_once(
                record,
                f"sglang-mixgraph: SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps upstream rule "
                f"{rule.name!r} ({rule.reason}): the breakable prefill CUDA graph stays off as "
                f"upstream decides; FORCE_BCG overrides only the rules {DSV4_RULE!r} and "
                f"{A2A_RULE!r}.",
            )
        elif kept is None:
            _say_once(
                record,
                f"sglang-mixgraph: SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps the breakable prefill "
                f"CUDA graph on although upstream rule {rule.name!r} would disable it "
                f"({rule.reason}).",
            )
    if kept is None:
        record.prefill_backend_source = Source.FORCED if matches else None
        return None
    record.prefill_backend_source = Source.UPSTREAM_RULE
    record.deciding_rule = kept.name
    return original(server_args, **kwargs)  # upstream's decision: BCG off


def rules_hook(original, server_args, **kwargs):
    """AROUND upstream's rule function (`RULES_TARGET`), in the mode of `rule_mode`."""
    mode = rule_mode(server_args)
    record = decisions_for(server_args)
    matches = matching_rules(server_args)
    record.rule_matches = [RuleMatch(r.name, r.reason, "disables (upstream)") for r in matches]
    record.prefill_backend_source = record.deciding_rule = None
    if mode is RuleMode.FORCED:
        return _forced(original, server_args, record, matches, kwargs)
    if matches and mode is RuleMode.ESTIMATE and [r.name for r in matches] == [DSV4_RULE]:
        record.rule_matches[0].action = "deferred to the capture-memory estimate"
        record.prefill_backend_source = Source.ESTIMATE_PENDING
        logger.info(
            "sglang-mixgraph: upstream rule %r deferred; the breakable prefill CUDA graph is kept or "
            "disabled by the capture-memory estimate once the buckets are final.",
            DSV4_RULE,
        )
        return None
    if matches:
        _upstream_decides(record, matches)
    return original(server_args, **kwargs)


# --------------------------------------------------------------------------- derived buckets


def _derived_buckets(server_args, upstream_max_bs: int | None) -> tuple[list[int] | None, str]:
    """(the derived list to apply or None, the bucket policy `plan` reports)."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    from sglang_mixgraph.core.prefill_buckets import BucketDerivationError
    from sglang_mixgraph.graph_plan import deployment, derive_buckets, unhandled

    locked = getattr(server_args, "_cuda_graph_config_locked", set()) or set()
    if (Phase.PREFILL, "bs") in locked or (Phase.PREFILL, "max_bs") in locked:
        return None, "user"
    if resolving_view(server_args).cuda_graph_config.prefill.backend == Backend.DISABLED:
        return None, "prefill graph off"
    reason = unhandled(server_args)
    if reason is None:
        try:
            return derive_buckets(deployment(server_args), upstream_max_bs), "auto"
        except BucketDerivationError as e:
            reason = str(e)
    fallback_once(PATCH_ID, f"prefill buckets: {reason}")
    return None, f"upstream (fallback: {reason})"


def _apply_buckets(server_args) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Phase, with_phase

    record = decisions_for(server_args)
    cfg = resolving_view(server_args)
    prefill = cfg.cuda_graph_config.prefill
    upstream = list(prefill.bs or [])
    record.upstream_max_bs = prefill.max_bs
    derived, record.bucket_policy = _derived_buckets(server_args, prefill.max_bs)
    if derived is None or derived == upstream:
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
        len(upstream),
        max(upstream) if upstream else None,
    )


# --------------------------------------------------------------------------- capture-memory estimate


def _disable_prefill_graph(server_args) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    declare_resolution(
        server_args,
        "sglang_mixgraph.graph_config",
        cuda_graph_config=with_phase(
            resolving_view(server_args).cuda_graph_config, Phase.PREFILL, backend=Backend.DISABLED
        ),
    )


def _upstream_rule_stands(server_args, why: str, action: str) -> None:
    """Settle a deferred DeepSeek-V4 rule as upstream decides it: the prefill graph off.

    The deferral is only a promise that the estimate decides later; wherever the estimate
    cannot decide (no memory numbers, no bucket list, the deployment left the patch's scope
    later in resolution) upstream's rule must hold, or BCG would stay on where SGLang alone
    turns it off (`cuda_graph_hook.disable_breakable_cudagraph_if_incompatible`)."""

    record = decisions_for(server_args)
    rule = record.rule_matches[0]
    fallback_once(PATCH_ID, f"capture-memory estimate: {why}; upstream's DSV4 rule applies")
    record.prefill_backend_source = Source.UPSTREAM_RULE
    record.deciding_rule = rule.name
    rule.action = action
    _disable_prefill_graph(server_args)


def deferral_pending(server_args) -> bool:
    record = recorded(server_args)
    return record is not None and record.prefill_backend_source is Source.ESTIMATE_PENDING


def _settle_deferred_dsv4(server_args) -> None:
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_mixgraph.core.capture_memory import fmt_bytes
    from sglang_mixgraph.graph_plan import (
        UNKNOWN_BUDGET,
        capture_chunk,
        capture_estimate,
        deployment,
    )

    if not deferral_pending(server_args):
        return
    record = decisions_for(server_args)
    cfg = resolving_view(server_args)
    prefill = cfg.cuda_graph_config.prefill
    if prefill.backend != Backend.BREAKABLE:
        record.prefill_backend_source = Source.UPSTREAM_LATER
        return
    if not prefill.bs:
        # Nothing to estimate (chunked prefill off gives upstream an empty list).
        _upstream_rule_stands(
            server_args, "no prefill buckets", "disables (no prefill buckets to estimate)"
        )
        return
    report = capture_estimate(
        server_args, prefill.bs, capture_chunk(deployment(server_args), prefill.bs)
    )
    rule = record.rule_matches[0]
    verdict = report.verdict
    if verdict is None:
        # Without memory numbers the estimate cannot decide; upstream's rule stands.
        _upstream_rule_stands(server_args, UNKNOWN_BUDGET, "disables (estimate unavailable)")
        return
    record.prefill_backend_source = Source.ESTIMATE
    sizes = (
        fmt_bytes(verdict.needed),
        len(prefill.bs),
        max(prefill.bs),
        fmt_bytes(verdict.available),
        int(verdict.margin_fraction * 100),
    )
    if verdict.fits:
        rule.action = "replaced by the capture-memory estimate: fits"
        logger.info(
            "sglang-mixgraph: breakable prefill CUDA graph kept on for DeepSeek-V4: estimated capture "
            "memory %s for %d buckets up to %d tokens fits in %s (after weights, KV pool and the "
            "static reserve; %d%% margin).",
            *sizes,
        )
        return
    hints = ["fewer buckets (--cuda-graph-bs-prefill)"]
    if report.advice_max_bs_prefill:
        hints.append(f"--cuda-graph-max-bs-prefill {report.advice_max_bs_prefill}")
    if report.shape.sparse is not None:
        hints.append(
            "a smaller --cuda-graph-prefill-max-context (now %d)"
            % report.shape.sparse.context_width
        )
    if report.advice_mem_fraction_static is not None:
        hints.append(
            f"--mem-fraction-static {report.advice_mem_fraction_static} or lower "
            f"(now {cfg.mem_fraction_static})"
        )
    logger.warning(
        "sglang-mixgraph: breakable prefill CUDA graph disabled for DeepSeek-V4: estimated capture "
        "memory %s for %d buckets up to %d tokens does not fit in %s available after weights, KV "
        "pool and the static reserve (with a %d%% margin). To keep it on, try: %s.",
        *sizes,
        "; ".join(hints),
    )
    rule.action = "replaced by the capture-memory estimate: does not fit, disabled"
    _disable_prefill_graph(server_args)


# --------------------------------------------------------------------------- the resolution hook


def _validate_around(original, server_args, **kwargs):
    from sglang_mixgraph.graph_plan import GraphConfigError, out_of_scope, validations

    original(server_args, **kwargs)
    if not _auto():  # the patch is off: upstream behaviour only (installed for a test process)
        return
    why = out_of_scope(server_args)
    if why is not None:
        decisions_for(server_args).bucket_policy = f"upstream ({why})"
        if deferral_pending(server_args):  # in scope at the rule hook, out of it now
            _upstream_rule_stands(server_args, why, f"disables ({why} later in resolution)")
        return
    _apply_buckets(server_args)
    _settle_deferred_dsv4(server_args)
    for v in validations(server_args):
        if v.blocks:
            raise GraphConfigError(v.message)
        if not v.ok:
            logger.warning("sglang-mixgraph: %s", v.message)
        elif v.rows:
            logger.info("sglang-mixgraph: logits multimem all-gather %s", v.message)


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
        from sglang_mixgraph.graph_plan import is_designed_model

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
        "BCG rule, startup validation of the MegaMoE cap and the logits all-gather; "
        "SGLANG_EXPERIMENTAL_FORCE_BCG=1 overrides upstream's DSV4 and unvalidated-a2a BCG "
        "rules, other rules are kept, each logged"
    ),
    flags=(PREFILL_BUCKETS, FORCE_BCG),
    switch_count=2,
    hooks=(
        Hook(RULES_TARGET, "function", "server_args", HookType.AROUND, rules_hook),
        Hook(VALIDATE_TARGET, "function", "server_args", HookType.AROUND, _validate_around),
        Hook(
            LOGITS_TARGET,
            "function",
            "include_prefill, floor",
            HookType.AROUND,
            _recommended_max_tokens_around,
        ),
    ),
    is_enabled=_on,
    why=(
        "upstream's ~45 generic prefill buckets do not fit next to a DeepSeek-V4 KV pool, so its "
        "blanket DeepSeek-V4 rule turns the breakable prefill graph off; its logits all-gather "
        "sizing sends mixed steps to NCCL; and its only way past the BCG rules is an explicit "
        "--cuda-graph-backend-prefill, which also skips the pipeline-parallel default and every "
        "later automatic choice"
    ),
    how=(
        "during resolution: the rule hook evaluates upstream's BCG rules one by one and defers "
        "the DeepSeek-V4 rule to the capture-memory estimate (auto) or overrides it and the "
        "unvalidated-a2a rule (FORCE_BCG, every other rule kept and logged); late in resolution "
        "the planner's derived bucket list is applied, the deferred rule settled by the estimate "
        "and the startup validations run; at model init the logits all-gather is sized for "
        "mixed steps"
    ),
    upstream_pr=(
        "for SGLANG_EXPERIMENTAL_FORCE_BCG: the upstream PR that forces the breakable prefill "
        "graph on for DeepSeek-V4 with MegaMoE and DP attention (the flag overrides the two rules "
        "that block that deployment)"
    ),
    retired_by=(
        "upstream prefill bucket lists and BCG rules sized from capture memory per model, BCG "
        "rules that can be overridden one by one, and a logits all-gather sized for mixed steps"
    ),
)
