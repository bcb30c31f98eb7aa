"""SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1 through upstream's DSV4 backend on the CPU: the split's
decode rows from the tail graphs equal the plain calls', every split layer is counted as a replay,
a schedule call (a step's first layer of its ratio) or under the reason it was eager, and a
capture that fails leaves the plain call, said once. The world's three layers (one a ratio) run
twice a step, so that layers of one ratio follow each other as in the model. The graphs replay
by calling the captured function here (test/core/test_decode_tail_graphs.py); a real CUDA graph's
replay is checked on the GPU (test/gpu_upstream/test_decode_tail_graphs_gpu.py).
"""

from __future__ import annotations

import logging

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph.core.decode_tail_graphs import TailGraphs
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.reference.sparse_mla import ReferenceSchedMeta
from sglang_mixgraph.upstream_attrs import BACKEND_SPLIT_TAIL_GRAPHS

K.import_upstream()

from sglang_mixgraph.patches import mixed_split as ms  # noqa: E402

STEPS = [
    K.Step(prefill=[(300, 29), (0, 7)], decode=[255, 256, 129, 0], padding=2, seed=11),
    K.Step(prefill=[], decode=[511, 3, 130], padding=3, seed=12),  # decode rows only
]


LAYERS = (0, 1, 2, 0, 1, 2)


class Replayed:
    def __init__(self, fn):
        self.replay = fn


pytestmark = pytest.mark.usefixtures("fresh_counters")


def _split_step(world, graphs_on: bool, capture=None) -> list[torch.Tensor]:
    """One step's outputs, in the order of LAYERS."""
    if capture is not None:
        graphs = TailGraphs(
            world.backend._flash_mla_with_kvcache, ReferenceSchedMeta, capture=capture
        )
        setattr(world.backend, BACKEND_SPLIT_TAIL_GRAPHS, graphs)
    with K.patch_installed(tail_graphs=graphs_on):
        fb = world.forward_batch()
        world.run_step(fb, layers=())  # the step's metadata and plan
        assert ms.get_plan(world.backend) is not None
        return [world.run_layer(fb, layer) for layer in LAYERS]


def _events():
    return counters.snapshot()["events"].get(ms.PATCH_ID, {})


@pytest.mark.parametrize("step", STEPS, ids=["mixed", "decode_only"])
def test_the_tail_graphs_give_the_plain_calls_rows(step):
    with K.reference_world():
        plain = _split_step(K.World(step), graphs_on=False)
        assert not any(k.startswith("tail_graph") for k in _events())
        counters.reset()
        world = K.World(step)
        sink = world.attn_sink()  # a model's sink is a parameter: one tensor for every step
        world.attn_sink = lambda heads=K.HEADS: sink
        out = _split_step(world, graphs_on=True, capture=Replayed)
        out_again = _split_step(world, graphs_on=True)  # the next step: graphs kept, replayed
    for i, layer in enumerate(LAYERS):
        assert torch.equal(out[i], plain[i]), layer
        assert torch.equal(out_again[i], plain[i]), layer
    ratios = len(K.LAYER_RATIOS)
    # each step: the first layer of each ratio makes the schedule, the second replays
    assert _events()["tail_graph_schedules"] == 2 * ratios
    assert _events()["tail_graph_replays"] == 2 * (len(LAYERS) - ratios)
    assert getattr(world.backend, BACKEND_SPLIT_TAIL_GRAPHS).captures == len(LAYERS) - ratios


def test_a_failed_capture_leaves_the_plain_call_and_is_said_once(caplog):
    def failing(fn):
        raise RuntimeError("capture refused")

    with K.reference_world():
        plain = _split_step(K.World(STEPS[0]), graphs_on=False)
        world = K.World(STEPS[0])
        with caplog.at_level(logging.WARNING, logger="sglang_mixgraph"):
            out = _split_step(world, graphs_on=True, capture=failing)
    for i, layer in enumerate(LAYERS):
        assert torch.equal(out[i], plain[i]), layer
    said = [
        r.getMessage() for r in caplog.records if "decode-tail CUDA graphs off" in r.getMessage()
    ]
    assert len(said) == 1 and "capture refused" in said[0]
    events = _events()
    ratios = len(K.LAYER_RATIOS)
    assert events["tail_graph_schedules"] == ratios
    assert events["tail_graph_eager.capture_failed"] == len(LAYERS) - ratios
    assert "tail_graph_replays" not in events
