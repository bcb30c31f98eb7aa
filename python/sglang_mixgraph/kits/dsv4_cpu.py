"""CPU kit of the mixed-split tests: upstream's DSV4 backend with our hooks and torch leaf kernels.

What is upstream here and what is ours:
* ``DeepseekV4AttnBackend`` is upstream's class, built as upstream's test kits build objects they
  cannot construct on the machine at hand (``object.__new__`` plus the attributes the path reads,
  as ``make_backend`` in sglang/test/kits/dsa_metadata_kit.py does), and its
  ``init_forward_metadata`` / ``_forward_attention`` / ``_forward_prefill_sparse(_q8kv8)`` /
  ``_build_sparse_prefill_chunk_cache`` and ``SparsePrefillChunkCache`` run unchanged;
* ``DeepSeekV4TokenToKVPool`` is upstream's pool, allocated on CPU as upstream's DSV4 attention
  kit does (``MockDSV4ModelRunner`` in sglang/test/kits/attention_unittest/attention_methods/
  dsv4_attention.py);
* the GPU leaf kernels (FlashMLA sparse prefill / fp8 decode / sched meta, the Triton dequant,
  SWA-id and index-combine kernels, the SM90 Q8KV8 kernels) are replaced by our torch references
  (:mod:`sglang_mixgraph.reference.sparse_mla`,
  :mod:`sglang_mixgraph.reference.sparse_prefill_kernels`);
* the step's attention metadata (``DSV4Metadata``/``DSV4AttnMetadata``, upstream's classes) is
  filled by :meth:`World.build_metadata` in torch, because upstream's builder
  (``DeepseekV4AttnBackend._build_forward_metadata``) is a chain of Triton/CUDA kernels (causal
  SWA page indices, compression metadata, compressor plans) that cannot run here. It stands in
  for that builder plus the indexer's per-layer top-k write (the top-k transform in
  ``forward_c4_indexer``, sglang/srt/layers/attention/dsv4/indexer.py), which in a MIXED step
  fills both the raw (request-local) and the page-mapped top-k for every row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import types
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from sglang_mixgraph import upstream_attrs as attrs
from sglang_mixgraph.reference import sparse_mla as ref
from sglang_mixgraph.reference import sparse_prefill_kernels as rk
from sglang_mixgraph.reference import v4_kv_layout as kvl

PAGE = 256
SWA = 128
TOPK = 512
HEADS = 64
LAYER_RATIOS = (0, 4, 128)  # layer id -> compress ratio
SWA_SIZE = 256 * 64  # full == swa locations (identity mapping)
MAX_REQS = 16
MAX_CTX = 1024


def import_upstream() -> None:
    """Import the upstream modules while the device probes still tell the truth (CPU).

    Kernel modules choose their imports by probing at import time (sglang_mixgraph.target_gpu
    `_import_resolution_modules`); inside `described_gpu(...)` they would pick CUDA imports.
    """
    import sglang.srt.layers.attention.deepseek_v4_backend  # noqa: F401
    import sglang.srt.layers.attention.deepseek_v4_mega_backend  # noqa: F401
    import sglang.srt.layers.attention.dsv4.sparse_prefill_utils  # noqa: F401
    import sglang.srt.layers.cp.utils  # noqa: F401
    import sglang.srt.mem_cache.deepseek_v4_memory_pool  # noqa: F401
    import sglang.srt.model_executor.forward_context  # noqa: F401


# --------------------------------------------------------------------------------------------
# sglang context: server args, parallel state (as upstream's DSV4 kit pins them)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def sglang_context(dsv4_prefill_backend: str = "auto", device: str = "cpu"):
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.runtime_context import get_context, get_parallel

    override = get_context().override_server_args(
        attention_backend="dsv4",
        chunked_prefill_size=-1,
        cuda_graph_config=CudaGraphConfig(
            decode=PhaseConfig(backend=Backend.DISABLED),
            prefill=PhaseConfig(backend=Backend.DISABLED),
        ),
        disable_radix_cache=False,
        disaggregation_mode=None,
        dp_size=1,
        enable_deterministic_inference=False,
        enable_mis=False,
        is_embedding=False,
        kv_cache_dtype="auto",
        max_running_requests=None,
        pp_size=1,
        revision=None,
        speculative_algorithm=None,
        speculative_num_draft_tokens=0,
        speculative_num_steps=0,
        tp_size=1,
        device=device,
        mem_fraction_static=0.8,
    )
    override.install()
    par = get_parallel().override(attn_tp_size=1, attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0)
    par.__enter__()
    try:
        yield
    finally:
        par.__exit__(None, None, None)
        override.restore()


# --------------------------------------------------------------------------------------------
# leaf kernels -> our torch references (with call recorders)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Calls:
    decode: list = dataclasses.field(default_factory=list)  # kwargs of each decode-kernel call
    dequant_slots: list = dataclasses.field(default_factory=list)  # (cache id, slots) per dequant
    sparse_rows: list = dataclasses.field(
        default_factory=list
    )  # q rows of each sparse-prefill call

    def clear(self):
        self.decode.clear()
        self.dequant_slots.clear()
        self.sparse_rows.clear()


CALLS = Calls()


def _decode_kernel(**kw):
    CALLS.decode.append(kw)
    return ref.flash_mla_with_kvcache_reference(**kw)


def _sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, **kw):
    CALLS.sparse_rows.append(q.shape[0])
    return ref.flash_mla_sparse_fwd_reference(
        q, kv, indices, sm_scale, d_v, attn_sink, topk_length, **kw
    )


def _dequant(quant_k_cache, page_table_1_flattened, page_size, out=None, layout=None):
    CALLS.dequant_slots.append((quant_k_cache.data_ptr(), page_table_1_flattened.clone()))
    return rk.dequantize_k_cache_paged_dsv4(
        quant_k_cache, page_table_1_flattened, page_size, out, layout
    )


def _requant(quant_k_cache, page_table_1_flattened, page_size, extra_rows=0, out=None):
    CALLS.dequant_slots.append((quant_k_cache.data_ptr(), page_table_1_flattened.clone()))
    return rk.gather_dequant_requant_fp8_paged_dsv4(
        quant_k_cache, page_table_1_flattened, page_size, extra_rows, out
    )


def _q8_fwd(
    q, kv, indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None, topk_length=None, **kw
):
    CALLS.sparse_rows.append(q.shape[0])
    return rk.sparse_mla_q8kv8_prefill_fwd(
        q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, **kw
    )


@contextlib.contextmanager
def reference_world(gpu: str = "H200"):
    """What a CPU test of a step through upstream's backend runs under: `gpu` described to
    SGLang, its CPU context (`sglang_context`) and the torch reference kernels."""
    from sglang_mixgraph.target_gpu import described_gpu

    with described_gpu(gpu), sglang_context(), reference_kernels():
        yield


@contextlib.contextmanager
def reference_kernels():
    """Swap every GPU leaf kernel on the DSV4 sparse/decode path for our torch reference."""
    from sglang.srt.layers.attention import deepseek_v4_backend as dsv4
    from sglang.srt.layers.attention.dsv4 import sparse_prefill_utils as spu

    fmi_name = "sglang.kernels.ops.attention.flash_mla_interface"
    q8_name = "sglang.kernels.ops.attention.sparse_mla_q8kv8_prefill_sm90"
    fmi = types.ModuleType(fmi_name)
    fmi.flash_mla_sparse_fwd = _sparse_fwd
    fmi.flash_mla_with_kvcache = _decode_kernel
    fmi.get_mla_metadata = lambda *a, **k: (ref.ReferenceSchedMeta(), None)
    q8 = types.ModuleType(q8_name)
    q8.cast_q_fp8_for_q8kv8_prefill = rk.cast_q_fp8_for_q8kv8_prefill
    q8.q8kv8_padded_num_heads = rk.q8kv8_padded_num_heads
    q8.sparse_mla_q8kv8_prefill_fwd = _q8_fwd
    saved_mods = {n: sys.modules.get(n) for n in (fmi_name, q8_name)}
    saved_attrs = [
        (dsv4, "_create_flashmla_metadata"),
        (dsv4, "dequantize_k_cache_paged_dsv4"),
        (dsv4, "gather_dequant_requant_fp8_paged_dsv4"),
        (spu, "build_swa_token_ids"),
        (spu, "combine_topk_swa_indices"),
    ]
    saved = [(m, n, getattr(m, n)) for m, n in saved_attrs]
    sys.modules[fmi_name] = fmi
    sys.modules[q8_name] = q8
    dsv4._create_flashmla_metadata = lambda: ref.ReferenceSchedMeta()
    dsv4.dequantize_k_cache_paged_dsv4 = _dequant
    dsv4.gather_dequant_requant_fp8_paged_dsv4 = _requant
    spu.build_swa_token_ids = rk.build_swa_token_ids
    spu.combine_topk_swa_indices = rk.combine_topk_swa_indices
    try:
        yield
    finally:
        for m, n, v in saved:
            setattr(m, n, v)
        _restore(sys.modules, saved_mods)


@contextlib.contextmanager
def cache_builds():
    """Every real sparse-prefill chunk-cache build from here on (upstream's
    ``SparsePrefillChunkCache.build``, the call that reads ``req_to_token`` /
    ``full_to_swa_index_mapping``), as the number of requests each covers."""
    from sglang.srt.layers.attention.dsv4.sparse_prefill_utils import SparsePrefillChunkCache

    real = SparsePrefillChunkCache.__dict__["build"]
    builds: list = []

    def counting(cls, *args, **kwargs):
        builds.append(int(kwargs["seq_lens"].shape[0]))
        return real.__func__(cls, *args, **kwargs)

    SparsePrefillChunkCache.build = classmethod(counting)
    try:
        yield builds
    finally:
        SparsePrefillChunkCache.build = real


def _restore(store, saved: dict) -> None:
    """Put `saved` values back into `store` (sys.modules, os.environ); None: was absent."""
    for key, value in saved.items():
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value


# --------------------------------------------------------------------------------------------
# our hooks through our registry, removable again
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def patch_installed(flag_on: bool = True, policy: str | None = "always", tail_graphs: bool = False):
    """Install the mixed_split patch (kits.install); upstream is restored afterwards.
    `tail_graphs`: its decode tails replayed from CUDA graphs (SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS)."""
    from sglang_mixgraph.kits.install import installed
    from sglang_mixgraph.patches import mixed_split

    env = {
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "1" if flag_on else "0",
        mixed_split.TAIL_GRAPHS_FLAG.name: "1" if tail_graphs else "0",
    }
    if policy is not None:
        env["SGLANG_MIXGRAPH_SPLIT_POLICY"] = policy
    with installed((mixed_split.PATCH,), env) as statuses:
        yield statuses[0]


# --------------------------------------------------------------------------------------------
# a step: requests, caches, forward batch, metadata
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Step:
    prefill: list[tuple]  # (prefix_len, extend_len)
    decode: list[int]  # context lengths before the decode token
    padding: int = 0
    holes: bool = True  # -1 holes inside the c4 top-k span (not for the Q8KV8 path)
    seed: int = 0

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in self.prefill] + [c + 1 for c in self.decode]

    @property
    def extend_lens(self) -> list[int]:
        return [e for _, e in self.prefill] + [1] * len(self.decode)

    @property
    def num_rows(self) -> int:
        return sum(self.extend_lens) + self.padding

    @property
    def b0(self) -> int:
        return sum(e for _, e in self.prefill)


def replay_static_batch(live, size: int, live_rows: int | None = None, max_ctx: int = MAX_CTX):
    """The static EXTEND batch a breakable prefill graph replays with, built from the live batch
    as upstream's ``PrefillCudaGraphRunner.load_batch`` builds it: the live lengths, token
    tensors padded to the bucket's ``size``, the live row count (``live_rows``, default the
    live batch's rows; 0 for an idle DP rank) and the capture's context width ``max_ctx``."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    rows = int(live.input_ids.shape[0])
    pad = size - rows
    assert pad >= 0, f"{rows} live rows do not fit a {size}-token bucket"

    def padded(t):
        return torch.cat([t, t.new_zeros(pad)]) if pad else t

    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=live.batch_size,
        input_ids=padded(live.input_ids),
        req_pool_indices=live.req_pool_indices,
        seq_lens=live.seq_lens,
        seq_lens_cpu=live.seq_lens_cpu,
        out_cache_loc=padded(live.out_cache_loc),
        seq_lens_sum=live.seq_lens_sum,
        positions=padded(live.positions),
        extend_seq_lens=live.extend_seq_lens,
        extend_prefix_lens=live.extend_prefix_lens,
        extend_start_loc=live.extend_start_loc,
        extend_prefix_lens_cpu=live.extend_prefix_lens_cpu,
        extend_seq_lens_cpu=live.extend_seq_lens_cpu,
        extend_num_tokens=live.extend_num_tokens,
        global_num_token_non_padded_cpu=rows if live_rows is None else live_rows,
        max_seq_len_override=max_ctx,
    )


