"""wo_a_in_break on the GPU against upstream's own breakable capture of DeepSeek-V4's attention
break and the inverse RoPE and wo_a after it.

Two identical worlds (upstream's DSV4 pool, backend by its real ``__init__``, real metadata
builders, FlashMLA), one bucket each, the same body per layer as ``MQALayer.forward`` runs it
on the bf16 wo_a path: the model's break ``bcg_deepseek_v4_attention_with_output``, then
``fused_rope_inplace`` (inverse) on the output's RoPE part and ``_apply_wo_a_bf16_matmul`` on its
``[rows, groups, 4096]`` view, all through ``sglang.srt.models.deepseek_v4``'s own names. One
bucket is captured as upstream does (the attention output copied into the bridge buffer, RoPE
and wo_a captured over the bucket's rows); the other with the patch installed (one eager break
through wo_a on the live rows). Each replay of the patched bucket must equal, bit for bit, upstream's
inverse RoPE and wo_a run eagerly on the live rows of upstream's replayed attention output, with
zero padded rows; upstream's own replay differs from it only by its GEMM over the bucket's rows.
Stand-ins: the layer object (the four attributes the patch reads), seeded queries, sink and wo_a.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from sglang_mixgraph import counters
from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits import dsv4_gpu as G
from sglang_mixgraph.kits.install import installed
from sglang_mixgraph.patches import wo_a_in_break as wb

BUCKET = 64
ROPE = 64  # DeepSeek-V4's RoPE part of each 512-wide head
GROUP_DIM, RANK = 4096, 1024  # wo_a: [groups, o_lora_rank, 4096]
GROUPS = K.HEADS * 512 // GROUP_DIM
WORLD = K.Step(prefill=[(300, 16), (580, 21)], decode=[130, 5, 199], seed=67)
S = WORLD.seq_lens
LIVE = {
    "capture": K.Step(prefill=[(S[0] - 16, 16), (S[1] - 21, 21)], decode=[S[2] - 1, S[3] - 1]),
    "mixed": K.Step(prefill=[(S[0] - 9, 9)], decode=[S[1] - 1, S[2] - 1, S[3] - 1, S[4] - 1]),
    "mixed_b": K.Step(prefill=[(S[0] - 30, 30), (S[1] - 4, 4)], decode=[S[2] - 1]),
    "extend": K.Step(prefill=[(S[0] - 40, 40)], decode=[]),
}


def _layer_standin(wo_a):
    """The attributes of ``MQALayer`` the patch decides with, on the bf16 wo_a path."""
    return SimpleNamespace(
        wo_a_fp8=False,
        use_fused_wo_a=False,
        use_flashinfer_mxfp8_wo_b=False,
        wo_a=SimpleNamespace(weight=wo_a.view(GROUPS * RANK, GROUP_DIM)),
    )


def _tail(o, freqs, positions, wo_a):
    """The layer's inverse RoPE and wo_a on ``o`` ``[rows, heads, 512]``, upstream's functions by
    the model module's names, as ``MQALayer.forward`` calls them."""
    import sglang.srt.models.deepseek_v4 as dsv4

    dsv4.fused_rope_inplace(o[..., -ROPE:], None, freqs, positions=positions, inverse=True)
    return dsv4._apply_wo_a_bf16_matmul(
        o.view(o.shape[0], GROUPS, -1), wo_a, is_decode=False, is_prefill=True
    )


class WoABucket(G.BreakableBucket):
    """The kit's bucket with the layer's tail after each attention break, under upstream's
    breakable-graph scope; ``keep_attention`` also keeps the break's output (upstream's bucket
    only: a reader of the output is a consumer the patch would hand back to upstream)."""

    def __init__(self, world, keep_attention: bool):
        from sglang.kernels.ops.attention.dsv4.rope import precompute_freqs_cis

        super().__init__(world, BUCKET)
        g = torch.Generator(device=G.DEV).manual_seed(71)
        self.freqs = precompute_freqs_cis(ROPE, 4096, 0, 10000.0, 1.0, 32, 1).to(G.DEV)
        self.wo_a = (torch.randn(GROUPS, RANK, GROUP_DIM, generator=g, device=G.DEV) * 0.02).to(
            torch.bfloat16
        )
        self.layer = _layer_standin(self.wo_a)
        self.positions = torch.zeros(BUCKET, dtype=torch.int64, device=G.DEV)
        self.live_positions = None
        self.keep_attention = keep_attention

    def _contexts(self, static_fb):
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
            enable_breakable_cuda_graph,
        )

        stack = contextlib.ExitStack()
        stack.enter_context(super()._contexts(static_fb))
        stack.enter_context(enable_breakable_cuda_graph())
        return stack

    def _load(self, q_live) -> None:
        super()._load(q_live)
        rows = q_live.shape[0]
        self.positions[:rows].copy_(self.live_positions[:rows])
        self.positions[rows:].zero_()

    def _body(self):
        import sglang.srt.models.deepseek_v4 as dsv4

        for layer in self.layers:
            q = self.q * 1.0
            o = torch.empty_like(q)
            with wb.layer_scope(self.layer):
                dsv4.bcg_deepseek_v4_attention_with_output(
                    q, q, o, layer, K.LAYER_RATIOS[layer], self.sink, False
                )
                if self.keep_attention:
                    self.outputs[f"attention{layer}"] = o + 0.0
                y = _tail(o, self.freqs, self.positions, self.wo_a)
            self.outputs[layer] = y.flatten(1) + 0.0  # a captured reader, as wo_b is


