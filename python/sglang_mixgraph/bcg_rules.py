"""Upstream's breakable-prefill-graph (BCG) incompatibility rules, one by one, and what decided.

What: the rule table of `sglang.srt.arg_groups.cuda_graph_hook.disable_breakable_cudagraph_if_incompatible`
(`rules`, `matching_rules`), the rules SGLANG_EXPERIMENTAL_FORCE_BCG may override
(`FORCEABLE_RULES`, `forced_actions`), and the record of what decided the prefill backend, kept
per ServerArgs (a msgspec Struct with slots: nothing can be attached to it) for `graph_plan`.
The hook on that function is the `graph_config` patch's (`patches.graph_config.rules_hook`);
this module imports no patch, so the patch and the planner both read it and nothing reads back.
Why: upstream keeps its rules in a function-local list and stops at the first match, so nobody
outside can tell which rules hold; we evaluate the same predicates with the same upstream
helpers, under upstream's own rule names (a test compares the table with upstream's source).
Retired by: upstream rules as a public table that names every rule that holds and can be
overridden one by one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RULES_TARGET = "sglang.srt.arg_groups.cuda_graph_hook.disable_breakable_cudagraph_if_incompatible"

DSV4_RULE = "DeepSeek-V4 (heavy capture-pool memory pressure)"
A2A_RULE = "unvalidated a2a backend"
# What SGLANG_EXPERIMENTAL_FORCE_BCG overrides: the two rules that block the DeepSeek-V4
# deployment the upstream PR forces BCG for (DSV4 + MegaMoE + DP attention, also with an a2a
# backend upstream has not validated). Every other rule names a configuration upstream knows
# to fail under BCG (wrong output, a capture that cannot be built, a replay fault), so forcing
# it would not be an experiment but a broken server: those keep upstream's decision.
FORCEABLE_RULES = frozenset({DSV4_RULE, A2A_RULE})


def speculative_warning(switch: str, algorithm: str | None = None) -> str:
    """What `switch` (SGLANG_EXPERIMENTAL_FORCE_BCG=1, SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto)
    does to a speculative DeepSeek-V4 deployment, and why that is untested ground: said once in
    the server log where it keeps the graph on, and by `plan` and `doctor` (``algorithm`` None:
    the deployment is not known)."""
    who = (
        f"a DeepSeek-V4 deployment with speculative decoding ({algorithm})"
        if algorithm
        else "a DeepSeek-V4 deployment if it uses speculative decoding (--speculative-algorithm)"
    )
    return (
        f"{switch} keeps the breakable prefill CUDA graph on for {who}, where SGLang keeps it "
        f"off (rule {DSV4_RULE!r}), so upstream has never replayed it under speculative "
        "decoding; SGLang issue #29985 reports that a breakable prefill replay under EAGLE "
        "corrupted the hidden states fed to the draft model. Allowed: on a tiny model with "
        "dummy weights the replay kept eager upstream's tokens and accept length, which does not "
        "validate a real draft; compare tokens and accept length with "
        "--disable-prefill-cuda-graph."
    )


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
    # `speculative_warning`'s line where our switch kept the graph on under speculative decoding.
    speculative_warning: str | None = None
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
