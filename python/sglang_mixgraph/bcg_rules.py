"""Upstream's breakable-prefill-graph (BCG) incompatibility rules, one by one, and what decided.

What: the one hook on `sglang.srt.arg_groups.cuda_graph_hook.disable_breakable_cudagraph_if_incompatible`
(`rules_hook`, shared by `force_bcg` and `graph_config`, registered once), run in one of three
modes: upstream's, forced (the DeepSeek-V4 and unvalidated-a2a rules are overridden; any other
rule that holds keeps upstream's decision, each logged once), or estimate (the DeepSeek-V4 rule
alone is deferred to the capture-memory estimate). Decisions are kept per
ServerArgs (a msgspec Struct with slots: nothing can be attached to it) for `graph_plan`.
Why: upstream keeps its rules in a function-local list and stops at the first match, so nobody
outside can tell which rules hold; we evaluate the same predicates with the same upstream
helpers, under upstream's own rule names (a test compares the table with upstream's source).
Retired by: upstream rules as a public table that names every rule that holds and can be
overridden one by one.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger("sglang_mixgraph")

RULES_TARGET = "sglang.srt.arg_groups.cuda_graph_hook.disable_breakable_cudagraph_if_incompatible"

DSV4_RULE = "DeepSeek-V4 (heavy capture-pool memory pressure)"
A2A_RULE = "unvalidated a2a backend"
# What SGLANG_EXPERIMENTAL_FORCE_BCG overrides: the two rules that block the DeepSeek-V4
# deployment the upstream PR forces BCG for (DSV4 + MegaMoE + DP attention, also with an a2a
# backend upstream has not validated). Every other rule names a configuration upstream knows
# to fail under BCG (wrong output, a capture that cannot be built, a replay fault), so forcing
# it would not be an experiment but a broken server: those keep upstream's decision.
FORCEABLE_RULES = frozenset({DSV4_RULE, A2A_RULE})


@dataclass(frozen=True)
class Rule:
    name: str  # upstream's name; the silent CP rule has none upstream
    upstream_name: str | None
    reason: str  # upstream's comment on the rule, in its words
    predicate: Callable[[Any], bool]


def _rules() -> tuple[Rule, ...]:
    from sglang.srt.arg_groups.overrides import model_config_of, resolved_view, resolving_view
    from sglang.srt.configs.model_config import is_deepseek_v4, uses_kda_attention
    from sglang.srt.layers.cp.bcg import supports_prefill_cp_bcg

    def kda(sa):
        hf = model_config_of(sa).hf_config
        return uses_kda_attention(hf) and "Glm5NextForConditionalGeneration" not in hf.architectures

    return (
        Rule(
            "KDA hybrid linear attention",
            "KDA hybrid linear attention",
            "only GLM-5.3 Flash is BCG-validated among KDA models",
            kda,
        ),
        Rule(
            DSV4_RULE,
            DSV4_RULE,
            "DSV4 is BCG-compatible but the c4 indexer scratch is pinned in the capture pool "
            "and OOMs",
            lambda sa: is_deepseek_v4(model_config_of(sa).hf_config)
            and not supports_prefill_cp_bcg(sa),
        ),
        Rule(
            "attention context parallel without CP-BCG support",
            None,
            "CP all_gather replay size mismatch under BCG (upstream disables silently)",
            lambda sa: resolved_view(sa).attn_cp_size > 1 and not supports_prefill_cp_bcg(sa),
        ),
        Rule(
            "decode context parallel (dcp_size > 1)",
            "decode context parallel (dcp_size > 1)",
            "capture builds a dummy extend forward with attn_dcp_metadata=None",
            lambda sa: resolving_view(sa).dcp_size > 1,
        ),
        Rule(
            "two-batch overlap",
            "two-batch overlap",
            "TBO capture is unsupported",
            lambda sa: bool(resolving_view(sa).enable_two_batch_overlap),
        ),
        Rule(
            A2A_RULE,
            A2A_RULE,
            "MoE all-to-all backends other than none/deepep/megamoe/flashinfer are not validated "
            "under BCG",
            lambda sa: resolved_view(sa).moe_a2a_backend
            not in ("none", "deepep", "megamoe", "flashinfer"),
        ),
        Rule(
            "multimodal model",
            "multimodal model",
            "multimodal prefill replay faults under BCG; allowlisted archs opt back in",
            lambda sa: (
                model_config_of(sa).is_multimodal
                and not model_config_of(sa).is_multimodal_breakable_cuda_graph_supported
            ),
        ),
    )


_RULES: tuple[Rule, ...] | None = None


def rules() -> tuple[Rule, ...]:
    global _RULES
    if _RULES is None:
        _RULES = _rules()
    return _RULES


def matching_rules(server_args: Any) -> list[Rule]:
    return [r for r in rules() if r.predicate(server_args)]


class RuleMode(enum.Enum):
    """How the rule hook runs upstream's rule function for one resolution."""

    UPSTREAM = "upstream"  # call it: the first matching rule decides
    # SGLANG_EXPERIMENTAL_FORCE_BCG: override the FORCEABLE_RULES that hold; any other rule
    # that holds keeps upstream's decision (call the function)
    FORCED = "forced"
    ESTIMATE = "estimate"  # defer the DeepSeek-V4 rule, alone, to the capture-memory estimate


