"""Break inputs of upstream's breakable CUDA graph across buckets that share one memory pool
(``kits.break_input_hazard``): with the hold_break_inputs patch, a replay after later captures
and allocator churn equals eager for the synthetic breaks whose inputs the patch covers and for
DeepSeek-V4's real attention break, and holding costs the DeepSeek-V4 capture no pool memory.
Each case runs in its own process (a fault there would end only that process).
``tools/gpu-upstream/break_inputs_hazard.py`` runs the whole matrix, upstream's weak views too.
"""

import pytest

from sglang_mixgraph.kits.break_input_hazard import run_isolated


def _ok(case):
    assert "fault" not in case, case
    assert case["replays"] > 0
    return case


@pytest.mark.parametrize("scenario", ["produced", "outside"])
def test_held_inputs_replay_equal_eager(scenario):
    case = _ok(run_isolated(scenario, "held", rounds=4))
    assert case["wrong"] == 0, case
    held = case["patch_counters"].get("inputs_held", 0)
    # The outside tensor of each of the 4 buckets is held; pool inputs never are.
    assert held == (4 if scenario == "outside" else 0), case
    assert case["patch_counters"].get("inputs_weak_in_pool", 0) >= 4, case


def test_dsv4_attention_break_held_equals_eager_and_costs_no_pool_memory():
    weak = _ok(run_isolated("dsv4", "weak", rounds=4))
    held = _ok(run_isolated("dsv4", "held", rounds=4))
    assert held["wrong"] == 0, held
    assert held["patch_counters"].get("inputs_weak_in_pool", 0) > 0, held
    assert held["capture_reserved_mib"] <= weak["capture_reserved_mib"] * 1.02 + 4, (weak, held)
