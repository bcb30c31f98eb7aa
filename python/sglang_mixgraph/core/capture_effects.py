"""What a patch changes in a breakable capture's memory (no sglang).

A patch declares the effects it has in this process (`registry.Patch.capture_effects`); the
deployment facts read them from every patch (`planner.deployment_facts.capture_effects_of`) and
the capture-memory estimate (`core.capture_memory`) counts them. Its own module so that a patch
declaring an effect does not import the estimate.
"""

from __future__ import annotations

import enum


class CaptureEffect(enum.Enum):
    # breakable captures run the c4 indexer's logits in an eager break: out of the graph pool
    INDEXER_LOGITS_EAGER = "indexer_logits_eager"
    # the split's decode tails replay from CUDA graphs of their own: counted next to the pool
    DECODE_TAIL_GRAPHS = "decode_tail_graphs"
