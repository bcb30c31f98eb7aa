"""`graph_config`: prefill CUDA graphs sized for mixed chunked prefill (DeepSeek-V4, GLM-5).

What: two switches. ``SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto`` (off by default) acts for mixed
chunked prefill of a sparse-MLA model only (anything else resolves exactly as upstream): the
rule hook (`rules_hook`) defers upstream's blanket DeepSeek-V4 BCG rule; AROUND
`mega_moe_hook.validate_mega_moe_token_budget_for_model` (late in resolution) the planner's
derived bucket list is applied, the deferred rule settled by the capture-memory estimate and the
startup validations run; AROUND `triton_symm_mem_ag.recommended_max_tokens` the logits
all-gather is sized for mixed steps. ``SGLANG_EXPERIMENTAL_FORCE_BCG=1`` runs the same rule hook
in forced mode (below). The planner (planner/graph_plan.py, prefill_settlement.py) computes and
decides the resolution hook's answer from the facts this module reads
(deployment_facts.py); this module applies it and logs. Off by default
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
    speculative_warning,
)
from sglang_mixgraph.fallback import fallback_once
from sglang_mixgraph.flags import bool_flag, choice_flag
from sglang_mixgraph.registry import Hook, Patch, evaluated_patches

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


# The settings that switch the patch on, as `plan` and `doctor` name them.
_AUTO_ON, _FORCE_ON = f"{PREFILL_BUCKETS.name}=auto", f"{FORCE_BCG.name}=1"


def speculative_caveat() -> str | None:
    """For `doctor`, which knows no deployment: what the switches set here would do to a
    speculative DeepSeek-V4 deployment (`bcg_rules.speculative_warning`), or None when both
    are off."""
    switches = [
        name for name, on in ((_FORCE_ON, bool(FORCE_BCG.get())), (_AUTO_ON, _auto())) if on
    ]
    return speculative_warning(" or ".join(switches)) if switches else None


def explain_if_on(plan) -> dict[str, str]:
    """For `plan` with this patch off: what each of its switches would do in the planned
    deployment (a graph_plan.GraphPlan), by "FLAG=value": its switches change the graphs, so
    this reads the plan's bucket lists and rules."""
    from sglang_mixgraph.planner.graph_plan import DecidedBy
    from sglang_mixgraph.planner.plan_words import auto_stands_aside, list_words

    pg, bl = plan.prefill, plan.buckets
    user = pg.decided_by.kind is DecidedBy.USER
    kept = next((r.name for r in pg.rules if r.name not in FORCEABLE_RULES), None)
    upstream_why = auto_stands_aside(plan)
    if upstream_why is not None:
        auto = f"resolves as upstream: {upstream_why}"
    elif bl is None:
        auto = "nothing to derive: chunked prefill is disabled"
    elif bl.derived is None:
        auto = f"no derived list: {bl.derived_error}"
    elif kept is not None or user and pg.backend == "disabled":
        auto = f"derives {list_words(plan, bl.derived)}, but the prefill graph stays off"
    elif any(r.name == DSV4_RULE for r in pg.rules):
        outcome = "keeps the graph on with" if bl.derived.capture.fits else "turns the graph off:"
        auto = (
            f"the capture estimate replaces rule {DSV4_RULE!r} and {outcome} "
            f"{list_words(plan, bl.derived)}"
        )
    else:
        auto = f"captures {list_words(plan, bl.derived)} instead of upstream's list"
    if user:
        force = "the prefill backend is set explicitly: nothing to override"
    elif not pg.rules:
        force = "no upstream rule turns the prefill graph off here: nothing to override"
    elif kept is not None:
        force = f"rule {kept!r} is kept: the prefill graph stays off"
    else:
        names = ", ".join(repr(r.name) for r in pg.rules)
        listed = f" ({list_words(plan, bl.upstream)})" if bl and bl.upstream else ""
        force = f"overrides {names}: SGLang captures its own prefill list{listed}"
    return {_AUTO_ON: auto, _FORCE_ON: force}


