"""live_width_indexer on CPU against upstream's own c4 indexer scoring: ``C4Indexer.forward`` ->
``C4IndexerBackendMixin.forward_c4_indexer`` with its torch logits
(``fp8_paged_mqa_logits_torch``, SGLANG_FP8_PAGED_MQA_LOGITS_TORCH) and torch top-k
(``topk_transform_pytorch_vectorized``, ``--dsa-topk-backend torch``) over upstream's DSV4 pool's
indexer key cache and a ``PagedIndexerMetadata``. Stand-ins: the indexer's projections (random
fp8 queries and weights) and the metadata's page table, built here as upstream's builder lays it
out (each row its request's pages, the capture width's tail unused). The break's top-k must be
the one the capture width gives, bit for bit."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.patches import live_width_indexer as lw

HEADS, DIM = 64, 128  # DSV4-Pro's indexer heads and head dim (the torch logits assert 128)
PAGES, WIDTH_PAGES, TOPK = 64, 32, 512  # pool pages; the capture width: 8192 tokens


@pytest.fixture(scope="module")
def upstream():
    with K.sglang_context():
        from sglang.srt.environ import envs
        from sglang.srt.layers.attention import deepseek_v4_backend as dsv4
        from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend
        from sglang.srt.layers.attention.dsv4 import indexer
        from sglang.srt.layers.attention.dsv4.metadata import PagedIndexerMetadata
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
            set_tc_piecewise_forward_context,
        )

        with envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.override(True):
            yield types.SimpleNamespace(
                dsv4=dsv4,
                topk_backend=DSATopKBackend.TORCH,
                forward=indexer.C4Indexer.forward,
                metadata=PagedIndexerMetadata,
                extend=ForwardMode.EXTEND,
                tc_context=set_tc_piecewise_forward_context,
            )


class Step:
    """Upstream's backend, pool and one step's indexer inputs for ``requests`` (seq, new)."""

    def __init__(self, up, requests, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.up = up
        pool = K.kv_pool(max_reqs=8, size=PAGES * K.PAGE, ratios=K.LAYER_RATIOS, device="cpu")
        self.layer = K.LAYER_RATIOS.index(4)
        cache = pool.get_index_k_with_scale_buffer(layer_id=self.layer)  # (pages, 64 x 132) bytes
        values = torch.randn(cache.shape[0], 64 * DIM, generator=g).to(torch.float8_e4m3fn)
        scales = torch.rand(cache.shape[0], 64, generator=g) + 0.5
        cache[:, : 64 * DIM] = values.view(torch.uint8)
        cache[:, 64 * DIM :] = scales.view(torch.uint8)
        free = (torch.randperm(PAGES - 1, generator=g) + 1).tolist()
        tables, positions = [], []
        for seq, new in requests:
            own, free = free[: -(-seq // K.PAGE)], free[-(-seq // K.PAGE) :]
            table = torch.zeros(WIDTH_PAGES, dtype=torch.int32)
            table[: len(own)] = torch.tensor(own, dtype=torch.int32)
            tables += [table] * new
            positions += range(seq - new, seq)
        self.page_table = torch.stack(tables)
        self.positions = torch.tensor(positions)
        rows = len(positions)
        self.q = torch.randn(rows, HEADS, DIM, generator=g).to(torch.float8_e4m3fn)
        self.weights = torch.rand(rows, HEADS, 1, generator=g)
        self.batch = types.SimpleNamespace(
            forward_mode=up.extend,
            seq_lens_cpu=torch.tensor([seq for seq, _ in requests]),
            input_ids=torch.zeros(rows, dtype=torch.int64),
            global_num_token_non_padded_cpu=rows,
        )
        backend = object.__new__(up.dsv4.DeepseekV4AttnBackend)
        backend.token_to_kv_pool = pool
        backend.hisparse_coordinator = None
        backend.debug_use_external_c4_sparse_indices = False
        backend.dsa_topk_backend = up.topk_backend
        self.backend = backend
        self.indexer = types.SimpleNamespace(
            use_fp4_indexer=False,
            layer_id=self.layer,
            alt_streams=None,
            compute_weights=lambda x, skip_scale=False: self.weights,
            compute_q=lambda q_lora, positions, weights, q_lora_quant=None: (self.q, weights),
        )

    def _set_metadata(self, table):
        meta = self.up.metadata(
            page_size=K.PAGE,
            compressed_page_size=K.PAGE // 4,
            page_table=table,
            compressed_seq_lens=((self.positions + 1) // 4).to(torch.int32),
            use_topk_v2=False,
        )
        core = types.SimpleNamespace(
            positions=self.positions,
            c4_sparse_page_indices=torch.full((len(self.positions), TOPK), -2, dtype=torch.int32),
            c4_sparse_raw_indices=None,
        )
        self.backend.forward_metadata = types.SimpleNamespace(
            indexer_metadata=meta, core_metadata=core
        )
        return core

    def _args(self):
        rows = len(self.positions)
        return self.indexer, torch.zeros(rows, 8), torch.zeros(rows, 8)

    def upstream_topk(self, pages: int = WIDTH_PAGES) -> torch.Tensor:
        """Upstream's indexer over the first ``pages`` columns of the table."""
        core = self._set_metadata(self.page_table[:, :pages])
        indexer, x, q_lora = self._args()
        self.up.forward(indexer, x, q_lora, self.batch, self.backend, skip_compressor=True)
        return core.c4_sparse_page_indices.clone()

    def break_topk(self) -> torch.Tensor:
        """The patch's eager break, as a replay runs it, over the capture width's table."""
        core = self._set_metadata(self.page_table)
        indexer, x, q_lora = self._args()
        with self.up.tc_context(self.batch, [], None, [], []):
            lw._indexer_at_live_width(self.up.forward, indexer, x, q_lora, self.backend, None)
        assert self.backend.forward_metadata.indexer_metadata.page_table.shape[1] == WIDTH_PAGES
        return core.c4_sparse_page_indices.clone()


@pytest.fixture(autouse=True)
def fresh_counters():
    counters.reset()


def test_within_the_topk_the_break_at_the_live_width_selects_what_the_capture_width_does(
    upstream,
):
    # Every request sees at most 2048 // 4 = 512 c4 entries: the narrowed table is exact.
    step = Step(upstream, [(2000, 40), (2048, 1), (700, 1), (40, 1), (1990, 1)])
    captured = step.upstream_topk()
    assert (captured >= 0).any() and (captured == -1).any()  # entries picked, short rows padded
    assert torch.equal(step.break_topk(), captured)
    assert counters.get(lw.PATCH_ID, "breaks_narrowed") == 1  # 8 of the 32 pages were scored


def test_beyond_the_topk_the_break_keeps_the_capture_widths_selection(upstream):
    step = Step(upstream, [(3000, 48), (2500, 1), (700, 1), (2990, 1)])
    captured = step.upstream_topk()
    narrowed = step.upstream_topk(pages=-(-3000 // K.PAGE))
    # Upstream over the narrower table picks the same entries per row, but it ranks the longer
    # rows over another width and need not return them in the same order.
    assert [set(r.tolist()) for r in narrowed] == [set(r.tolist()) for r in captured]
    assert torch.equal(step.break_topk(), captured)
    assert counters.get(lw.PATCH_ID, "breaks_full_width") == 1
    assert counters.get(lw.PATCH_ID, "breaks_narrowed") == 0
