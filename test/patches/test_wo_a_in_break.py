"""wo_a_in_break on CPU: upstream's real attention break (``bcg_deepseek_v4_attention_with_output``, its
Python body: the op is registered for CUDA only),
its real bf16 wo_a (``_apply_wo_a_bf16_matmul``, einsum on a CPU), its breakable capture and
replay (``kits.bcg_cpu`` stands in for the CUDA graph objects) and its breakable-graph and
piecewise forward contexts. Stand-ins: the attention backend (a seeded function of the query
rows that records its calls) and the inverse RoPE's CUDA kernel (a torch rotation with
``fused_rope_inplace``'s signature). On a CPU the captured segments run only at capture, so a
replay shows what the breaks compute; whether the patched replay equals upstream's on FlashMLA
is test/gpu_upstream/test_wo_a_in_break_upstream.py's question."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg,
)
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    enable_breakable_cuda_graph,
)
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
    set_tc_piecewise_forward_context,
)
from sglang.srt.models import deepseek_v4 as dsv4

from sglang_mixgraph import counters, fallback
from sglang_mixgraph.kits import bcg_cpu
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import wo_a_in_break as wb

ON = {wb.FLAG.name: "1"}
BUCKET, HEADS, HEAD_DIM, ROPE = 8, 4, 8, 4
GROUPS, RANK = 2, 6  # wo_a: [groups, rank, heads * head_dim / groups]
LAYERS = (0, 1)


class Backend:
    """The attention backend's ``forward``: a seeded function of each query row; records the
    rows and the cache locations it saw."""

    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.scale = torch.randn(HEADS, HEAD_DIM, generator=g)
        self.calls: list[tuple[int, int]] = []

    def forward(self, q, k, v, layer, forward_batch, compress_ratio, attn_sink, save_kv_cache):
        assert k is v
        self.calls.append((q.shape[0], forward_batch.out_cache_loc.shape[0]))
        return (q * self.scale + attn_sink[: q.shape[1], None] + layer.layer_id).contiguous()


def rope_reference(q, k, freqs_cis, positions, inverse=False):
    """``fused_rope_inplace``'s contract in torch: rotate pairs of ``q``'s last dim in place by
    ``freqs_cis[positions]`` (conjugated when ``inverse``)."""
    rope_reference.calls.append(q.shape[0])
    f = freqs_cis[positions][:, None, :]
    f = f.conj() if inverse else f
    pairs = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2).contiguous())
    q.copy_(torch.view_as_real(pairs * f).flatten(-2).to(q.dtype))


rope_reference.calls = []


def _layer(**overrides):
    g = torch.Generator().manual_seed(5)
    wo_a = torch.randn(GROUPS * RANK, HEADS * HEAD_DIM // GROUPS, generator=g)
    fields = dict(
        wo_a_fp8=False,
        use_fused_wo_a=False,
        use_flashinfer_mxfp8_wo_b=False,
        wo_a=types.SimpleNamespace(weight=wo_a),
    )
    return types.SimpleNamespace(**{**fields, **overrides})


class Bucket:
    """One bucket's static inputs and the layer body ``MQALayer.forward`` runs on the bf16 wo_a
    path: the attention break, the inverse RoPE on the output's RoPE part, wo_a on its
    ``[rows, groups, -1]`` view."""

    def __init__(self, layer=None, scoped=True):
        g = torch.Generator().manual_seed(7)
        self.q = torch.randn(BUCKET, HEADS, HEAD_DIM, generator=g)
        self.sink = torch.randn(HEADS, generator=g)
        self.positions = torch.arange(BUCKET, dtype=torch.int64) * 3
        self.freqs = torch.polar(torch.ones(64, ROPE // 2), torch.rand(64, ROPE // 2, generator=g))
        self.layer = _layer() if layer is None else layer
        self.scoped = scoped
        self.outputs: dict[int, torch.Tensor] = {}

    def wo_a(self):
        return self.layer.wo_a.weight.view(GROUPS, RANK, -1)

    def body(self, rope_k=None, is_decode=False):
        for layer in LAYERS:
            o = torch.empty_like(self.q)
            scope = wb.layer_scope(self.layer) if self.scoped else _nothing()
            with scope:
                dsv4.bcg_deepseek_v4_attention_with_output(
                    self.q, self.q, o, layer, 4, self.sink, False
                )
                dsv4.fused_rope_inplace(
                    o[..., -ROPE:], rope_k, self.freqs, positions=self.positions, inverse=True
                )
                self.outputs[layer] = dsv4._apply_wo_a_bf16_matmul(
                    o.view(BUCKET, GROUPS, -1), self.wo_a(), is_decode=is_decode, is_prefill=True
                )

    def eager(self, backend, rows: int, layer: int) -> torch.Tensor:
        """What the layer computes eagerly on ``rows`` live rows."""
        lay = types.SimpleNamespace(layer_id=layer)
        batch = _batch(rows)
        q = self.q[:rows]
        o = backend.forward(q, q, q, lay, batch, 4, self.sink, False)
        rope_reference(o[..., -ROPE:], None, self.freqs, self.positions[:rows], True)
        return torch.einsum("tgd,grd->tgr", o.view(rows, GROUPS, -1), self.wo_a())


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _batch(rows: int | None):
    """The static batch of a replay: the bucket's token rows, the live count (None: unset)."""
    return types.SimpleNamespace(
        global_num_token_non_padded_cpu=rows,
        input_ids=torch.zeros(BUCKET, dtype=torch.int64),
        out_cache_loc=torch.arange(BUCKET),
    )


