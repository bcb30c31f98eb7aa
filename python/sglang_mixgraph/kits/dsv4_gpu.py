"""GPU kit: the CPU kit's steps (kits.dsv4_cpu) on upstream's real code on a CUDA GPU.

What is upstream here that the CPU kit stands in for:
* ``DeepseekV4AttnBackend`` built by its real ``__init__`` (from a model-runner stand-in that
  carries the attributes ``__init__`` reads), so FlashMLA, the Triton dequant and the SM90
  Q8KV8 kernels are the real ones;
* the step metadata built by upstream's real ``init_forward_metadata`` (Triton page-table,
  causal-SWA and compression-metadata kernels, JIT indexer metadata);
* breakable CUDA graphs: upstream's ``BreakableCUDAGraph`` capture and replay, the backend's own
  ``init_forward_metadata_for_breakable_cuda_graph_capture`` /
  ``prepare_forward_metadata_for_breakable_cuda_graph_replay``, and the model's eager break
  ``bcg_deepseek_v4_attention_with_output`` (sglang.srt.models.deepseek_v4).
* the c4 top-k selection and its page mapping: upstream's own torch top-k
  (``dsv4.indexer.topk_transform_pytorch_vectorized``, what ``--dsa-topk-backend torch`` runs)
  over upstream's indexer metadata.
Still a stand-in: the indexer's logits (they need the model's indexer weights and its key
cache); seeded random scores feed upstream's top-k instead.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits.synthetic_step import rel_l2  # noqa: F401  (the GPU tests' G.rel_l2)

DEV = "cuda"


def model_runner(
    pool, req_to_token, *, num_reqs: int, context_len: int, topk: int = K.TOPK, heads: int = K.HEADS
):
    """A model-runner stand-in carrying what ``DeepseekV4AttnBackend.__init__`` reads."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    cfg = SimpleNamespace(model_type="deepseek_v4", index_topk=topk, num_attention_heads=heads)
    return SimpleNamespace(
        device=DEV,
        page_size=K.PAGE,
        token_to_kv_pool=pool,
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token, size=num_reqs),
        model_config=SimpleNamespace(
            context_len=context_len,
            head_dim=512,
            v_head_dim=512,
            hf_text_config=cfg,
            hf_config=cfg,
        ),
        hisparse_coordinator=None,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        is_draft_worker=False,
    )


class GpuWorld(K.World):
    """The CPU kit's world on CUDA, with upstream's backend and metadata builder."""

    def __init__(self, step: K.Step, *, q8kv8: bool = False, max_ctx: int = K.MAX_CTX):
        super().__init__(step, q8kv8=q8kv8, device=DEV, max_ctx=max_ctx)

    def _make_backend(self, dsv4, cls, q8kv8: bool):
        runner = model_runner(
            self.pool, self.req_to_token, num_reqs=self.max_reqs, context_len=self.max_ctx
        )
        backend = cls(runner)
        if q8kv8:
            backend.dsv4_prefill_backend = "flashmla_sparse_q8"
        return backend

    def view(self, step: K.Step) -> GpuWorld:
        """The same requests (pool, caches, backend) batched differently: ``step`` must keep the
        sequence lengths of this world's first ``len(step.seq_lens)`` requests."""
        n = len(step.seq_lens)
        assert step.seq_lens == self.step.seq_lens[:n], (step.seq_lens, self.step.seq_lens)
        other = copy.copy(self)
        other.step = step
        return other

    def decode_batch(self, relabelled: bool = False):
        """A decode-only step (no prefill requests): DECODE, or (``relabelled``) the 1-token
        EXTEND that DP attention makes of it in ``ForwardBatch.prepare_mlp_sync_batch``."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        assert not self.step.prefill
        if relabelled:
            return self.forward_batch(
                mode=ForwardMode.EXTEND, num_decode_attr=None, original_mode=ForwardMode.DECODE
            )
        fb = self.forward_batch(mode=ForwardMode.DECODE, num_decode_attr=None)
        for name in (
            "extend_seq_lens",
            "extend_seq_lens_cpu",
            "extend_prefix_lens",
            "extend_prefix_lens_cpu",
            "extend_start_loc",
            "extend_num_tokens",
        ):
            setattr(fb, name, None)
        return fb

    # ---- metadata ------------------------------------------------------------------------

    def standin_core(self, fb):
        """The CPU kit's torch metadata for this step (on the CPU)."""
        return K.World.build_metadata(self, fb).core_attn_metadata

    def write_c4_topk(self, metadata) -> None:
        """What the indexer writes per layer, for the live rows: upstream's torch top-k over
        seeded random scores, mapped to cache slots through upstream's indexer metadata."""
        from sglang.srt.layers.attention.dsv4.indexer import topk_transform_pytorch_vectorized

        rows = self.step.num_rows - self.step.padding
        im, core = metadata.indexer_metadata, metadata.core_attn_metadata
        lens = im.compressed_seq_lens[:rows]
        width = max(int(lens.max()) if rows else 1, 1)
        g = torch.Generator(device=DEV).manual_seed(self.step.seed + 5)
        scores = torch.rand(rows, width, generator=g, device=DEV)
        raw = core.c4_sparse_raw_indices
        topk_transform_pytorch_vectorized(
            scores,
            lens,
            im.page_table[:rows],
            core.c4_sparse_page_indices[:rows],
            im.compressed_page_size,
            raw[:rows] if raw is not None else None,
        )

    def upstream_metadata(self, fb):
        from sglang.srt.environ import envs

        with torch.no_grad(), envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(True):
            self.backend.init_forward_metadata(fb)
        self.write_c4_topk(self.backend.forward_metadata)
        return self.backend.forward_metadata.core_attn_metadata

    def run_step(
        self, fb, layers: Sequence[int] = (0, 1, 2), q=None, sink=None
    ) -> dict[int, torch.Tensor]:
        self.upstream_metadata(fb)
        return {layer: self.run_layer(fb, layer, q=q, sink=sink) for layer in layers}


