"""`target_gpu.described_gpu`: inside the block SGLang's device probes answer for the described
chip, wherever a module bound them by name; after it every name is bound to upstream's probe
again. Upstream binds one probe under two names (`is_blackwell` is `is_blackwell_supported`):
both must come back, not the answer of the last block (they once did not)."""

from __future__ import annotations

import sys
import types

from sglang_mixgraph.target_gpu import GPUS, _probe_answers, described_gpu


def test_the_probes_answer_for_the_chip_inside_and_are_upstreams_again_after(monkeypatch):
    from sglang.srt.utils import common

    names = list(_probe_answers(GPUS["B300"]))
    before = {name: getattr(common, name) for name in names}
    assert common.is_blackwell is common.is_blackwell_supported  # the alias this guards
    reader = types.ModuleType("probe_reader")  # a module that imported probes by name
    reader.is_blackwell = common.is_blackwell
    reader.get_device_sm = common.get_device_sm
    monkeypatch.setitem(sys.modules, reader.__name__, reader)

    for gpu, blackwell, sm in (("B300", True, 103), ("H200", False, 90)):
        with described_gpu(gpu):
            assert (
                common.is_blackwell() is blackwell and common.is_blackwell_supported() is blackwell
            )
            assert reader.is_blackwell() is blackwell and reader.get_device_sm() == sm
            assert common.get_device_sm() == sm
        changed = [name for name in names if getattr(common, name) is not before[name]]
        assert changed == [], gpu
        assert reader.is_blackwell is before["is_blackwell"]
        assert reader.get_device_sm is before["get_device_sm"]
