"""live_width_indexer on the GPU against upstream's own breakable capture of the c4 indexer.

Two identical worlds (upstream's DSV4 pool, backend by its real ``__init__``, real metadata
builders, FlashMLA), one bucket each, the same body per layer: for the c4 layer upstream's
``C4Indexer.forward`` -> ``forward_c4_indexer`` (torch logits ``fp8_paged_mqa_logits_torch`` and
torch top-k, what the GPU kit's server runs), then the model's attention break. One bucket is
captured as upstream does (the indexer inside the graph, at the capture width); the other with
the patch installed (the indexer an eager break at the live width). Every replay must give the
same top-k and the same attention output, bit for bit. Stand-ins: the indexer's projections
(seeded fp8 queries and weights) and its key cache (seeded fp8 keys and scales)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits import dsv4_gpu as G
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import live_width_indexer as lw

BUCKET = 64
MAX_CTX = 4096  # the capture width: 16 pages, room for a request beyond 4 x top-k tokens
HEADS, DIM = 64, 128  # DSV4-Pro's indexer heads and head dim
C4 = K.LAYER_RATIOS.index(4)
SENTINEL = -7  # what the c4 top-k holds before each replay: the indexer must overwrite it
# The short requests first, so that a live batch of the first n requests stays within top-k.
WORLD = K.Step(prefill=[(300, 16), (580, 21)], decode=[130, 5, 2199], seed=61)
S = WORLD.seq_lens  # [316, 601, 131, 6, 2200]: the last one holds 550 > 512 c4 entries
LIVE = {
    "capture": K.Step(prefill=[(S[0] - 16, 16), (S[1] - 21, 21)], decode=[S[2] - 1, S[3] - 1]),
    "mixed": K.Step(prefill=[(S[0] - 9, 9)], decode=[S[1] - 1, S[2] - 1, S[3] - 1]),
    "mixed_b": K.Step(prefill=[(S[0] - 30, 30), (S[1] - 4, 4)], decode=[S[2] - 1]),
    "extend": K.Step(prefill=[(S[0] - 40, 40)], decode=[]),
    "long_decode": K.Step(
        prefill=[(S[0] - 5, 5), (S[1] - 10, 10)], decode=[S[2] - 1, S[3] - 1, S[4] - 1]
    ),
    "long_extend": K.Step(
        prefill=[(S[0] - 3, 3), (S[1] - 3, 3), (S[2] - 3, 3), (S[3] - 3, 3), (S[4] - 40, 40)],
        decode=[],
    ),
}
WITHIN = ("mixed", "mixed_b", "extend", "mixed")
BEYOND = ("long_decode", "long_extend")


class IndexerWorld(G.GpuWorld):
    """The GPU kit's world with upstream's torch top-k and a seeded indexer key cache; before a
    step the c4 top-k holds the sentinel instead of the kit's stand-in selection."""

    def __init__(self, step):
        from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend

        super().__init__(step, max_ctx=MAX_CTX)
        self.backend.dsa_topk_backend = DSATopKBackend.TORCH  # --dsa-topk-backend torch
        g = torch.Generator().manual_seed(step.seed + 7)
        cache = self.pool.get_index_k_with_scale_buffer(layer_id=C4)  # (pages, 64 x 132) bytes
        values = torch.randn(cache.shape[0], 64 * DIM, generator=g).to(torch.float8_e4m3fn)
        scales = torch.rand(cache.shape[0], 64, generator=g) + 0.5
        cache[:, : 64 * DIM] = values.view(torch.uint8).to(cache.device)
        cache[:, 64 * DIM :] = scales.view(torch.uint8).to(cache.device)

    def write_c4_topk(self, metadata) -> None:
        metadata.core_attn_metadata.c4_sparse_page_indices.fill_(SENTINEL)