ATTENTION_LAYERS = [types.SimpleNamespace(layer_id=i) for i in LAYERS]


def _contexts(batch):
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(enable_breakable_cuda_graph())
    stack.enter_context(set_tc_piecewise_forward_context(batch, ATTENTION_LAYERS, None, [], []))
    return stack


def _capture(bucket, rows=BUCKET, **kw):
    graph = bcg.BreakableCUDAGraph()
    with _contexts(_batch(rows)), bcg.BreakableCUDAGraphCapture(graph):
        bucket.body(**kw)
    return graph


def _replay(graph, rows):
    with _contexts(_batch(rows)):
        graph.replay()


@pytest.fixture
def backend(monkeypatch):
    counters.reset()
    monkeypatch.setattr(fallback, "_said", set())
    bcg_cpu.install(monkeypatch)
    b = Backend()
    monkeypatch.setattr(dsv4, "get_attn_backend", lambda: b)
    monkeypatch.setattr(dsv4, "fused_rope_inplace", rope_reference)
    # The break's op is registered for CUDA only; the same break of its Python body (what the
    # CUDA op runs, ``sglang.srt.utils.custom_op._call_directly_in_eager``) runs on a CPU.
    body = dsv4.deepseek_v4_attention_with_output.__wrapped__
    monkeypatch.setattr(dsv4, "bcg_deepseek_v4_attention_with_output", bcg.eager_on_graph(body))
    rope_reference.calls = []
    return b


def test_upstream_replays_the_tail_inside_the_graph(backend):
    bucket = Bucket()
    graph = _capture(bucket)
    assert len(graph._break_fns) == len(LAYERS)
    backend.calls.clear()
    rope_reference.calls.clear()
    _replay(graph, 5)
    # Only the breaks run on the host: attention on the live rows; RoPE and wo_a are captured.
    assert backend.calls == [(5, 5)] * len(LAYERS)
    assert rope_reference.calls == []


@pytest.mark.parametrize("rows", [BUCKET, 5, 1])
def test_the_break_runs_attention_rope_and_wo_a_on_the_live_rows(backend, rows):
    bucket = Bucket()
    with installed((wb.PATCH,), ON):
        graph = _capture(bucket)
        assert len(graph._break_fns) == len(LAYERS)  # one break a layer, as upstream's
        assert counters.get(wb.PATCH_ID, "layers_through_wo_a") == len(LAYERS)
        for out in bucket.outputs.values():
            assert out.shape == (BUCKET, GROUPS, RANK) and out.is_contiguous()
            out.fill_(7.0)  # what a previous replay left: the break must overwrite every row
        backend.calls.clear()
        rope_reference.calls.clear()
        _replay(graph, rows)
    assert backend.calls == [(rows, rows)] * len(LAYERS)
    assert rope_reference.calls == [rows] * len(LAYERS)
    for layer in LAYERS:
        out = bucket.outputs[layer]
        torch.testing.assert_close(out[:rows], bucket.eager(backend, rows, layer), rtol=0, atol=0)
        assert not out[rows:].any()
    assert counters.get(wb.PATCH_ID, "breaks_run") == 2 * len(LAYERS)  # capture and replay


