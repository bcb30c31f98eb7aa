"""drop_empty_segments on real CUDA graphs: upstream's BreakableCUDAGraphCapture and replay, with
the patch installed through the registry, against the same capture without it and against eager.

A body is a list of parts, one per segment, with an eager break between two parts: ``k`` kernels,
``a`` only an allocation (a buffer the next break writes, read by a later segment), ``""``
nothing. Every break records its index when it runs. Checked for every body, with the CUDA-graph
dedup registry off and on: replays with changed inputs equal eager and upstream's replay; breaks
run in order; the patch launches exactly the segments with kernels (upstream launches all);
empty segments stay in ``_segments``, unregistered. Last, a GLM-5-shaped layer stack: per
layer, projections, the DSA indexer break, nothing (RoPE fused into attention), the bmm+attention
break, MoE-sized GEMMs: one dropped segment per layer.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "cuda.bindings.runtime",
    reason="cuda-python (cuda.bindings) is needed to count graph nodes; tools/gpu-upstream/"
    "prepare.sh carries its wheel (re-run it to fetch it)",
)

from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg,
)

from sglang_mixgraph import counters
from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.core.graph_segments import GRAPH
from sglang_mixgraph.kits.bcg_capture import capture
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import drop_empty_segments as des

DEV = "cuda"
FLAG = des.DROP_FLAG.name

BODIES = {
    "kernels": ["k", "k", "k"],
    "first_empty": ["", "k", "k"],
    "last_empty": ["k", "k", ""],
    "consecutive_empty": ["k", "", "", "k"],
    "alloc_only": ["k", "a", "k"],
    "all_empty": ["", ""],  # the --debug-cuda-graph shape: one break between two empty segments
    "mixed": ["", "a", "", "k", "a", "k", ""],
}


def body_fn(parts, x, order):
    """The forward for ``parts`` on the static input ``x``; ``order`` records the breaks."""

    @bcg.eager_on_graph
    def brk(i, h):
        order.append(i)
        return torch.sin(h) + 0.25 * (i + 1)

    @bcg.eager_on_graph
    def brk_into(i, h, out):
        order.append(i)
        torch.cos(h, out=out)

    def run():
        h = x
        for i, part in enumerate(parts):
            buf = None
            if part == "k":
                h = h * 1.5 + 1.0
            elif part == "a":
                buf = torch.empty_like(h)
            if i < len(parts) - 1:
                if buf is None:
                    h = brk(i, h)
                else:
                    brk_into(i, h, buf)
                    h = buf
        return h

    return run


def dedup_registry(enabled: bool, monkeypatch):
    """Upstream's dedup registry, built as its backend builds it, or None."""
    if not enabled:
        return None
    from sglang.srt.model_executor.runner_backend.cuda_graph_dedup_mixin import (
        DedupedCudaGraphMixin,
    )

    monkeypatch.setenv("SGLANG_ENABLE_CUDA_GRAPH_DEDUP", "1")
    registry = DedupedCudaGraphMixin().build_deduped_cuda_graph()
    if registry is None:
        pytest.skip("upstream's CUDA-graph dedup is unavailable with this torch / cuda-python")
    return registry


class Launches:
    """Counts segment launches: plain torch graphs and dedup-registry executables."""

    def __init__(self, monkeypatch):
        from sglang.srt.model_executor.runner_backend.cuda_graph_dedup_mixin import (
            DedupedCudaGraphRegistry,
        )

        self.torch_graphs = 0
        self.dedup = 0
        graph_replay = torch.cuda.CUDAGraph.replay
        dedup_replay = DedupedCudaGraphRegistry.replay

        def count_graph(graph, *args, **kwargs):
            self.torch_graphs += 1
            return graph_replay(graph, *args, **kwargs)

        def count_dedup(registry, *args, **kwargs):
            self.dedup += 1
            return dedup_replay(registry, *args, **kwargs)

        monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", count_graph)
        monkeypatch.setattr(DedupedCudaGraphRegistry, "replay", count_dedup)

    def take(self) -> tuple[int, int]:
        out = (self.torch_graphs, self.dedup)
        self.torch_graphs = self.dedup = 0
        return out


def launched_segments(graph) -> list[int]:
    plan = graph.__dict__.get(attrs.GRAPH_DROP_PLAN)
    if plan is None:
        return list(range(len(graph._segments)))
    return [i for kind, i in plan[0] if kind == GRAPH]


