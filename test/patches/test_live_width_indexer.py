"""live_width_indexer on CPU: upstream's real ``C4Indexer.forward``, its breakable capture and
replay (``kits.bcg_cpu`` stands in for the CUDA graph objects), its breakable-graph and forward
contexts; the backend's ``forward_c4_indexer`` and compressor are stand-ins that record what
they were given. Whether the narrowed indexer selects the same top-k as upstream's is
test_live_width_indexer_upstream_topk.py's question on the CPU, and on the GPU
test/gpu_upstream/test_live_width_indexer_upstream.py's and the end-to-end phase's
(``bcg-<split>-lw``)."""

from __future__ import annotations

import inspect
import logging
import types

import pytest
import torch
from sglang.srt.layers.attention.dsv4 import indexer as upstream_indexer
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg,
)
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    enable_breakable_cuda_graph,
)
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
    set_tc_piecewise_forward_context,
)

from sglang_mixgraph import counters, fallback
from sglang_mixgraph.kits import bcg_cpu
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import live_width_indexer as lw

ON = {lw.FLAG.name: "1"}
ROWS, WIDTH_PAGES, PAGE = 8, 32, 256  # the capture's page table: 8192 tokens of context
TOPK = 2048  # c4 entries a row keeps: every batch below but the long-row test's stays within it


class Backend:
    """The attention backend's surface the indexer call touches; records each call."""

    def __init__(self, topk: int = TOPK):
        table = torch.arange(ROWS * WIDTH_PAGES, dtype=torch.int32).view(ROWS, WIDTH_PAGES)
        meta = types.SimpleNamespace(page_table=table, page_size=PAGE)
        core = types.SimpleNamespace(c4_sparse_page_indices=torch.zeros(ROWS, topk))
        self.forward_metadata = types.SimpleNamespace(indexer_metadata=meta, core_metadata=core)
        self.calls: list = []

    def forward_indexer_compressor(self, x, forward_batch, layer_id, compressor):
        self.calls.append(("compressor", layer_id))

    def forward_c4_indexer(self, *, forward_batch, skip_compressor, enable_multi_stream, **kw):
        table = self.forward_metadata.indexer_metadata.page_table
        assert table.stride() == (WIDTH_PAGES, 1)  # a view of the captured table
        self.calls.append(
            ("indexer", table.shape[1], skip_compressor, enable_multi_stream, forward_batch)
        )


def _batch(seq_lens, mode=ForwardMode.MIXED, live_rows=ROWS):
    return types.SimpleNamespace(
        forward_mode=mode,
        seq_lens_cpu=torch.tensor(seq_lens),
        input_ids=torch.zeros(ROWS, dtype=torch.int64),  # the bucket's rows
        global_num_token_non_padded_cpu=live_rows,
    )


def _layer():
    return types.SimpleNamespace(layer_id=3, compressor="c4-compressor", alt_streams=None)


def _call(backend, batch, **kw):
    upstream_indexer.C4Indexer.forward(
        _layer(),
        x=torch.zeros(ROWS, 4),
        q_lora=torch.zeros(ROWS, 4),
        forward_batch=batch,
        attn_backend=backend,
        **kw,
    )


def _capture(backend, batch, **kw):
    """One c4 layer's indexer call captured as upstream's breakable prefill runner would."""
    graph = bcg.BreakableCUDAGraph()
    with enable_breakable_cuda_graph(), set_tc_piecewise_forward_context(batch, [], None, [], []):
        with bcg.BreakableCUDAGraphCapture(graph):
            _call(backend, batch, **kw)
    return graph


def _replay(graph, batch):
    with enable_breakable_cuda_graph(), set_tc_piecewise_forward_context(batch, [], None, [], []):
        graph.replay()


@pytest.fixture
def world(monkeypatch):
    counters.reset()
    return bcg_cpu.install(monkeypatch)