def test_the_capture_pass_computes_what_upstreams_does(backend):
    """The capture's own pass (on a CPU it computes) gives upstream's values on the live rows:
    the same break, RoPE and wo_a, only not over the padded rows."""
    want = Bucket()
    _capture(want, rows=6)
    got = Bucket()
    with installed((wb.PATCH,), ON):
        _capture(got, rows=6)
    for layer in LAYERS:
        torch.testing.assert_close(got.outputs[layer][:6], want.outputs[layer][:6])
        assert not got.outputs[layer][6:].any()


def test_a_batch_without_a_live_count_keeps_every_row_as_upstreams_break_does(backend):
    bucket = Bucket()
    with installed((wb.PATCH,), ON):
        graph = _capture(bucket)
        backend.calls.clear()
        _replay(graph, None)
    assert backend.calls == [(BUCKET, BUCKET)] * len(LAYERS)
    for layer in LAYERS:
        torch.testing.assert_close(
            bucket.outputs[layer], bucket.eager(backend, BUCKET, layer), rtol=0, atol=0
        )


def test_an_idle_replay_zeroes_the_output_without_attention(backend):
    bucket = Bucket()
    with installed((wb.PATCH,), ON):
        graph = _capture(bucket)
        backend.calls.clear()
        for out in bucket.outputs.values():
            out.fill_(7.0)
        _replay(graph, 0)
    assert backend.calls == []
    assert all(not out.any() for out in bucket.outputs.values())


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"wo_a_fp8": True}, "wo_a_fp8"),
        ({"use_fused_wo_a": True}, "fused_wo_a"),
        ({"use_flashinfer_mxfp8_wo_b": True}, "mxfp8_wo_b"),
        ({"wo_a": types.SimpleNamespace(weight=None)}, "gguf"),
    ],
)
def test_each_layer_it_does_not_handle_is_named(overrides, key):
    assert wb.unhandled(_layer(**overrides), torch.empty(2, 2)) == key
    assert wb.unhandled(_layer(), torch.empty(2, 2)) is None
    assert wb.unhandled(_layer(), torch.empty(4, 4).t()) == "layout"
    assert wb.unhandled(None, torch.empty(2, 2)) == "outside_layer"


def test_a_layer_on_an_fp8_wo_a_keeps_upstreams_break(backend, caplog):
    bucket = Bucket(layer=_layer(wo_a_fp8=True))
    with installed((wb.PATCH,), ON), caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
        graph = _capture(bucket)
        rope_reference.calls.clear()
        _replay(graph, 5)
    assert rope_reference.calls == []  # upstream's: the tail stayed in the graph
    assert counters.get(wb.PATCH_ID, "breaks_deferred") == 0
    assert counters.get_fallback(wb.PATCH_ID, "wo_a_fp8") == len(LAYERS)
    said = [r for r in caplog.records if wb.FALLBACKS["wo_a_fp8"] in r.getMessage()]
    assert len(said) == 1


def test_a_break_outside_the_layer_keeps_upstreams_break(backend):
    bucket = Bucket(scoped=False)
    with installed((wb.PATCH,), ON):
        graph = _capture(bucket)
    assert counters.get_fallback(wb.PATCH_ID, "outside_layer") == len(LAYERS)
    assert counters.get(wb.PATCH_ID, "layers_through_wo_a") == 0
    assert len(graph._break_fns) == len(LAYERS)


@pytest.mark.parametrize("kw", [{"is_decode": True}, {"rope_k": torch.zeros(1)}])
def test_another_consumer_gets_upstreams_break_first_and_the_same_values(backend, kw):
    """A consumer the patch does not expect (wo_a of a decode batch; a RoPE that also rotates
    a key) runs after upstream's break and the RoPE recorded so far, in upstream's order."""
    want = Bucket()
    _capture(want, rows=6, **kw)
    got = Bucket()
    with installed((wb.PATCH,), ON):
        graph = _capture(got, rows=6, **kw)
    assert counters.get_fallback(wb.PATCH_ID, "call_site") == len(LAYERS)
    assert counters.get(wb.PATCH_ID, "layers_through_wo_a") == 0
    assert len(graph._break_fns) == len(LAYERS)
    for layer in LAYERS:
        torch.testing.assert_close(got.outputs[layer], want.outputs[layer], rtol=0, atol=0)


