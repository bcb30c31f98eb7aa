"""Every patch of sglang-mixgraph, one module each.

A patch module defines its flags at import (they register in SGLang's `envs`) and
a module-level `PATCH`; it imports upstream modules only inside its hooks, so
loading the plugin stays cheap in every SGLang process.
"""

from __future__ import annotations

from sglang_mixgraph.registry import Patch


def all_patches() -> tuple[Patch, ...]:
    from sglang_mixgraph.patches import (
        compress_plan_cap,
        drop_empty_segments,
        graph_config,
        hold_break_inputs,
        live_width_indexer,
        mixed_split,
        replay_read_done,
        war_snapshot_check,
        wo_a_in_break,
    )

    return (
        mixed_split.PATCH,
        replay_read_done.PATCH,
        war_snapshot_check.PATCH,
        graph_config.PATCH,
        drop_empty_segments.PATCH,
        live_width_indexer.PATCH,
        hold_break_inputs.PATCH,
        compress_plan_cap.PATCH,
        wo_a_in_break.PATCH,
    )