class Source(enum.Enum):
    """What decided the prefill graph backend (for `plan`)."""

    FORCED = "force"
    UPSTREAM_RULE = "upstream rule"  # `GraphDecisions.deciding_rule` names it
    ESTIMATE_PENDING = "estimate (pending)"
    ESTIMATE = "estimate"
    UPSTREAM_LATER = "upstream (prefill graph turned off later in resolution)"


@dataclass
class RuleMatch:
    """A rule that holds for one resolution, and what the hook did about it."""

    name: str
    reason: str
    action: str


@dataclass
class GraphDecisions:
    """What our hooks decided while one ServerArgs was resolved."""

    rule_matches: list[RuleMatch] = field(default_factory=list)
    prefill_backend_source: Source | None = None
    deciding_rule: str | None = None  # with Source.UPSTREAM_RULE
    bucket_policy: str | None = None  # "auto", "upstream", "user", "upstream (<why>)"
    # Forced-mode lines already logged for this ServerArgs: once each, although the rule
    # function runs more than once in one resolution (`apply_prefill_cp_cuda_graph_default`).
    said: set[str] = field(default_factory=set)
    upstream_max_bs: int | None = None  # upstream's prefill max_bs before the derivation


_DECISIONS: dict[int, tuple[Any, GraphDecisions]] = {}


def decisions_for(server_args: Any) -> GraphDecisions:
    """The record for this ServerArgs, created on first use (the object is kept alive)."""
    entry = _DECISIONS.get(id(server_args))
    if entry is None or entry[0] is not server_args:
        entry = (server_args, GraphDecisions())
        _DECISIONS[id(server_args)] = entry
    return entry[1]


def recorded(server_args: Any) -> GraphDecisions | None:
    entry = _DECISIONS.get(id(server_args))
    return entry[1] if entry is not None and entry[0] is server_args else None


# --------------------------------------------------------------------------- the one hook


def rule_mode(server_args: Any) -> RuleMode:
    from sglang_mixgraph.patches.force_bcg import FORCE_BCG
    from sglang_mixgraph.patches.graph_config import estimate_applies

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


def forced_actions(matches: list[Rule]) -> tuple[list[str], Rule | None]:
    """Under SGLANG_EXPERIMENTAL_FORCE_BCG: the action on each matching rule, and the rule that
    keeps BCG off (the first matching rule FORCE does not override), or None when FORCE
    overrides every rule that holds."""
    kept = next((r for r in matches if r.name not in FORCEABLE_RULES), None)
    actions = []
    for r in matches:
        if r.name not in FORCEABLE_RULES:
            actions.append(f"kept: {r.reason}")
        elif kept is None:
            actions.append("overridden by FORCE_BCG")
        else:
            actions.append(f"overridable by FORCE_BCG, but rule {kept.name!r} is kept")
    return actions, kept


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