def estimate_applies(server_args) -> bool:
    """Whether the capture-memory estimate may replace the blanket DeepSeek-V4 BCG rule here
    (the rule hook's estimate mode)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    from sglang_mixgraph.planner.deployment_facts import out_of_scope

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


def _speculative_algorithm(server_args) -> str | None:
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(server_args).speculative_algorithm


def _say_speculative(record: GraphDecisions, text: str) -> None:
    """The speculative-decoding warning (`bcg_rules.speculative_warning`), once, kept for `plan`."""
    record.speculative_warning = text
    _say_once(record, f"sglang-mixgraph: {text}")


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
            algorithm = _speculative_algorithm(server_args)
            if rule.name == DSV4_RULE and algorithm is not None:
                _say_speculative(record, speculative_warning(_FORCE_ON, algorithm))
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


# --------------------------------------------------------------------------- the resolution hook


def _declare_prefill(server_args, **changes) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Phase, with_phase

    declare_resolution(
        server_args,
        "sglang_mixgraph.graph_config",
        cuda_graph_config=with_phase(
            resolving_view(server_args).cuda_graph_config, Phase.PREFILL, **changes
        ),
    )


def _say(said) -> None:
    if said is not None:
        logger.log(said.level, "%s", said.text)


def _settle_rule(server_args, record: GraphDecisions, rule) -> None:
    """Record (and apply) how the deferred DeepSeek-V4 rule ended."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    if rule.fallback is not None:
        fallback_once(PATCH_ID, rule.fallback)
    record.prefill_backend_source = rule.source
    if rule.source is Source.UPSTREAM_RULE:
        record.deciding_rule = record.rule_matches[0].name
    if rule.action is not None:
        record.rule_matches[0].action = rule.action
    _say(rule.said)
    if rule.speculative_warning is not None:
        _say_speculative(record, rule.speculative_warning)
    if rule.disable:
        _declare_prefill(server_args, backend=Backend.DISABLED)


def _validate_around(original, server_args, **kwargs):
    """AROUND the MegaMoE token-budget check: upstream's check, then the planner's one answer
    (`prefill_settlement.settle_prefill`) applied and logged."""
    from sglang_mixgraph.planner.deployment_facts import (
        capture_effects_of,
        out_of_scope,
        read_deployment,
    )
    from sglang_mixgraph.planner.graph_plan import GraphConfigError
    from sglang_mixgraph.planner.prefill_settlement import settle_out_of_scope, settle_prefill

    original(server_args, **kwargs)
    if not _auto():  # the patch is off: upstream behaviour only (installed for a test process)
        return
    record = decisions_for(server_args)
    why = out_of_scope(server_args)
    if why is not None:  # in scope at the rule hook perhaps, not now: read nothing more
        settled = settle_out_of_scope(why, record)
    else:
        effects = capture_effects_of(evaluated_patches())  # the plugin's patches in this process
        facts = read_deployment(server_args, capture_effects=effects)
        settled = settle_prefill(facts, record)
    if settled.out_of_scope is None:
        record.upstream_max_bs = settled.upstream_max_bs
    record.bucket_policy = settled.bucket_policy
    if settled.bucket_fallback is not None:
        fallback_once(PATCH_ID, f"prefill buckets: {settled.bucket_fallback}")
    if settled.buckets is not None:
        _declare_prefill(server_args, bs=list(settled.buckets), max_bs=settled.buckets[-1])
        _say(settled.bucket_said)
    if settled.rule is not None:
        _settle_rule(server_args, record, settled.rule)
    for v in settled.validations:
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
        from sglang_mixgraph.planner.deployment_facts import is_designed_model

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
    explain_if_on=explain_if_on,
    doctor_caveat=speculative_caveat,
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
        "for SGLANG_EXPERIMENTAL_FORCE_BCG: SGLang PR #30420 (breakable CUDA graphs for "
        "DeepSeek-V4's mixed-chunk steps) keeps the breakable prefill graph on for DeepSeek-V4 "
        "with MegaMoE and DP attention; the flag overrides the two rules that block that "
        "deployment"
    ),
    retired_by=(
        "upstream prefill bucket lists and BCG rules sized from capture memory per model, BCG "
        "rules that can be overridden one by one, and a logits all-gather sized for mixed steps"
    ),
    docs_page="docs/graph-config.md",
)