def kv_pool(
    *,
    max_reqs: int,
    size: int,
    ratios: Sequence[int],
    device: str,
    c4_state_slots: int | None = None,
):
    """Upstream's DeepSeek-V4 KV pool with DSV4-Pro's head dims, fp8 keys, ``size`` slots in
    every cache (full == SWA locations, identity mapping) and one layer per entry of ``ratios``.
    ``c4_state_slots``: the c4 compressor state pool's size (default one per request; a caller
    running upstream's compressor kernels needs one state ring per SWA page)."""
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    pool = DeepSeekV4TokenToKVPool(
        max_num_reqs=max_reqs,
        swa_size=size,
        c4_size=size,
        c128_size=size,
        c4_state_pool_size=max_reqs if c4_state_slots is None else c4_state_slots,
        c128_state_pool_size=max_reqs,
        page_size=PAGE,
        swa_page_size=PAGE,
        dtype=torch.float8_e4m3fn,
        c4_state_dtype=torch.bfloat16,
        c128_state_dtype=torch.bfloat16,
        qk_nope_head_dim=448,
        qk_rope_head_dim=64,
        indexer_head_dim=128,
        layer_num=len(ratios),
        device=device,
        enable_memory_saver=False,
        compression_ratios=list(ratios),
        kv_source_layers=[],
        full_size=size,
    )
    pool.register_mapping(torch.arange(size, dtype=torch.int64, device=device))
    return pool


