"""kits.host_timers: what a benchmark learns of the parts of a timed phase."""

from __future__ import annotations

import time
import types

import pytest

from sglang_mixgraph.kits.host_timers import call_timers


def _module():
    mod = types.ModuleType("fake_plan")

    def part(ms):
        time.sleep(ms / 1e3)
        return ms

    def whole():
        return mod.part(20) + mod.part(10)  # looked up by name where it is called, as plan.py does

    mod.part, mod.whole = part, whole
    return mod


def test_times_each_named_function_where_it_is_called_and_puts_it_back():
    mod = _module()
    original = mod.part

    class Backend:
        def build(self):
            return mod.part(5)

    backend = Backend()
    with call_timers(
        [("whole", mod, "whole"), ("part", mod, "part"), ("build", backend, "build")]
    ) as t:
        assert mod.whole() == 30 and backend.build() == 5
    assert t["part.calls"] == 3 and t["whole.calls"] == 1 and t["build.calls"] == 1
    assert 35 <= t["part"] < 80 and 30 <= t["whole"] < 70 and 5 <= t["build"] < 40
    assert t["whole"] >= 29  # a part that calls another includes it
    assert mod.part is original and "build" not in vars(backend)  # the class's method again


def test_restores_everything_when_the_block_raises():
    mod = _module()
    before = (mod.part, mod.whole)
    with pytest.raises(RuntimeError), call_timers([("part", mod, "part"), ("whole", mod, "whole")]):
        raise RuntimeError("benchmark failed")
    assert (mod.part, mod.whole) == before


def test_the_split_plan_parts_name_functions_that_exist():
    """The steady-state benchmark's parts name the plugin's and upstream's functions (a rename
    would time nothing, silently), and its medians are per part and phase."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend

    from sglang_mixgraph.kits import host_timers as ht

    method = DeepseekV4AttnBackend._build_sparse_prefill_chunk_cache
    targets = ht.split_plan_targets(SimpleNamespace(_build_sparse_prefill_chunk_cache=method))
    assert [name for name, _, _ in targets] == list(ht.SPLIT_PLAN_PARTS)
    for _, owner, attr in targets:
        assert callable(getattr(owner, attr)), attr
    steps = [
        {"prepare": {"plan": 1.0, "chunk_cache": 0.4}, "replay": {}},
        {"prepare": {"plan": 3.0, "chunk_cache": 0.6}, "replay": {"chunk_cache": 0.2}},
    ]
    med = ht.part_medians(steps)
    assert med["prepare"] == {"plan": 2.0, "decision": 0.0, "tail_inputs": 0.0, "chunk_cache": 0.5}
    assert med["replay"]["chunk_cache"] == 0.1