@pytest.mark.parametrize(
    ("seq_lens", "pages"),
    [([300, 900], 4), ([256], 1), ([257], 2), ([1, 1], 1), ([8192], 32), ([20000], 32), ([], 1)],
)
def test_live_pages_cover_the_longest_sequence_within_the_capture_width(seq_lens, pages):
    assert lw.live_pages(seq_lens, PAGE, WIDTH_PAGES) == pages


def test_upstream_captures_the_indexer_at_the_capture_width(world):
    backend = Backend()
    graph = _capture(backend, _batch([600, 90]))
    assert [c[:3] for c in backend.calls] == [("indexer", WIDTH_PAGES, False)]
    assert len(graph._segments) == 1 and graph._break_fns == []
    backend.calls.clear()
    _replay(graph, _batch([1200, 90]))
    assert backend.calls == []  # all of it captured: nothing runs on the host at replay


def test_the_indexer_becomes_one_break_at_the_live_width(world):
    backend = Backend()
    capture_batch = _batch([600, 90])
    with installed((lw.PATCH,), ON):
        graph = _capture(backend, capture_batch)
        # The compressor is captured, the rest of the indexer is the break (run once at capture).
        assert backend.calls == [("compressor", 3), ("indexer", 3, True, False, capture_batch)]
        assert len(graph._segments) == 2 and len(graph._break_fns) == 1
        for seq_lens, pages in (([1200, 90], 5), ([8000], 32), ([5, 7], 1)):
            backend.calls.clear()
            live = _batch(seq_lens)
            _replay(graph, live)
            # The break reads the replay's batch and narrows to its longest sequence.
            assert backend.calls == [("indexer", pages, True, False, live)]
            assert backend.forward_metadata.indexer_metadata.page_table.shape[1] == WIDTH_PAGES
    assert counters.get(lw.PATCH_ID, "layers_wrapped") == 1
    assert counters.get(lw.PATCH_ID, "breaks_run") == 4
    assert counters.get(lw.PATCH_ID, "breaks_narrowed") == 3


def test_a_step_with_rows_beyond_the_topk_keeps_the_capture_width_and_says_so_once(
    world, caplog, monkeypatch
):
    monkeypatch.setattr(fallback, "_said", set())  # "once" per process: this test's own once
    backend = Backend(topk=256)  # rows of more than 1024 tokens see more than 256 c4 entries
    with installed((lw.PATCH,), ON), caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
        graph = _capture(backend, _batch([600, 90]))
        for seq_lens, pages in (([1200, 90], WIDTH_PAGES), ([1024, 7], 4), ([1500], WIDTH_PAGES)):
            backend.calls.clear()
            _replay(graph, _batch(seq_lens))
            assert [c[1] for c in backend.calls] == [pages]
            assert backend.forward_metadata.indexer_metadata.page_table.shape[1] == WIDTH_PAGES
    assert counters.get(lw.PATCH_ID, "breaks_full_width") == 2
    assert counters.get(lw.PATCH_ID, "breaks_narrowed") == 2  # the capture run and [1024, 7]
    said = [r.getMessage() for r in caplog.records if lw.FALLBACKS["long_rows"] in r.getMessage()]
    assert len(said) == 1


@pytest.mark.parametrize(
    ("seq_lens", "topk", "exact"),
    [
        ([4096], 1024, True),
        ([4099], 1024, True),
        ([4100], 1024, False),
        ([10, 9000], 2048, False),
        ([], 1, True),
    ],
)
def test_narrowing_is_exact_while_no_request_sees_more_than_topk_entries(seq_lens, topk, exact):
    assert lw.narrowing_is_exact(seq_lens, topk) is exact


def test_a_compressor_already_run_is_not_run_again(world):
    backend = Backend()
    with installed((lw.PATCH,), ON):
        _capture(backend, _batch([600]), skip_compressor=True)
    assert [c[0] for c in backend.calls] == ["indexer"]