def _run(bucket, name, capture=False):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    view = bucket.world.view(K.Step(LIVE[name].prefill, LIVE[name].decode, seed=WORLD.seed))
    mode = ForwardMode.MIXED if view.step.decode and view.step.prefill else ForwardMode.EXTEND
    fb = view.forward_batch(mode=mode)
    bucket.live_positions = fb.positions
    if capture:
        bucket.capture(view, fb, view.q())
        return None, fb.positions, view.step.num_rows
    return bucket.replay(view, fb, view.q()), fb.positions, view.step.num_rows


@pytest.fixture(scope="module")
def arms(sglang_cuda):
    """Upstream's capture and the patch's, from the same batch over identical worlds."""
    upstream = WoABucket(G.GpuWorld(WORLD), keep_attention=True)
    _run(upstream, "capture", capture=True)
    patched = WoABucket(G.GpuWorld(WORLD), keep_attention=False)
    counters.reset()
    with installed((wb.PATCH,), {wb.FLAG.name: "1"}):
        _run(patched, "capture", capture=True)
    # Every layer's tail went into its break, in the warm-up and in the capture; one break a
    # layer either way.
    layers = len(patched.layers)
    assert counters.get(wb.PATCH_ID, "layers_through_wo_a") == 2 * layers
    assert wb.PATCH_ID not in counters.snapshot()["fallbacks"]
    assert len(patched.graph._break_fns) == len(upstream.graph._break_fns) == layers
    yield upstream, patched


@pytest.mark.parametrize("name", ["capture", "mixed", "mixed_b", "extend", "mixed"])
def test_patched_replay_equals_upstreams_tail_on_the_live_rows(arms, name):
    upstream, patched = arms
    counters.reset()
    want, positions, rows = _run(upstream, name)
    assert counters.get(wb.PATCH_ID, "breaks_run") == 0
    got, _, _ = _run(patched, name)
    assert counters.get(wb.PATCH_ID, "breaks_run") == len(patched.layers)
    for layer in patched.layers:
        attention = want[f"attention{layer}"][:rows].clone()
        eager = _tail(attention, upstream.freqs, positions[:rows], upstream.wo_a).flatten(1)
        assert torch.equal(got[layer][:rows], eager), f"layer {layer}"
        assert not got[layer][rows:].any(), f"layer {layer}: padded rows not zero"
        assert not want[layer][rows:].any()
        # upstream's replay: the same values but for its GEMM over the bucket's rows
        assert G.rel_l2(want[layer][:rows].float(), eager.float()) < 1e-2, f"layer {layer}"
        assert eager.abs().sum() > 0


def test_the_patched_replay_copies_no_attention_output(arms):
    """Upstream's replay copies each layer's [rows, heads, 512] output into its bridge buffer;
    the patched one copies only wo_a's [rows, groups, 1024] output. Read from the profiler's
    device copies of one replay each; their GPU times are printed (``-s``)."""
    from torch.profiler import ProfilerActivity, profile

    upstream, patched = arms
    rows = {}
    for arm, bucket in (("upstream", upstream), ("patched", patched)):
        _run(bucket, "mixed")  # warm
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _run(bucket, "mixed")
        events = [e for e in prof.events() if e.device_type.name == "CUDA"]
        copies = [e for e in events if "Memcpy DtoD" in e.name or "copy" in e.name.lower()]
        rows[arm] = (len(copies), sum(e.device_time for e in events))
        print(f"{arm}: {len(copies)} device copies, {rows[arm][1]:.1f} us of kernels")
    assert rows["patched"][0] < rows["upstream"][0]