def compare_metadata(real, standin, rows: int) -> list[str]:
    """Upstream's metadata against the CPU kit's for the first ``rows`` rows, field by field
    over what the attention reads: causal lengths and positions, the SWA window (as a set per
    row: upstream orders it by its own kernel), c4 top-k lengths, c128 indices and lengths."""
    bad = []

    def host(t):
        return t[:rows].cpu()

    for name in (
        "seq_lens_casual",
        "positions_casual",
        "swa_topk_lengths",
        "c4_sparse_topk_lengths",
        "c128_topk_lengths_clamp1",
    ):
        a, b = host(getattr(real, name)), host(getattr(standin, name))
        if not torch.equal(a.to(torch.int64), b.to(torch.int64)):
            t = int((a.to(torch.int64) != b.to(torch.int64)).nonzero()[0, 0])
            bad.append(f"{name}: row {t} upstream {a[t].tolist()} kit {b[t].tolist()}")
    swa_r, swa_s = host(real.swa_page_indices), host(standin.swa_page_indices)
    lens = host(standin.swa_topk_lengths).tolist()
    for t, n in enumerate(lens):
        if sorted(swa_r[t, :n].tolist()) != sorted(swa_s[t, :n].tolist()):
            bad.append(f"swa_page_indices: row {t} window differs")
            break
    c128_r, c128_s = host(real.c128_page_indices), host(standin.c128_page_indices)
    visible = (host(standin.positions_casual) + 1) // 128
    for t, n in enumerate(visible.tolist()):
        if n and c128_r[t, :n].tolist() != c128_s[t, :n].tolist():
            bad.append(f"c128_page_indices: row {t} differs in its first {n} entries")
            break
    return bad


def bcg_replay_contexts(backend, static_fb, attention_layers):
    """What a breakable prefill graph's body runs under, as upstream's runner sets it up: no
    grad, the forward context with ``backend``, the sparse-prefill path on, and the
    piecewise-graph context through which the model's attention break finds the static batch
    and its layers. An ExitStack to enter."""
    import contextlib

    from sglang.srt.environ import envs
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph.context_manager import (
        set_tc_piecewise_forward_context,
    )

    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(forward_context(ForwardContext(attn_backend=backend)))
    stack.enter_context(envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(True))
    stack.enter_context(
        set_tc_piecewise_forward_context(
            static_fb,
            attention_layers=attention_layers,
            quant_config=None,
            moe_layers=[],
            moe_fusions=[],
        )
    )
    return stack