def test_an_idle_step_skips_the_break(world):
    backend = Backend()
    with installed((lw.PATCH,), ON):
        graph = _capture(backend, _batch([600]))
        backend.calls.clear()
        _replay(graph, _batch([600], live_rows=0))
    assert backend.calls == []


def test_the_captured_table_is_restored_when_the_indexer_raises(world, monkeypatch):
    """In a warm-up run (a breakable graph, no capture) the break runs in place."""
    backend = Backend()

    def boom(**kw):
        raise RuntimeError("indexer failed")

    monkeypatch.setattr(backend, "forward_c4_indexer", boom)
    batch = _batch([600])
    with installed((lw.PATCH,), ON), pytest.raises(RuntimeError, match="indexer failed"):
        with (
            enable_breakable_cuda_graph(),
            set_tc_piecewise_forward_context(batch, [], None, [], []),
        ):
            _call(backend, batch)
    assert backend.forward_metadata.indexer_metadata.page_table.shape[1] == WIDTH_PAGES


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.IDLE])
def test_steps_outside_prefill_graphs_are_upstreams(world, mode):
    backend = Backend()
    with installed((lw.PATCH,), ON):
        graph = _capture(backend, _batch([600], mode=mode))
        with set_tc_piecewise_forward_context(_batch([600]), [], None, [], []):
            _call(backend, _batch([600]))  # an eager step: not in a breakable graph
    assert [c[:3] for c in backend.calls] == [("indexer", WIDTH_PAGES, False)] * 2
    assert graph._break_fns == []
    assert counters.snapshot()["fallbacks"].get(lw.PATCH_ID) is None


@pytest.mark.parametrize("case", ["multi_stream", "replay_tail"])
def test_unhandled_captures_fall_back_to_upstream_and_say_so_once(world, monkeypatch, case, caplog):
    from sglang.srt.models import deepseek_v4_replay_tail as tail

    kw = {}
    if case == "multi_stream":
        kw = {"enable_multi_stream": True}
    else:
        monkeypatch.setattr(tail, "_in_replay_tail", True)
    backend = Backend()
    with installed((lw.PATCH,), ON), caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
        for _ in range(2):
            graph = _capture(backend, _batch([600]), **kw)
            assert graph._break_fns == []
    assert [c[:4] for c in backend.calls] == [
        ("indexer", WIDTH_PAGES, False, case == "multi_stream")
    ] * 2
    assert counters.snapshot()["fallbacks"][lw.PATCH_ID] == {case: 2}
    said = [r.getMessage() for r in caplog.records if lw.FALLBACKS[case] in r.getMessage()]
    assert len(said) == 1


def test_flag_off_leaves_upstream_untouched():
    raw = inspect.getattr_static(upstream_indexer.C4Indexer, "forward")
    with installed((lw.PATCH,), {lw.FLAG.name: "0"}) as (status,):
        assert not status.enabled
        assert inspect.getattr_static(upstream_indexer.C4Indexer, "forward") is raw
    with installed((lw.PATCH,), ON) as (status,):  # the same check sees an installed hook
        assert status.enabled
        assert inspect.getattr_static(upstream_indexer.C4Indexer, "forward") is not raw


@pytest.mark.parametrize(
    ("overlap", "says"),
    [(None, "falls back to upstream"), ("1", "falls back"), ("0", "eager break")],
)
def test_plan_says_what_the_patch_does_with_the_stream_overlap(monkeypatch, overlap, says):
    if overlap is None:
        monkeypatch.delenv(lw.MULTI_STREAM_FLAG, raising=False)  # upstream's default: on
    else:
        monkeypatch.setenv(lw.MULTI_STREAM_FLAG, overlap)
    plan = types.SimpleNamespace(
        facts=types.SimpleNamespace(deepseek_v4=True),
        prefill=types.SimpleNamespace(backend="breakable", buckets=[2816]),
    )
    assert says in lw.explain_for_deployment(plan)
    plan.prefill.backend = "disabled"
    assert "no breakable prefill graph" in lw.explain_for_deployment(plan)
