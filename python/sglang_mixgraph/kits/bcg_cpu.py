"""Upstream's breakable CUDA graph capture and replay on a machine without CUDA.

``World`` stands in for what ``BreakableCUDAGraphCapture`` and ``BreakableCUDAGraph.replay``
(sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph) touch on a device: the
``torch.cuda.CUDAGraph`` class and the device module's streams. Each segment replay is logged as
``(GRAPH, segment id)``; ``World.kernel()`` adds a node to the graph under capture. Upstream's
own capture code, eager breaks and replay loop run unchanged on top of it, so CPU tests can check
segment and break order; whatever a graph would compute stays the GPU tests' job.
``Registry`` is the surface of upstream's CUDA-graph dedup registry those tests need.
"""

from __future__ import annotations

import types

from sglang_mixgraph.core.graph_segments import GRAPH


class World:
    """Stand-ins for what upstream's capture and replay touch on a CUDA device."""

    def __init__(self):
        self.log: list = []
        self.capturing = None
        self.graphs: list = []
        world = self

        class Graph:
            def __init__(self, keep_graph=False):
                self.keep_graph, self.nodes, self.instantiated = keep_graph, 0, False
                self.id = len(world.graphs)
                world.graphs.append(self)

            def capture_begin(self, pool=None, capture_error_mode="global"):
                world.capturing = self

            def capture_end(self):
                world.capturing = None
                self.instantiated = not self.keep_graph

            def instantiate(self):
                self.instantiated = True

            def replay(self):
                world.log.append((GRAPH, self.id))

        class Stream:
            def wait_stream(self, other):
                pass

        self.Graph = Graph
        self.device = types.SimpleNamespace(Stream=Stream, current_stream=Stream)

    def kernel(self):
        self.capturing.nodes += 1


class Registry:
    """The dedup registry's surface: ``register(graph)`` returns what replay launches."""

    def __init__(self, world):
        self.world, self.registered = world, []

    def register(self, graph):
        self.registered.append(graph)
        return types.SimpleNamespace(replay=lambda: self.world.log.append((GRAPH, graph.id)))


def install(monkeypatch) -> World:
    """A fresh ``World`` in place of the CUDA graph class and upstream's device module."""
    import torch
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
        breakable_cuda_graph as bcg,
    )

    world = World()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", world.Graph)
    monkeypatch.setattr(bcg, "get_device_module", lambda: world.device)
    return world