class IndexerBucket(G.BreakableBucket):
    """The kit's bucket with upstream's c4 indexer before the c4 layer's attention, under
    upstream's breakable-graph scope (``enable_breakable_cuda_graph``, as the runner's capture
    and replay sessions set it)."""

    def __init__(self, world):
        super().__init__(world, BUCKET)
        self.iq = torch.zeros(BUCKET, HEADS, DIM, device=G.DEV).to(torch.float8_e4m3fn)
        self.iw = torch.zeros(BUCKET, HEADS, 1, device=G.DEV)
        self.lora = torch.zeros(BUCKET, 8, device=G.DEV)
        self.indexer = _indexer_standin(self)
        self.static_fb = None

    def _contexts(self, static_fb):
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
            enable_breakable_cuda_graph,
        )

        self.static_fb = static_fb
        stack = contextlib.ExitStack()
        stack.enter_context(super()._contexts(static_fb))
        stack.enter_context(enable_breakable_cuda_graph())
        return stack

    def run_indexer(self) -> None:
        """Upstream's c4 indexer on the bucket's static batch, as the model calls it."""
        from sglang.srt.layers.attention.dsv4.indexer import C4Indexer

        C4Indexer.forward(
            self.indexer,
            x=self.lora,
            q_lora=self.lora,
            forward_batch=self.static_fb,
            attn_backend=self.world.backend,
            skip_compressor=True,
        )

    def _body(self):
        from sglang.srt.models.deepseek_v4 import bcg_deepseek_v4_attention_with_output

        for layer in self.layers:
            q = self.q * 1.0
            if layer == C4:
                self.run_indexer()
            o = torch.empty_like(q)
            bcg_deepseek_v4_attention_with_output(
                q, q, o, layer, K.LAYER_RATIOS[layer], self.sink, False
            )
            self.outputs[layer] = o + 0.0

    def load_indexer_inputs(self, rows: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.iq.view(torch.uint8).zero_()
        self.iw.zero_()
        self.iq[:rows] = torch.randn(rows, HEADS, DIM, generator=g).to(torch.float8_e4m3fn).cuda()
        self.iw[:rows] = (torch.rand(rows, HEADS, 1, generator=g) + 0.1).cuda()

    def topk(self, rows: int) -> torch.Tensor:
        return self.metadata.core_attn_metadata.c4_sparse_page_indices[:rows].clone()


def _indexer_standin(bucket):
    """The ``C4Indexer`` surface ``forward_c4_indexer`` reads: the projections return the
    bucket's static query and weight buffers."""
    from types import SimpleNamespace

    return SimpleNamespace(
        use_fp4_indexer=False,
        layer_id=C4,
        alt_streams=None,
        compressor=None,
        compute_weights=lambda x, skip_scale=False: bucket.iw,
        compute_q=lambda q_lora, positions, weights, q_lora_quant=None: (bucket.iq, weights),
    )


def _live(world, name):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    view = world.view(K.Step(LIVE[name].prefill, LIVE[name].decode, seed=WORLD.seed))
    mode = ForwardMode.MIXED if view.step.decode and view.step.prefill else ForwardMode.EXTEND
    return view, view.forward_batch(mode=mode)


def _run(bucket, name, capture=False):
    view, fb = _live(bucket.world, name)
    rows = view.step.num_rows
    bucket.load_indexer_inputs(rows, seed=rows)
    if capture:
        bucket.capture(view, fb, view.q())
        return None, None, rows
    out = bucket.replay(view, fb, view.q())
    return out, bucket.topk(rows), rows


@pytest.fixture(scope="module")
def arms(sglang_cuda):
    """Upstream's capture and the patch's, from the same batch over identical worlds."""
    from sglang.srt.environ import envs

    with envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.override(True):
        upstream = IndexerBucket(IndexerWorld(WORLD))
        _run(upstream, "capture", capture=True)
        patched = IndexerBucket(IndexerWorld(WORLD))
        counters.reset()
        with installed((lw.PATCH,), {lw.FLAG.name: "1"}):
            _run(patched, "capture", capture=True)
        # The c4 indexer became a break, in the warm-up and in the capture.
        assert counters.get(lw.PATCH_ID, "layers_wrapped") == 2
        assert len(patched.graph._break_fns) == len(upstream.graph._break_fns) + 1
        yield upstream, patched


def _replay_both(arms, name):
    upstream, patched = arms
    counters.reset()
    want, want_topk, rows = _run(upstream, name)
    assert counters.get(lw.PATCH_ID, "breaks_run") == 0  # upstream's replay: no break of ours
    got, got_topk, _ = _run(patched, name)
    assert counters.get(lw.PATCH_ID, "breaks_run") == 1
    for topk in (want_topk, got_topk):
        assert not (topk == SENTINEL).any(), "the indexer did not write the c4 top-k"
        assert (topk >= 0).any()
    return want, want_topk, got, got_topk, rows


def _assert_patched_replay_equals_upstreams(arms, name, narrowed: int, full_width: int):
    want, want_topk, got, got_topk, rows = _replay_both(arms, name)
    assert counters.get(lw.PATCH_ID, "breaks_narrowed") == narrowed
    assert counters.get(lw.PATCH_ID, "breaks_full_width") == full_width
    assert torch.equal(got_topk, want_topk)
    for layer in want:
        assert torch.equal(got[layer][:rows], want[layer][:rows]), f"layer {layer} differs"


@pytest.mark.parametrize("name", WITHIN)
def test_within_the_topk_the_break_at_the_live_width_equals_upstreams_capture(arms, name):
    _assert_patched_replay_equals_upstreams(arms, name, narrowed=1, full_width=0)


@pytest.mark.parametrize("name", BEYOND)
def test_beyond_the_topk_the_break_keeps_upstreams_selection(arms, name):
    _assert_patched_replay_equals_upstreams(arms, name, narrowed=0, full_width=1)


@pytest.mark.parametrize("name", BEYOND)
def test_upstream_over_a_narrowed_table_picks_the_same_entries(arms, name):
    """Why the patch keeps the capture width there: upstream's indexer run eagerly over the
    replayed metadata with the table narrowed to the live pages picks each row's entries from
    the same set; whether it also returns them in the same order is printed (``-s``)."""

    upstream, _ = arms
    _, captured, _, _, rows = _replay_both(arms, name)
    meta = upstream.metadata.indexer_metadata
    full = meta.page_table
    pages = lw.live_pages(_live(upstream.world, name)[1].seq_lens_cpu, K.PAGE, full.shape[1])
    assert pages < full.shape[1]
    meta.page_table = full[:, :pages]
    try:
        with torch.no_grad(), upstream._contexts(upstream.static_fb):
            upstream.run_indexer()
    finally:
        meta.page_table = full
    narrowed = upstream.topk(rows)
    assert [set(r.tolist()) for r in narrowed] == [set(r.tolist()) for r in captured]
    reordered = int((narrowed != captured).any(dim=1).sum())
    print(
        f"{name}: {reordered} of {rows} rows in another order over {pages} of {full.shape[1]} pages"
    )
