"""`force_bcg`: SGLANG_EXPERIMENTAL_FORCE_BCG=1 keeps the breakable prefill CUDA graph on.

What: the rule hook (`bcg_rules.rules_hook`, AROUND
`sglang.srt.arg_groups.cuda_graph_hook.disable_breakable_cudagraph_if_incompatible`) runs in
forced mode: it overrides the two rules that block the DeepSeek-V4 deployment the upstream PR
forces BCG for (`bcg_rules.FORCEABLE_RULES`: the DeepSeek-V4 capture-pool rule and the
unvalidated a2a backend rule) and does not call upstream's function; when any other rule holds
(KDA, attention CP without CP-BCG, DCP, TBO, multimodal: configurations upstream knows to fail
under BCG) it calls upstream's function, which turns BCG off. Each rule is logged once, by name
and with upstream's reason, as overridden or kept. Other places that turn prefill graphs off
(the pipeline-parallel default in `apply_cuda_graph_compatibility`,
`disable_prefill_cuda_graph_for_deepseek_trtllm_mla`, DeepEP normal mode, runtime checks)
are not rules of that function and stay in force.
Why: upstream's only way past the rules is an explicit `--cuda-graph-backend-prefill`, which
also skips the pipeline-parallel default and every later automatic choice.
Retired by: an upstream switch that skips exactly the rule list, or rules upstream can
override one by one.
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
    "Keep the breakable prefill CUDA graph on where upstream's DeepSeek-V4 capture-pool rule or "
    "its unvalidated a2a backend rule would turn it off; any other rule keeps upstream's "
    "decision. Each rule is logged by name, as overridden or kept.",
)


PATCH = Patch(
    id=PATCH_ID,
    summary=(
        "SGLANG_EXPERIMENTAL_FORCE_BCG=1 overrides upstream's DSV4 and unvalidated-a2a BCG rules; "
        "other rules are kept, each logged"
    ),
    flags=(FORCE_BCG,),
    hooks=(RULES_HOOK,),
    is_enabled=lambda: bool(FORCE_BCG.get()),
)