class BreakableBucket:
    """One prefill-graph bucket of ``size`` tokens, as upstream's breakable prefill runner
    drives it for a captured-metadata backend: a static padded EXTEND batch, the backend's
    capture/replay metadata entry points, and the model's DSV4 attention as an eager break
    between captured segments (one per layer)."""

    def __init__(self, world: GpuWorld, size: int, layers: Sequence[int] = (0, 1, 2)):
        self.world, self.size, self.layers = world, size, tuple(layers)
        self.q = torch.zeros(size, K.HEADS, 512, dtype=torch.bfloat16, device=DEV)
        self.sink = world.attn_sink()
        self.layer_objs = [
            SimpleNamespace(layer_id=i, v_head_dim=512, tp_q_head_num=K.HEADS)
            for i in range(len(K.LAYER_RATIOS))
        ]
        self.graph = None
        self.metadata = None
        self.outputs: dict[int, torch.Tensor] = {}
        self.read_ends = None  # the last replay's read-done answer, when prepared via a runner

    def static_batch(self, live):
        """The padded EXTEND batch the replayed graph sees."""
        return K.replay_static_batch(live, self.size, max_ctx=self.world.max_ctx)

    def _contexts(self, static_fb):
        return bcg_replay_contexts(self.world.backend, static_fb, self.layer_objs)

    def _body(self):
        from sglang.srt.models.deepseek_v4 import bcg_deepseek_v4_attention_with_output

        for layer in self.layers:
            q = self.q * 1.0  # a captured kernel feeding the break, as the model's projections do
            o = torch.empty_like(q)
            bcg_deepseek_v4_attention_with_output(
                q, q, o, layer, K.LAYER_RATIOS[layer], self.sink, False
            )
            self.outputs[layer] = o + 0.0  # a captured kernel reading the break's output

    def capture(self, world: GpuWorld, live, q_live, pool=None) -> None:
        """Capture the bucket; ``pool``: a graph memory pool shared with other buckets (as
        SGLang's runners share one), a fresh one when None."""
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
            BreakableCUDAGraph,
            BreakableCUDAGraphCapture,
        )

        static_fb = self.static_batch(live)
        backend = self.world.backend
        with self._contexts(static_fb):
            self.metadata = backend.init_forward_metadata_for_breakable_cuda_graph_capture(
                static_fb
            )
            world.write_c4_topk(self.metadata)
            self._load(q_live)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._body()  # warm-up, as upstream's runner does before capturing
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = BreakableCUDAGraph()
            with BreakableCUDAGraphCapture(
                self.graph,
                pool=torch.cuda.graph_pool_handle() if pool is None else pool,
                stream=stream,
            ):
                self._body()
        torch.cuda.synchronize()

    def _prepare_through_runner(self, model_runner, live, static_fb, after_publish=None):
        from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
            PrefillCudaGraphRunner,
        )
        from sglang.srt.model_executor.runner.shape_key import ShapeKey
        from sglang.srt.model_executor.runner_utils import shared_read_event

        key = ShapeKey(size=self.size)
        runner = SimpleNamespace(
            model_runner=model_runner,
            use_captured_attn_metadata=True,
            _is_full_backend=False,
            attn_metadata_buffers={key: self.metadata},
        )
        ends = PrefillCudaGraphRunner._prepare_forward_metadata_for_replay(
            runner, live, static_fb, key
        )
        shared_read_event.maybe_publish_prefill_shared_read_done(model_runner, ends, torch.cuda)
        if after_publish is not None:
            after_publish(model_runner)
        return ends

    def _load(self, q_live) -> None:
        rows = q_live.shape[0]
        self.q[:rows].copy_(q_live)
        self.q[rows:].zero_()

    def replay(
        self, world: GpuWorld, live, q_live, model_runner=None, after_publish=None
    ) -> dict[int, torch.Tensor]:
        """Refresh the captured metadata for ``live`` and replay; the bucket's outputs (all rows).

        With ``model_runner`` (a stand-in holding ``attn_backend``, ``spec_algorithm`` and the
        read-done mailbox) the refresh goes through upstream's runner,
        ``PrefillCudaGraphRunner._prepare_forward_metadata_for_replay``, and its answer through
        upstream's publisher, as ``PrefillCudaGraphRunner.execute`` does before replaying; the
        answer is kept in ``self.read_ends``; ``after_publish(model_runner)``, when given, runs
        right after the publisher, before the graph replays (where the scheduler's next writes
        may start)."""
        static_fb = self.static_batch(live)
        backend = self.world.backend
        with self._contexts(static_fb):
            if model_runner is None:
                backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(
                    self.metadata, live, static_forward_batch=static_fb
                )
            else:
                self.read_ends = self._prepare_through_runner(
                    model_runner, live, static_fb, after_publish
                )
            world.write_c4_topk(self.metadata)
            self._load(q_live)
            self.graph.replay()
        torch.cuda.synchronize()
        return {layer: out.clone() for layer, out in self.outputs.items()}