class World:
    """Pool + request placement + backend for one step.

    On ``device="cpu"`` (this kit) the backend is built with ``object.__new__`` and its metadata
    by :meth:`build_metadata`; the GPU kit (:mod:`sglang_mixgraph.kits.dsv4_gpu`) builds the same
    world on CUDA with upstream's real ``__init__`` and metadata builder.
    """

    def __init__(
        self,
        step: Step,
        *,
        q8kv8: bool = False,
        backend_cls=None,
        device: str = "cpu",
        max_ctx: int = MAX_CTX,
    ):
        from sglang.srt.layers.attention import deepseek_v4_backend as dsv4

        self.step = step
        self.device = device
        self.max_ctx = max_ctx  # the model's context length: the graphs' capture width
        g = torch.Generator().manual_seed(step.seed)
        self.g = g
        n_reqs = len(step.seq_lens)
        pages_needed = [-(-s // PAGE) for s in step.seq_lens]
        # MAX_REQS requests in SWA_SIZE slots, more where the step needs them (hundreds of
        # decode requests on the GPU); the same sizes, so the same pages, for every smaller step.
        self.max_reqs = max(MAX_REQS, n_reqs)
        n_pages = max(SWA_SIZE // PAGE, sum(pages_needed) + 1)
        self.pool = kv_pool(
            max_reqs=self.max_reqs, size=n_pages * PAGE, ratios=LAYER_RATIOS, device=device
        )
        self.req_to_token = torch.zeros(self.max_reqs, max_ctx, dtype=torch.int32)
        # Requests get shuffled, non-contiguous pages (page 0 stays unused).
        perm = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()
        self.pages: list[list[int]] = []
        for r in range(n_reqs):
            own = perm[: pages_needed[r]]
            perm = perm[pages_needed[r] :]
            self.pages.append(own)
            pos = torch.arange(step.seq_lens[r])
            self.req_to_token[r, : step.seq_lens[r]] = (
                torch.tensor(own)[pos // PAGE] * PAGE + pos % PAGE
            ).to(torch.int32)
        self.req_to_token_cpu = self.req_to_token
        self.req_to_token = self.req_to_token_cpu.to(device)
        # Caches: every position's key in the SWA cache, every compressed entry in c4/c128.
        for layer, ratio in enumerate(LAYER_RATIOS):
            swa_buf = self.pool.get_swa_key_buffer_radix(layer)
            for r in range(n_reqs):
                slots = self.req_to_token[r, : step.seq_lens[r]].to(torch.int64)
                kvl.encode_tokens(swa_buf.view(torch.uint8), PAGE, slots, self._keys(len(slots)))
            if ratio:
                cps = self.pool.get_extra_key_page_size(layer)
                extra = self.pool.get_extra_key_buffer(layer)
                for r in range(n_reqs):
                    n = step.seq_lens[r] // ratio
                    if n:
                        slots = self.compressed_slots(r, torch.arange(n), ratio).to(device)
                        kvl.encode_tokens(extra.view(torch.uint8), cps, slots, self._keys(n))
        self.backend = self._make_backend(dsv4, backend_cls or dsv4.DeepseekV4AttnBackend, q8kv8)

    def _keys(self, n):
        return (torch.randn(n, 512, generator=self.g) * 0.5).to(self.device)

    def compressed_slots(self, r: int, k: torch.Tensor, ratio: int) -> torch.Tensor:
        per_page = PAGE // ratio
        pages = torch.tensor(self.pages[r])[k // per_page]
        return pages * per_page + k % per_page

    def _make_backend(self, dsv4, cls, q8kv8: bool):
        from sglang.srt.layers.attention.dsv4.sparse_prefill_utils import SparsePrefillKVBuffer

        b = object.__new__(cls)
        # The attributes DeepseekV4AttnBackend.__init__ sets that this path reads.
        b.page_size = PAGE
        b.token_to_kv_pool = self.pool
        b.req_to_token = self.req_to_token
        b.req_to_token_pool = SimpleNamespace(req_to_token=self.req_to_token)
        b.present_ratios = self.pool.present_ratios
        b.low_ratios = ()
        b.has_c4, b.has_c128 = True, True
        b.is_dsv41 = False
        b._swa_interleaved = False
        b._flash_mla_with_kvcache = functools.partial(_decode_kernel, use_legacy=True)
        b.hisparse_coordinator = None
        b.index_topk = TOPK
        b.softmax_scale = 512**-0.5
        b.head_dim_v = 512
        b.trtllm_attn = False
        b.mtp_enabled = False
        b.topk = 0
        b.is_dspark_draft = False
        b.enable_decoder_swa_bounded_replay = False
        b.tail_forward_metadata = None
        b._early_verify_metadata_ids = set()
        b.dsv4_prefill_backend = "flashmla_sparse_q8" if q8kv8 else "auto"
        b._q8kv8_qpad_buf = None
        b._q8kv8_attn_sink_pad = None
        b._q8kv8_identity_scale = None
        b.forward_metadata = None
        b._build_forward_metadata = lambda fb, **kw: self.build_metadata(fb)
        b.sparse_prefill_kv_buffer = SparsePrefillKVBuffer(torch.device("cpu"))
        # Not read by upstream's path here; the split's plan reads the model's query heads.
        b.model_runner = SimpleNamespace(
            model_config=SimpleNamespace(hf_text_config=SimpleNamespace(num_attention_heads=HEADS))
        )
        return b

    # ---- forward batch --------------------------------------------------------------------

    def forward_batch(self, mode=None, num_decode_attr: int | None = "auto", original_mode=None):
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        from sglang_mixgraph.patches import mixed_split

        s = self.step
        n = len(s.seq_lens)
        positions, locs = [], []
        for r in range(n):
            for p in range(s.seq_lens[r] - s.extend_lens[r], s.seq_lens[r]):
                positions.append(p)
                locs.append(int(self.req_to_token_cpu[r, p]))
        positions += [0] * s.padding
        locs += [0] * s.padding
        mode = mode or ForwardMode.MIXED
        dev = self.device
        ext = torch.tensor(s.extend_lens, dtype=torch.int32, device=dev)
        fb = ForwardBatch(
            forward_mode=mode,
            batch_size=n,
            input_ids=torch.zeros(s.num_rows, dtype=torch.int64, device=dev),
            req_pool_indices=torch.arange(n, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(s.seq_lens, dtype=torch.int32, device=dev),
            seq_lens_cpu=torch.tensor(s.seq_lens, dtype=torch.int32),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64, device=dev),
            seq_lens_sum=sum(s.seq_lens),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
        )
        prefix = [a - b for a, b in zip(s.seq_lens, s.extend_lens, strict=False)]
        fb.extend_seq_lens = ext
        fb.extend_seq_lens_cpu = list(s.extend_lens)
        fb.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=dev)
        fb.extend_prefix_lens_cpu = prefix
        fb.extend_start_loc = torch.cumsum(ext, 0, dtype=torch.int32) - ext
        fb.extend_num_tokens = s.num_rows
        if original_mode is not None:
            fb._original_forward_mode = original_mode
        if num_decode_attr == "auto":
            # What the installed AFTER hook on ForwardBatch.init_new records for a scheduler
            # batch whose decoding_reqs are its last len(decode) requests.
            reqs = [object() for _ in range(n)]
            sched = SimpleNamespace(
                forward_mode=mode, reqs=reqs, decoding_reqs=reqs[len(s.prefill) :] or None
            )
            mixed_split.after_forward_batch_init_new(fb, ForwardBatch, sched, None)
        elif num_decode_attr is not None:
            setattr(fb, attrs.FORWARD_BATCH_NUM_DECODE, num_decode_attr)
        return fb

    # ---- metadata (stands in for upstream's Triton metadata builder + the indexer write) ---

    def build_metadata(self, fb):
        from sglang.srt.layers.attention import deepseek_v4_backend as dsv4

        s = self.step
        n = len(s.seq_lens)
        rows = s.num_rows
        g = torch.Generator().manual_seed(s.seed + 1)
        max_blocks = max(len(p) for p in self.pages)
        page_table = torch.zeros(rows, max_blocks, dtype=torch.int32)
        seq_casual = torch.ones(rows, dtype=torch.int32)
        pos_casual = torch.zeros(rows, dtype=torch.int32)
        swa_idx = torch.full((rows, SWA), -1, dtype=torch.int32)
        swa_len = torch.ones(rows, dtype=torch.int32)
        raw4 = torch.full((rows, TOPK), -1, dtype=torch.int32)
        page4 = torch.full((rows, TOPK), -1, dtype=torch.int32)
        len4 = torch.ones(rows, dtype=torch.int32)
        c128_w = max(max(s.seq_lens) // 128, 1)
        c128_w = -(-c128_w // 64) * 64
        idx128 = torch.full((rows, c128_w), -1, dtype=torch.int32)
        len128 = torch.ones(rows, dtype=torch.int32)
        t = 0
        for r in range(n):
            for p in range(s.seq_lens[r] - s.extend_lens[r], s.seq_lens[r]):
                page_table[t, : len(self.pages[r])] = torch.tensor(self.pages[r], dtype=torch.int32)
                seq_casual[t], pos_casual[t] = p + 1, p
                L = min(p + 1, SWA)
                swa_idx[t, :L] = self.req_to_token_cpu[r, p + 1 - L : p + 1]
                swa_len[t] = L
                # c4: the indexer's top-k over the (p+1)//4 visible compressed entries,
                # in its (arbitrary) order, with -1 holes where it selected nothing.
                n4 = (p + 1) // 4
                k = min(n4, TOPK)
                if k:
                    sel = torch.randperm(n4, generator=g)[:k]
                    if s.holes:
                        keep = torch.rand(k, generator=g) > 0.15
                        sel = torch.where(keep, sel, torch.full_like(sel, -1))
                    raw4[t, :k] = sel.to(torch.int32)
                    valid = sel >= 0
                    page4[t, :k] = torch.where(
                        valid,
                        self.compressed_slots(r, sel.clamp_min(0), 4),
                        torch.full_like(sel, -1),
                    ).to(torch.int32)
                len4[t] = min(max(n4, 1), TOPK)
                n128 = (p + 1) // 128
                if n128:
                    idx128[t, :n128] = self.compressed_slots(r, torch.arange(n128), 128).to(
                        torch.int32
                    )
                len128[t] = max(n128, 1)
                t += 1
        core = dsv4.DSV4AttnMetadata(
            page_size=PAGE,
            page_table=page_table,
            raw_out_loc=torch.zeros(rows, dtype=torch.int64),
            cuda_int32_kwargs={"dtype": torch.int32, "device": "cpu"},
            seq_lens_casual=seq_casual,
            positions_casual=pos_casual,
            swa_page_indices=swa_idx,
            swa_topk_lengths=swa_len,
            index_topk=TOPK,
            present_ratios=(4, 128),
        )
        core.c4_sparse_page_indices = page4
        core.c4_sparse_topk_lengths = len4
        core.c4_sparse_raw_indices = raw4
        core.c128_page_indices = idx128
        core.c128_topk_lengths_clamp1 = len128
        core.c0_flashmla_metadata = ref.ReferenceSchedMeta()
        core.c4_flashmla_metadata = ref.ReferenceSchedMeta()
        core.c128_flashmla_metadata = ref.ReferenceSchedMeta()
        return dsv4.DSV4Metadata(core, None)

    # ---- running a layer -------------------------------------------------------------------

    def q(self, heads: int = HEADS):
        g = torch.Generator().manual_seed(self.step.seed + 2)
        return (
            (torch.randn(self.step.num_rows, heads, 512, generator=g) * 0.5)
            .to(torch.bfloat16)
            .to(self.device)
        )

    def attn_sink(self, heads: int = HEADS):
        g = torch.Generator().manual_seed(self.step.seed + 3)
        return torch.randn(heads, generator=g).to(self.device)

    def run_layer(self, fb, layer: int, q=None, sink=None):
        from sglang.srt.environ import envs
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        q = self.q() if q is None else q
        sink = self.attn_sink(q.shape[1]) if sink is None else sink
        layer_obj = SimpleNamespace(layer_id=layer, v_head_dim=512, tp_q_head_num=q.shape[1])
        with (
            torch.no_grad(),
            forward_context(ForwardContext(attn_backend=self.backend)),
            envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(True),
        ):
            return self.backend.forward(
                q=q,
                k=q,
                v=q,
                layer=layer_obj,
                forward_batch=fb,
                compress_ratio=LAYER_RATIOS[layer],
                save_kv_cache=False,
                attn_sink=sink,
            )

    def run_step(self, fb, layers: Sequence[int] = (0, 1, 2)) -> dict[int, torch.Tensor]:
        from sglang.srt.environ import envs

        with envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(True):
            self.backend.init_forward_metadata(fb)
        return {layer: self.run_layer(fb, layer) for layer in layers}

    def request_slots(self, reqs: Sequence[int], layer: int) -> set:
        """Every cache slot (SWA and this layer's compressed cache) of these requests."""
        out = set()
        ratio = LAYER_RATIOS[layer]
        for r in reqs:
            out |= set(self.req_to_token_cpu[r, : self.step.seq_lens[r]].tolist())
        comp = set()
        if ratio:
            for r in reqs:
                nc = self.step.seq_lens[r] // ratio
                comp |= set(self.compressed_slots(r, torch.arange(nc), ratio).tolist())
        return out, comp


# --------------------------------------------------------------------------------------------
# upstream's eager runner over the world's layers
# --------------------------------------------------------------------------------------------


class EagerModel:
    """Stands in for the model under upstream's ``EagerRunner``: runs the world's attention
    layers on the batch the runner hands it (the runner's copy, relabelled), keeping each."""

    shared_experts_config = None

    def __init__(self, world: World, heads: int = HEADS):
        self.world, self.heads = world, heads
        self.batches = []

    def forward(self, input_ids, positions, forward_batch, **kwargs):
        self.batches.append(forward_batch)
        q = self.world.q(heads=self.heads)
        return {
            layer: self.world.run_layer(forward_batch, layer, q=q)
            for layer in range(len(LAYER_RATIOS))
        }


def eager_runner(world: World, heads: int = HEADS, spec_algorithm: str | None = None):
    """``(runner, model)``: upstream's ``EagerRunner`` (real ``execute`` / ``_execute_extend`` /
    ``load_batch`` and CPU eager buffer registry) with the attributes its ``__init__`` sets that
    ``execute`` reads, over an :class:`EagerModel` whose queries have ``heads`` heads. The model
    runner's speculative algorithm is ``spec_algorithm`` (a ``--speculative-algorithm`` value)."""
    from sglang.srt.model_executor.cuda_graph_buffer_registry import build_eager_registry
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = object.__new__(EagerRunner)
    model = EagerModel(world, heads)
    runner.model_runner = SimpleNamespace(
        attn_backend=world.backend,
        model=model,
        device="cpu",
        device_timer=None,
        spec_algorithm=SpeculativeAlgorithm.from_string(spec_algorithm),
        _extend_forward_kwargs=lambda fb, pp: {},
    )
    runner.device = "cpu"
    runner.enable_pdmux = False
    runner._eager_registry = build_eager_registry(
        device=torch.device("cpu"),
        max_bs=MAX_REQS,
        max_num_token=2048,
        cache_loc_dtype=torch.int64,
    )
    return runner, model


def run_eager(runner, world: World, fb):
    """``runner.execute(fb)`` inside the forward context, as ``ModelRunner._forward_raw``
    enters it before calling the runner."""
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    with (
        torch.no_grad(),
        envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(True),
        forward_context(ForwardContext(attn_backend=world.backend), forward_batch=fb),
    ):
        return runner.execute(fb)
