"""SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps the breakable prefill CUDA graph on.

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

from sglang.srt.plugins.hook_registry import HookType

from sglang_mixgraph.bcg_rules import RULES_TARGET, rules_hook
from sglang_mixgraph.flags import bool_flag
from sglang_mixgraph.registry import Hook, Patch

PATCH_ID = "force_bcg"
# Shared with graph_config (the same Hook object): registered once when both are on.
RULES_HOOK = Hook(RULES_TARGET, "function", "server_args", HookType.AROUND, rules_hook)

FORCE_BCG = bool_flag(
    "SGLANG_EXPERIMENTAL_FORCE_BCG",
    False,
    "Keep the breakable prefill CUDA graph on where an upstream incompatibility rule would "
    "turn it off; every overridden rule is logged by name.",
)


PATCH = Patch(
    id=PATCH_ID,
    summary="SGLANG_EXPERIMENTAL_FORCE_BCG=1 skips upstream's BCG incompatibility rules, logging each",
    flags=(FORCE_BCG,),
    hooks=(RULES_HOOK,),
    is_enabled=lambda: bool(FORCE_BCG.get()),
)
