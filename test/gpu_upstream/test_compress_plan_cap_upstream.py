"""compress_plan_cap on the GPU: upstream's compressor kernels captured over the full plan and
over the patch's capped view write the same KV cache and compressor state bytes.

Upstream's DSV4 pool (``kits.dsv4_cpu.kv_pool``: its c4/c128 compressed caches and compressor
state rings), upstream's planner (``create_paged_compressor_data`` with GPU lengths and the
bucket's rows, as the breakable capture and every replay build it) and upstream's
``CompressorBackendMixin._forward_compress_all_in_one`` (``compress_forward`` then
``compress_norm_rope_store``) on ``DeepseekV4AttnBackend``. One ``torch.cuda.CUDAGraph`` per
ratio is captured as upstream captures it (the bucket's N-row plan), one with the patch
installed inside upstream's breakable-graph context (the capped view). For each batch the plan
is regenerated once and copied into both captures' plans (the planner's atomics order rows
differently run to run, so the two captures must replay the same bytes), the cache and state
start from the same bytes, and after each replay their bytes must be equal; the eager host plan
(upstream's eager path) must give the same bytes too. Stand-ins: seeded inputs (the
compressor's kv/score projections, APE, norm weight) and the per-token output locations."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph.core.compress_events import compress_events, plan_cap
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import compress_plan_cap as cap

N = 512  # the bucket's rows
SLOTS = 40  # the request pool: the most requests a batch holds
CTX = 2048  # every request's locations: [rid * CTX, rid * CTX + CTX)
HEAD = 512
RATIOS = (4, 128)  # layer 0: c4, layer 1: c128
DEV = "cuda"


def mixed():
    """30 one-token rows (some closing a c4 or c128 window) and two long prefills."""
    decode = [(p, 1) for p in (127, 255, 3, 7, 1000, 1023, 511, 99, 4, 130)] * 3
    return decode + [(0, 200), (383, 150)]


def uniform():
    """16 requests extending 4 tokens each (upstream planner's uniform-extend path)."""
    return [(4 * i + (127 if i % 2 else 0), 4) for i in range(16)]


def worst():
    """The bound: SLOTS requests on a c128 window's last position, SLOTS - 1 of them one token
    and one long extend over the rest of the bucket: every plan row the cap keeps is used."""
    return [(127, 1)] * (SLOTS - 1) + [(127, N - (SLOTS - 1))]


BATCHES = {"mixed": mixed(), "uniform": uniform(), "worst": worst()}


def kv_pool():
    """Upstream's DSV4 pool from ``kits.dsv4_cpu.kv_pool``, with the c4 state ring sized for its
    SWA pages (the fp8 pool addresses c4 state by SWA location: one ring per page), so every
    request's c4 compressor state is in bounds."""
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import resolve_compress_state_ring_size

    size = (SLOTS + 1) * CTX
    return K.kv_pool(
        max_reqs=SLOTS,
        size=size,
        ratios=RATIOS,
        device=DEV,
        c4_state_slots=size // K.PAGE * resolve_compress_state_ring_size(4),
    )


class World:
    """Upstream's pool, one request table, the static per-token inputs the graphs read."""

    def __init__(self):
        from sglang.kernels.ops.attention.dsv4.rope import precompute_freqs_cis
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        self.pool = kv_pool()
        self.reqs = ReqToTokenPool(
            size=SLOTS, max_context_len=CTX, device=DEV, enable_memory_saver=False
        )
        rows = torch.arange(SLOTS + 1, device=DEV, dtype=torch.int32)[:, None] * CTX
        self.reqs.req_to_token.copy_(rows + torch.arange(CTX, device=DEV, dtype=torch.int32))
        g = torch.Generator(device=DEV).manual_seed(5)
        self.freqs = precompute_freqs_cis(64, CTX, 0, 10000.0, 1.0, 32, 1).to(DEV)
        self.norm = types.SimpleNamespace(
            weight=torch.rand(HEAD, generator=g, device=DEV) + 0.5, variance_epsilon=1e-6
        )
        self.ape = {
            r: torch.randn(r, (2 if r == 4 else 1) * HEAD, generator=g, device=DEV) for r in RATIOS
        }
        self.kv_in = {
            r: torch.zeros(N, 2 * (2 if r == 4 else 1) * HEAD, device=DEV) for r in RATIOS
        }
        self.out_loc = {r: torch.zeros(N, dtype=torch.int64, device=DEV) for r in RATIOS}
        for layer in range(len(RATIOS)):
            state = self.state(layer)
            state.copy_(torch.randn(state.shape, generator=g, device=DEV).to(state.dtype))
        self.g = g

    def state(self, layer):
        return self.pool.get_attention_compress_states(layer).kv_score_buffer.kv_score

    def cache(self, layer):
        return self.pool.get_extra_key_buffer(layer).view(torch.uint8)

    def views(self):
        """Every byte the compressors write: each layer's state ring and compressed cache."""
        return [
            t
            for layer in range(len(RATIOS))
            for t in (self.state(layer).view(torch.uint8), self.cache(layer))
        ]

    def snapshot(self):
        return [t.clone() for t in self.views()]

    def restore(self, saved):
        for t, s in zip(self.views(), saved, strict=True):
            t.copy_(s)

    def plan(self, ratio, batch, host=False):
        """Upstream's planner: GPU lengths at the bucket's rows (capture, replay) or host lists
        (the eager step)."""
        from sglang.srt.layers.attention.dsv4.compressor_v2 import create_paged_compressor_data

        seq = [p + e for p, e in batch]
        ext = [e for _, e in batch]
        gpu = lambda xs: torch.tensor(xs, dtype=torch.int64, device=DEV)  # noqa: E731
        return create_paged_compressor_data(
            ratio,
            is_prefill=True,
            token_to_kv_pool=self.pool,
            req_to_token=self.reqs.req_to_token,
            req_pool_indices=gpu(list(range(1, len(batch) + 1))),
            seq_lens=gpu(seq),
            extend_lens=gpu(ext),
            seq_lens_cpu=seq if host else None,
            extend_lens_cpu=ext if host else None,
            use_prefill_cuda_graph=not host,
            num_q_tokens=None if host else N,
        )

    def load(self, batch):
        """The batch's per-token inputs into the static buffers (the padded rows zero)."""
        tokens = sum(e for _, e in batch)
        locs = torch.cat(
            [
                rid * CTX + torch.arange(p, p + e, device=DEV)
                for rid, (p, e) in enumerate(batch, start=1)
            ]
        )
        for r in RATIOS:
            self.kv_in[r].zero_()
            self.kv_in[r][:tokens].copy_(
                torch.randn((tokens, self.kv_in[r].shape[1]), generator=self.g, device=DEV)
            )
            self.out_loc[r].zero_()
            self.out_loc[r][:tokens].copy_(locs // r)
        return tokens


def backend(world, plans):
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend

    b = object.__new__(DeepseekV4AttnBackend)
    b.model_runner = types.SimpleNamespace(req_to_token_pool=world.reqs)
    core = types.SimpleNamespace(**{f"c{r}_out_loc": world.out_loc[r] for r in RATIOS})
    b.forward_metadata = types.SimpleNamespace(
        c4_compress_metadata=plans[4],
        c128_compress_metadata=plans[128],
        core_attn_metadata=core,
        core_metadata=core,
    )
    return b


def compressors(world, b, rows=N):
    """Both layers' compressors through upstream's mixin, as ``forward_unified`` calls them."""
    for layer, r in enumerate(RATIOS):
        b._forward_compress_all_in_one(
            kv_score_buffer=world.state(layer),
            kv_score_input=world.kv_in[r][:rows],
            ape=world.ape[r],
            head_dim=HEAD,
            norm=world.norm,
            freqs_cis_cache=world.freqs,
            kv_cache=world.cache(layer),
            is_indexer=False,
            rotate=False,
            compress_ratio=r,
            page_size=world.pool.get_extra_key_page_size(layer),
            out_loc=world.out_loc[r][:rows],
            kv_layout=world.pool.get_extra_key_layout(layer),
        )


def capture(world, b):
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compressors(world, b)
    torch.cuda.synchronize()
    return graph


@pytest.fixture(scope="module")
def graphs(sglang_cuda):
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        enable_breakable_cuda_graph,
    )

    world = World()
    initial = world.snapshot()
    capture_batch = [(0, N)]  # upstream captures a bucket as one request of N tokens
    world.load(capture_batch)
    full = backend(world, {r: world.plan(r, capture_batch) for r in RATIOS})
    capped = backend(world, {r: world.plan(r, capture_batch) for r in RATIOS})
    compressors(world, full)  # build the JIT modules outside any capture
    world.restore(initial)
    full_graph = capture(world, full)
    counters.reset()
    with installed((cap.PATCH,), {cap.FLAG.name: "1"}), enable_breakable_cuda_graph():
        capped_graph = capture(world, capped)
    assert counters.get(cap.PATCH_ID, "plans_capped.c4") == 1
    assert counters.get(cap.PATCH_ID, "plans_capped.c128") == 1
    world.restore(initial)
    return world, initial, (full, full_graph), (capped, capped_graph)


@pytest.mark.parametrize("name", list(BATCHES))
def test_capped_replays_write_the_bytes_of_full_replays(graphs, name):
    world, initial, (full, full_graph), (capped, capped_graph) = graphs
    batch = BATCHES[name]
    assert len(batch) <= SLOTS and sum(e for _, e in batch) <= N
    tokens = world.load(batch)
    results = {}
    for r in RATIOS:
        plan = world.plan(r, batch)  # once: both captures replay the same plan bytes
        events = compress_events([p + e for p, e in batch], [e for _, e in batch], r)
        assert events <= plan_cap(N, r, SLOTS)
        getattr(full.forward_metadata, f"c{r}_compress_metadata").copy_(plan)
        getattr(capped.forward_metadata, f"c{r}_compress_metadata").copy_(plan)
    if name == "worst":
        assert compress_events([p + e for p, e in batch], [e for _, e in batch], 128) == (
            plan_cap(N, 128, SLOTS)
        )
    for label, graph in (("full", full_graph), ("capped", capped_graph)):
        world.restore(initial)
        graph.replay()
        torch.cuda.synchronize()
        results[label] = world.snapshot()
    # Upstream's eager step: the host plan, exactly the batch's events.
    world.restore(initial)
    eager = backend(world, {r: world.plan(r, batch, host=True) for r in RATIOS})
    compressors(world, eager, rows=tokens)
    torch.cuda.synchronize()
    results["eager"] = world.snapshot()
    changed = [not torch.equal(a, b) for a, b in zip(results["full"], initial, strict=True)]
    assert any(changed), "the replay wrote nothing: the comparison would prove nothing"
    for label in ("capped", "eager"):
        for i, (a, b) in enumerate(zip(results["full"], results[label], strict=True)):
            assert torch.equal(a, b), f"{name}: {label} differs from the full plan in buffer {i}"
    world.restore(initial)