def test_a_deferred_break_that_never_reaches_wo_a_stops_the_capture(backend):
    bucket = Bucket()
    with installed((wb.PATCH,), ON), _contexts(_batch(4)):
        with pytest.raises(RuntimeError, match="never reached wo_a"):
            with wb.layer_scope(bucket.layer):
                dsv4.bcg_deepseek_v4_attention_with_output(
                    bucket.q, bucket.q, torch.empty_like(bucket.q), 0, 4, bucket.sink, False
                )
    assert wb._DEFERRED.get() is None


def test_the_layer_is_named_only_while_a_breakable_graph_is_built():
    seen = []

    def forward(self, *args, **kwargs):
        seen.append(wb._LAYER.get())

    with installed((), ON):
        layer = object()
        wb.around_layer_forward(forward, layer)
        with enable_breakable_cuda_graph():
            wb.around_layer_forward(forward, layer)
    assert seen == [None, layer]


def test_switched_off_it_touches_nothing():
    before = (
        dsv4.bcg_deepseek_v4_attention_with_output,
        dsv4.fused_rope_inplace,
        dsv4._apply_wo_a_bf16_matmul,
        dsv4.MQALayer.forward,
    )
    with installed((wb.PATCH,), {wb.FLAG.name: "0"}):
        during = (
            dsv4.bcg_deepseek_v4_attention_with_output,
            dsv4.fused_rope_inplace,
            dsv4._apply_wo_a_bf16_matmul,
            dsv4.MQALayer.forward,
        )
    assert during == before


def test_explain_names_what_it_does_and_where_it_does_not():
    def plan(deepseek_v4=True, backend="breakable", buckets=(16,), fp8=False, sm=9):
        return types.SimpleNamespace(
            facts=types.SimpleNamespace(deepseek_v4=deepseek_v4, fp8_block_checkpoint=fp8),
            prefill=types.SimpleNamespace(backend=backend, buckets=list(buckets)),
            gpu_sm_major=sm,
        )

    assert "inverse RoPE and wo_a" in wb.explain_for_deployment(plan())
    assert "not a DeepSeek-V4" in wb.explain_for_deployment(plan(deepseek_v4=False))
    assert "no breakable prefill graph" in wb.explain_for_deployment(plan(buckets=()))
    # an FP8 checkpoint: SGLang keeps its FP8 wo_a on Blackwell, turns it off on Hopper
    blackwell = wb.explain_for_deployment(plan(fp8=True, sm=10))
    assert "every layer keeps upstream's break unless SGLANG_OPT_FP8_WO_A_GEMM=0" in blackwell
    hopper = wb.explain_for_deployment(plan(fp8=True, sm=9))
    assert "inverse RoPE and wo_a" in hopper and "unless SGLANG_OPT_FP8_WO_A_GEMM=1" in hopper
    assert "FP8 checkpoint" not in wb.explain_for_deployment(plan(fp8=False, sm=10))


def test_sglangs_layer_calls_nothing_else_between_the_break_and_wo_b():
    assert wb.tail_calls_beyond_known(dsv4.MQALayer.forward) == []


def _forward_with_a_new_consumer(self, x, positions, forward_batch):
    o = x.new_empty(x.shape)
    bcg_deepseek_v4_attention_with_output(x, x, o, 0, 4, None, False)  # noqa: F821
    o = o * 2.0
    fused_rope_inplace(o, None, None, positions=positions, inverse=True)  # noqa: F821
    return self._project_wo_b(new_kernel(o))  # noqa: F821


def test_a_layer_whose_tail_changed_keeps_upstreams_break_and_names_the_call(
    backend, monkeypatch, caplog
):
    monkeypatch.setattr(dsv4.MQALayer, "forward", _forward_with_a_new_consumer)
    wb._tail_beyond_known.cache_clear()
    try:
        assert wb.tail_calls_beyond_known(dsv4.MQALayer.forward) == ["new_kernel"]
        bucket = Bucket()
        with installed((wb.PATCH,), ON), caplog.at_level(logging.INFO, logger="sglang_mixgraph"):
            _capture(bucket)
    finally:
        wb._tail_beyond_known.cache_clear()
    assert counters.get(wb.PATCH_ID, "breaks_deferred") == 0
    assert counters.get_fallback(wb.PATCH_ID, "tail_changed") == len(LAYERS)
    said = [r.getMessage() for r in caplog.records if "sglang-mixgraph" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(f"{wb.FALLBACKS['tail_changed']} (new_kernel)")