INPUTS = (0.5, -1.25, 3.0)


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "dedup"])
@pytest.mark.parametrize("name", list(BODIES))
def test_replay_equals_eager_and_launches_only_segments_with_kernels(name, dedup, monkeypatch):
    parts = BODIES[name]
    with_kernels = [i for i, p in enumerate(parts) if p == "k"]
    x = torch.zeros(4096, device=DEV)
    order: list = []
    run = body_fn(parts, x, order)
    launches = Launches(monkeypatch)

    upstream, up_out = capture(run, dedup_registry(dedup, monkeypatch))
    counters.reset()
    with installed((des.PATCH,), {FLAG: "1"}) as (status,):
        assert status.enabled
        ours, our_out = capture(run, dedup_registry(dedup, monkeypatch))
        assert counters.get(des.PATCH_ID, "segments_dropped") == len(parts) - len(with_kernels)
        assert launched_segments(ours) == with_kernels
        assert len(ours._segments) == len(parts) and len(ours._break_fns) == len(parts) - 1
        for i in set(range(len(parts))) - set(with_kernels):  # kept alive, never registered
            assert isinstance(ours._segments[i], torch.cuda.CUDAGraph)
        for value in INPUTS:
            x.fill_(value)
            order.clear()
            want = run().clone()  # eager: no capture active, breaks run their bodies
            assert order == list(range(len(parts) - 1))
            launches.take()
            order.clear()
            upstream.replay()
            torch.cuda.synchronize()
            up = (up_out.clone(), order[:], launches.take())
            order.clear()
            ours.replay()
            torch.cuda.synchronize()
            mine = (our_out.clone(), order[:], launches.take())
            assert torch.allclose(up[0], want, rtol=1e-6, atol=1e-6), f"{name}: upstream vs eager"
            assert torch.allclose(mine[0], want, rtol=1e-6, atol=1e-6), f"{name}: patched vs eager"
            assert up[1] == mine[1] == list(range(len(parts) - 1)), "breaks out of order"
            total, ours_n = len(parts), len(with_kernels)
            assert up[2] == ((0, total) if dedup else (total, 0)), "upstream launches every segment"
            assert mine[2] == ((0, ours_n) if dedup else (ours_n, 0)), "launched != non-empty"
    if dedup:
        for graph in (upstream, ours):
            graph._deduped_cuda_graph.close()


# ---------------------------------------------------------------------------- GLM-5-shaped stack

HIDDEN, Q_LORA, MOE_INTER, TOKENS, LAYERS = 6144, 2048, 2048, 64, 4


class Glm5Stack:
    """Per layer: q/kv projections (GEMMs), the DSA indexer break, nothing (RoPE fused into the
    attention kernel), the bmm+attention break, o_proj and MoE-sized expert GEMMs."""

    def __init__(self):
        g = torch.Generator(device=DEV).manual_seed(5)

        def w(*shape):
            return torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g) * 0.02

        self.x = torch.zeros(TOKENS, HIDDEN, device=DEV, dtype=torch.bfloat16)
        self.layers = [
            dict(
                q=w(HIDDEN, Q_LORA),
                o=w(Q_LORA, HIDDEN),
                up=w(HIDDEN, MOE_INTER),
                down=w(MOE_INTER, HIDDEN),
            )
            for _ in range(LAYERS)
        ]
        self.order: list = []

        @bcg.eager_on_graph
        def indexer(layer, q):
            self.order.append(("indexer", layer))
            return torch.topk(q.float(), 8, dim=-1).indices.to(torch.int32)

        @bcg.eager_on_graph
        def bmm_attention(layer, q, topk):
            self.order.append(("attention", layer))
            picked = topk.to(q.dtype).sum(dim=-1, keepdim=True) * 1e-3  # reads the indexer's output
            return torch.softmax(q.float(), dim=-1).to(q.dtype) + picked

        self.indexer, self.bmm_attention = indexer, bmm_attention

    def run(self):
        h = self.x
        for i, p in enumerate(self.layers):
            q = h @ p["q"]  # the segment before the indexer: projections
            topk = self.indexer(i, q)
            # nothing here: the RoPE is fused into the attention kernel -> an empty segment
            attn = self.bmm_attention(i, q, topk)
            h = h + attn @ p["o"]
            h = h + torch.relu(h @ p["up"]) @ p["down"]  # MoE-sized expert GEMMs
        return h


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "dedup"])
def test_glm5_shaped_stack_drops_one_segment_per_layer(dedup, monkeypatch):
    stack = Glm5Stack()
    launches = Launches(monkeypatch)
    upstream, up_out = capture(stack.run, dedup_registry(dedup, monkeypatch))
    counters.reset()
    with installed((des.PATCH,), {FLAG: "1"}):
        ours, our_out = capture(stack.run, dedup_registry(dedup, monkeypatch))
        segments = 2 * LAYERS + 1
        assert len(ours._segments) == segments and len(ours._break_fns) == 2 * LAYERS
        empty = [2 * i + 1 for i in range(LAYERS)]  # between each layer's two breaks
        assert launched_segments(ours) == [i for i in range(segments) if i not in empty]
        assert counters.get(des.PATCH_ID, "segments_dropped") == LAYERS
        expected_order = [(k, i) for i in range(LAYERS) for k in ("indexer", "attention")]
        for seed in (1, 2):
            stack.x.copy_(
                torch.randn(
                    TOKENS,
                    HIDDEN,
                    device=DEV,
                    generator=torch.Generator(device=DEV).manual_seed(seed),
                ).to(torch.bfloat16)
            )
            stack.order.clear()
            want = stack.run().clone()
            launches.take()
            stack.order.clear()
            upstream.replay()
            torch.cuda.synchronize()
            up_launches = launches.take()
            assert stack.order == expected_order
            stack.order.clear()
            ours.replay()
            torch.cuda.synchronize()
            assert stack.order == expected_order
            assert sum(launches.take()) == segments - LAYERS
            assert sum(up_launches) == segments
            assert torch.allclose(our_out.float(), up_out.float(), rtol=1e-3, atol=1e-3)
            assert torch.allclose(our_out.float(), want.float(), rtol=2e-2, atol=2e-2)
        assert counters.get(des.PATCH_ID, "launches_skipped") == 2 * LAYERS
    if dedup:
        for graph in (upstream, ours):
            graph._deduped_cuda_graph.close()
