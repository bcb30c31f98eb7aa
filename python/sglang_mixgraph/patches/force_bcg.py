"""F6: SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps the breakable prefill CUDA graph on.

Upstream turns BCG prefill off when one of its incompatibility rules matches
(`disable_breakable_cudagraph_if_incompatible`, sglang/srt/arg_groups/cuda_graph_hook.py:
170-255). Only an explicit `--cuda-graph-backend-prefill` skips the rules today
(cuda_graph_hook.py:143-144), and it also skips the pipeline-parallel default and any
later automatic choice. This flag skips exactly the rule list: an AROUND hook on that
function logs every rule that holds, by name and with upstream's reason, and does not
call it. Other places that disable prefill graphs (PP default 150-162, DeepSeek-V3 +
trtllm_mla 279-312, DeepEP normal mode, runtime checks in cuda_graph_setup.py) are not
rules of that function and stay in force.
"""

from __future__ import annotations

import logging

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch

logger = logging.getLogger("sglang_mixgraph")

PATCH_ID = "force_bcg"
RULES_TARGET = "sglang.srt.arg_groups.cuda_graph_hook.disable_breakable_cudagraph_if_incompatible"

FORCE_BCG = bool_flag(
    "SGLANG_EXPERIMENTAL_FORCE_BCG",
    False,
    "Keep the breakable prefill CUDA graph on where an upstream incompatibility rule would "
    "turn it off; every overridden rule is logged by name.",
)


def _force_bcg_rules(original, server_args):
    from sglang_mixgraph.bcg_rules import decisions_for, matching_rules

    if not FORCE_BCG.get():  # installed at load with the flag on; honour a later change
        return original(server_args)
    record = decisions_for(server_args)
    record.rule_matches = []
    for rule in matching_rules(server_args):
        logger.warning(
            "sglang-mixgraph: SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps the breakable prefill CUDA "
            "graph on although upstream rule %r would disable it (%s).",
            rule.name,
            rule.reason,
        )
        record.rule_matches.append({"name": rule.name, "reason": rule.reason, "action": "overridden by FORCE_BCG"})
    record.prefill_backend_source = "force" if record.rule_matches else None
    return None


PATCH = Patch(
    id=PATCH_ID,
    summary="F6: SGLANG_EXPERIMENTAL_FORCE_BCG=1 skips upstream's BCG incompatibility rules, logging each",
    flags=(FORCE_BCG,),
    hooks=(
        Hook(
            target=RULES_TARGET,
            kind="function",
            signature="server_args",
            hook_type=HookType.AROUND,
            fn=_force_bcg_rules,
        ),
    ),
    is_enabled=lambda: bool(FORCE_BCG.get()),
)
