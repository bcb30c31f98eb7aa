"""Synthetic DSV4 mixed steps at the kernel level: caches, per-row indices, workspaces, and the
unsplit / split attention of one layer. Shared by ``benchmark/mixed_split_kernel.py``, the GPU
kernel tests (``test/gpu``) and the CPU equivalence tests (``test/core``). No sglang here.

Row order is the MIXED batch order: the prefill requests' rows first, then one row per decode
request, then padding. Per query row at position ``pos`` the keys are

* SWA: positions ``[pos - min(pos + 1, W) + 1, pos]`` (W = 128);
* compressed: c4 layers a random top-k (``min((pos + 1) // 4, topk)`` entries) of the first
  ``(pos + 1) // 4`` compressed entries, c128 layers all ``(pos + 1) // 128`` entries.

Two encodings of the same keys are built:

* decode kernel inputs (FlashMLA ``flash_mla_with_kvcache``): SWA slot indices ``(rows, 128)``
  + lengths, compressed-cache slot indices ``(rows, W_extra)`` + lengths (lengths clamped to at
  least 1 with ``-1`` entries, as upstream's ``*_topk_lengths_clamp1``,
  ``deepseek_v4_backend._low_ratio_compression_metadata``);
* sparse-prefill inputs (``flash_mla_sparse_fwd``) over a bf16 workspace laid out as upstream's
  chunk cache does (``dsv4/sparse_prefill_utils.py``): all requests' compressed regions, then all
  requests' SWA gathers (``min(seq, extend + W - 1)`` positions each); per-row combined indices
  ``[compressed..., swa..., -1 pad to a multiple of 128]`` with the valid ones packed first.

The attention functions take the kernels as arguments, so the same code runs FlashMLA on the GPU
and the torch reference on the CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from sglang_mixgraph.core.mixed_boundary import (
    MixedBoundary,
    assemble_rows,
    compute_mixed_boundary,
    copy_in_join,
)
from sglang_mixgraph.kits.decode_tail_call import DecodeTail
from sglang_mixgraph.reference import v4_kv_layout as kvl

SWA = 128
COMBINED_ALIGN = 128


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def fill_random(
    cache: torch.Tensor,
    page_size: int,
    gen: torch.Generator | None = None,
    chunk_pages: int = 4096,
) -> None:
    """Fill a V4 cache with valid random tokens cheaply (no per-token quantization).

    e4m3 bytes from 16 * N(0, 1), scale bytes in [120, 124] (2**-7 .. 2**-3), so nope values
    are O(0.1 .. 1); rope 0.5 * N(0, 1) in bf16. Every byte a token owns is written, so nothing is left as zeros.
    """
    nope_v, rope_v, scale_v = kvl.page_views(cache, page_size)
    n = nope_v.shape[0]
    dev = nope_v.device
    for s in range(0, n, chunk_pages):
        e = min(n, s + chunk_pages)
        shape = (e - s, page_size)
        nope_v[s:e] = (
            torch.randn(shape + (kvl.NOPE_DIM,), device=dev, generator=gen)
            .mul_(16)
            .to(kvl.FP8_DTYPE)
            .view(torch.uint8)
        )
        rope_v[s:e] = (
            torch.randn(shape + (kvl.ROPE_DIM,), device=dev, generator=gen)
            .mul_(0.5)
            .to(torch.bfloat16)
        )
        sc = torch.randint(
            120, 125, shape + (kvl.SCALE_BYTES,), device=dev, dtype=torch.uint8, generator=gen
        )
        sc[..., kvl.NUM_TILES] = 0
        scale_v[s:e] = sc


@dataclasses.dataclass
class StepSpec:
    ratio: int  # 4 or 128 (0: SWA only)
    seq_lens: list[int]
    extend_lens: list[int]
    num_decode: int
    topk: int = 1024  # c4 top-k width (index_topk)
    h_q: int = 128
    swa_page_size: int = 256
    full_page_size: int = 256  # compressed page = full_page_size // ratio
    num_padding: int = 0
    seed: int = 0
    # cache pools: at least what the step needs; more spreads the indices (benchmark: >> L2)
    min_swa_tokens: int = 0
    min_extra_tokens: int = 0
    # rows whose compressed keys are dropped (only SWA keys): "rows with only SWA keys"
    swa_only_rows: Sequence[int] = ()


@dataclasses.dataclass
class SyntheticStep:
    spec: StepSpec
    boundary: MixedBoundary
    q: torch.Tensor  # (num_rows, h_q, 512) bf16
    attn_sink: torch.Tensor  # (h_q,) fp32
    swa_cache: torch.Tensor  # (pages, page_bytes) u8
    extra_cache: torch.Tensor | None
    swa_page_size: int
    extra_page_size: int
    # decode-kernel encoding, (num_rows, ...) rows (padding rows: one -1 key)
    swa_indices: torch.Tensor
    swa_lengths: torch.Tensor
    extra_indices: torch.Tensor | None
    extra_lengths: torch.Tensor | None
    # logical keys (for workspaces)
    row_req: torch.Tensor
    row_pos: torch.Tensor
    sel: torch.Tensor | None  # (rows, W) compressed entry ids, -1 padded
    n_sel: torch.Tensor
    n_swa: torch.Tensor
    swa_cols: torch.Tensor  # (rows, 128) window column in the request's SWA gather, -1 padded
    comp_slots: torch.Tensor | None  # (reqs, c_max) extra-cache slot per compressed entry
    swa_slots: torch.Tensor  # (reqs, g_max) SWA-cache slot per gathered position
    gather_first: torch.Tensor  # (reqs,) first position of each request's SWA gather
    gather_lens: list[int]
    comp_lens: list[int]

    @property
    def swa_view(self) -> torch.Tensor:
        return kvl.kernel_view(self.swa_cache, self.swa_page_size)

    @property
    def extra_view(self) -> torch.Tensor | None:
        if self.extra_cache is None:
            return None
        return kvl.kernel_view(self.extra_cache, self.extra_page_size)


def build_step(
    spec: StepSpec,
    device="cpu",
    q_scale: float = 1.0,
    swa_cache: torch.Tensor | None = None,
    extra_cache: torch.Tensor | None = None,
) -> SyntheticStep:
    """Build one step. ``swa_cache``/``extra_cache``: optional pre-filled pools (the benchmark
    reuses large pools across points); otherwise pools are allocated and filled here."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(spec.seed)
    seqs, exts = list(spec.seq_lens), list(spec.extend_lens)
    nreq = len(seqs)
    real_rows = sum(exts)
    boundary = compute_mixed_boundary(exts, spec.num_decode, real_rows + spec.num_padding)
    ratio = spec.ratio

    # ---- caches and per-request slot tables ----
    gather_lens = [min(s, e + SWA - 1) for s, e in zip(seqs, exts, strict=False)]
    g_max = max(gather_lens)
    swa_needed = sum(gather_lens)
    if swa_cache is None:
        swa_tokens = max(swa_needed, spec.min_swa_tokens)
        swa_pages = -(-swa_tokens // spec.swa_page_size)
        swa_cache = kvl.allocate_cache(swa_pages, spec.swa_page_size, dev)
        fill_random(swa_cache, spec.swa_page_size, gen)
    swa_pages = swa_cache.shape[0]
    if swa_pages * spec.swa_page_size < swa_needed:
        raise ValueError(
            f"SWA pool of {swa_pages * spec.swa_page_size} tokens < {swa_needed} needed"
        )
    perm = torch.randperm(swa_pages * spec.swa_page_size, device=dev, generator=gen)[:swa_needed]
    swa_slots = torch.zeros(nreq, g_max, dtype=torch.int64, device=dev)
    col = torch.arange(g_max, device=dev)
    glen_t = torch.tensor(gather_lens, device=dev)
    mask = col[None, :] < glen_t[:, None]
    swa_slots[mask] = perm
    gather_first = torch.tensor(
        [s - g for s, g in zip(seqs, gather_lens, strict=False)], device=dev
    )

    comp_lens = [s // ratio for s in seqs] if ratio else [0] * nreq
    extra_page = max(spec.full_page_size // ratio, 1) if ratio else 1
    comp_slots = None
    if not ratio:
        extra_cache = None
    if ratio:
        c_max = max(max(comp_lens), 1)
        pages_per_req = -(-c_max // extra_page)
        need_pages = sum(-(-max(c, 1) // extra_page) for c in comp_lens)
        if extra_cache is None:
            extra_pages = max(need_pages, -(-spec.min_extra_tokens // extra_page), 1)
            extra_cache = kvl.allocate_cache(extra_pages, extra_page, dev)
            fill_random(extra_cache, extra_page, gen)
        extra_pages = extra_cache.shape[0]
        if extra_pages >= nreq * pages_per_req:
            page_tab = torch.randperm(extra_pages, device=dev, generator=gen)[
                : nreq * pages_per_req
            ]
        else:  # pool smaller than the union: pages may be shared between requests
            page_tab = torch.randint(
                0, extra_pages, (nreq * pages_per_req,), device=dev, generator=gen
            )
        page_tab = page_tab.view(nreq, pages_per_req)
        j = torch.arange(c_max, device=dev)
        comp_slots = page_tab[:, j // extra_page] * extra_page + (j % extra_page)

    # ---- rows ----
    row_req_l: list[int] = []
    row_pos_l: list[int] = []
    for r, (s, e) in enumerate(zip(seqs, exts, strict=False)):
        row_req_l += [r] * e
        row_pos_l += list(range(s - e, s))
    rows = boundary.num_rows
    pad = rows - real_rows
    row_req = torch.tensor(row_req_l + [0] * pad, dtype=torch.int64, device=dev)
    row_pos = torch.tensor(row_pos_l + [0] * pad, dtype=torch.int64, device=dev)
    real = torch.arange(rows, device=dev) < real_rows

    # SWA window per row
    n_swa = torch.clamp(row_pos + 1, max=SWA)
    k = torch.arange(SWA, device=dev)
    win_pos = row_pos[:, None] - n_swa[:, None] + 1 + k[None, :]
    swa_cols = win_pos - gather_first[row_req][:, None]
    swa_valid = (k[None, :] < n_swa[:, None]) & real[:, None]
    swa_cols = torch.where(swa_valid, swa_cols, torch.full_like(swa_cols, -1))
    swa_indices = torch.where(
        swa_valid, swa_slots[row_req[:, None], swa_cols.clamp_min(0)], torch.full_like(swa_cols, -1)
    ).to(torch.int32)
    swa_lengths = torch.where(real, n_swa, torch.ones_like(n_swa)).to(torch.int32)
    n_swa = torch.where(real, n_swa, torch.zeros_like(n_swa))

    # compressed selection per row
    sel = None
    n_sel = torch.zeros(rows, dtype=torch.int64, device=dev)
    extra_indices = extra_lengths = None
    if ratio:
        avail = (row_pos + 1) // ratio
        avail = torch.where(real, avail, torch.zeros_like(avail))
        if spec.swa_only_rows:
            only = torch.zeros(rows, dtype=torch.bool, device=dev)
            only[torch.tensor(list(spec.swa_only_rows), device=dev, dtype=torch.int64)] = True
            avail = torch.where(only, torch.zeros_like(avail), avail)
        if ratio == 128:
            width = _ceil(max(max(comp_lens), 1), 64)
            j = torch.arange(width, device=dev)
            sel = torch.where(
                j[None, :] < avail[:, None],
                j[None, :].expand(rows, -1),
                torch.full((rows, width), -1, device=dev, dtype=torch.int64),
            )
            n_sel = avail
        else:
            width = spec.topk
            c_max = comp_slots.shape[1]
            n_sel = torch.clamp(avail, max=spec.topk)
            sel = torch.full((rows, width), -1, dtype=torch.int64, device=dev)
            cw = min(c_max, max(int(avail.max()) if rows else 0, 1))
            chunk = max(1, (1 << 24) // max(cw, 1))
            for s in range(0, rows, chunk):
                e = min(rows, s + chunk)
                sc = torch.rand(e - s, cw, device=dev, generator=gen)
                jj = torch.arange(cw, device=dev)
                sc = torch.where(jj[None, :] < avail[s:e, None], sc, torch.full_like(sc, -1.0))
                kk = min(width, cw)
                top = torch.topk(sc, kk, dim=1).indices
                top = torch.sort(top, dim=1).values  # any order works; sorted looks like upstream
                # keep the first n_sel of the selected set, valid ones packed first
                valid_top = torch.gather(sc, 1, top) >= 0
                top = torch.where(valid_top, top, torch.full_like(top, -1))
                order = torch.argsort((~valid_top).to(torch.int8), dim=1, stable=True)
                top = torch.gather(top, 1, order)
                sel[s:e, :kk] = top
        extra_indices = torch.where(
            sel >= 0, comp_slots[row_req[:, None], sel.clamp_min(0)], torch.full_like(sel, -1)
        ).to(torch.int32)
        extra_lengths = n_sel.clamp_min(1).to(torch.int32)

    q = (torch.randn(rows, spec.h_q, kvl.HEAD_DIM, device=dev, generator=gen) * q_scale).to(
        torch.bfloat16
    )
    sink = torch.randn(spec.h_q, device=dev, generator=gen).float()
    return SyntheticStep(
        spec=spec,
        boundary=boundary,
        q=q,
        attn_sink=sink,
        swa_cache=swa_cache,
        extra_cache=extra_cache,
        swa_page_size=spec.swa_page_size,
        extra_page_size=extra_page,
        swa_indices=swa_indices,
        swa_lengths=swa_lengths,
        extra_indices=extra_indices,
        extra_lengths=extra_lengths,
        row_req=row_req,
        row_pos=row_pos,
        sel=sel,
        n_sel=n_sel,
        n_swa=n_swa,
        swa_cols=swa_cols,
        comp_slots=comp_slots,
        swa_slots=swa_slots,
        gather_first=gather_first,
        gather_lens=gather_lens,
        comp_lens=comp_lens,
    )


@dataclasses.dataclass
class WorkspacePlan:
    """A sparse-prefill workspace over requests ``[0, num_reqs)`` and rows ``[0, num_rows)``."""

    num_reqs: int
    num_rows: int
    comp_ids: torch.Tensor | None  # extra-cache slots to dequantize, (n_comp,)
    swa_ids: torch.Tensor  # SWA-cache slots to dequantize, (n_swa,)
    indices: torch.Tensor  # (num_rows, width) int32 into the workspace
    lengths: torch.Tensor  # (num_rows,) int32

    @property
    def num_tokens(self) -> int:
        n = self.swa_ids.numel()
        return n + (0 if self.comp_ids is None else self.comp_ids.numel())

    @property
    def nbytes(self) -> int:
        return self.num_tokens * kvl.HEAD_DIM * 2


def plan_workspace(
    step: SyntheticStep, num_reqs: int, num_rows: int, empty_rows: int = 0
) -> WorkspacePlan:
    """Workspace + combined indices for the first ``num_reqs`` requests and their ``num_rows`` rows.

    ``empty_rows`` appends rows with no key at all (indices -1, length 0): the split runs the
    sparse prefill over ``b0 + D (+ padding)`` rows with the decode rows empty, so its output
    already has every row and the decode kernel's rows are copied in (no join of all rows)."""
    dev = step.q.device
    ratio = step.spec.ratio
    glens = step.gather_lens[:num_reqs]
    clens = step.comp_lens[:num_reqs]
    if ratio == 128:
        c_max = max(max(clens), 1) if clens else 1
        comp_sizes = [c_max] * num_reqs
    elif ratio:
        comp_sizes = clens
    else:
        comp_sizes = [0] * num_reqs
    comp_base_l = [0]
    for c in comp_sizes[:-1]:
        comp_base_l.append(comp_base_l[-1] + c)
    total_comp = sum(comp_sizes)
    swa_base_l = [total_comp]
    for g in glens[:-1]:
        swa_base_l.append(swa_base_l[-1] + g)
    comp_base = torch.tensor(comp_base_l or [0], device=dev)
    swa_base = torch.tensor(swa_base_l or [0], device=dev)

    # ids to dequantize
    comp_ids = None
    if ratio and total_comp:
        w = step.comp_slots.shape[1]
        j = torch.arange(w, device=dev)
        sizes = torch.tensor(comp_sizes, device=dev)
        m = j[None, :] < sizes[:, None]
        comp_ids = step.comp_slots[:num_reqs].clone()
        if ratio == 128:  # slots past a request's own history: upstream clamps -1 -> slot 0
            own = torch.tensor(clens, device=dev)
            comp_ids = torch.where(j[None, :] < own[:, None], comp_ids, torch.zeros_like(comp_ids))
        comp_ids = comp_ids[m].to(torch.int32)
    jg = torch.arange(step.swa_slots.shape[1], device=dev)
    mg = jg[None, :] < torch.tensor(glens, device=dev)[:, None]
    swa_ids = step.swa_slots[:num_reqs][mg].to(torch.int32)

    # combined per-row indices: compressed (valid first) then SWA, -1 padded
    req = step.row_req[:num_rows]
    topk = step.sel.shape[1] if step.sel is not None else 0
    width = _ceil(topk + SWA, COMBINED_ALIGN)
    buf = torch.full((num_rows, width + SWA), -1, dtype=torch.int64, device=dev)
    n_sel = step.n_sel[:num_rows]
    if topk:
        sel = step.sel[:num_rows]
        buf[:, :topk] = torch.where(
            sel >= 0, comp_base[req][:, None] + sel, torch.full_like(sel, -1)
        )
    cols = step.swa_cols[:num_rows]
    swa_ws = torch.where(cols >= 0, swa_base[req][:, None] + cols, torch.full_like(cols, -1))
    k = torch.arange(SWA, device=dev)
    dest = n_sel[:, None] + k[None, :]
    ok = cols >= 0
    # scatter the valid SWA entries right after the valid compressed ones
    buf.scatter_(
        1,
        torch.where(ok, dest, torch.full_like(dest, width + SWA - 1)),
        torch.where(ok, swa_ws, -1),
    )
    buf[:, width + SWA - 1] = -1
    indices = buf[:, :width].to(torch.int32)
    lengths = (n_sel + step.n_swa[:num_rows]).to(torch.int32)
    if empty_rows:
        indices = torch.cat(
            [indices, torch.full((empty_rows, width), -1, dtype=torch.int32, device=dev)]
        )
        lengths = torch.cat([lengths, torch.zeros(empty_rows, dtype=torch.int32, device=dev)])
    return WorkspacePlan(
        num_reqs=num_reqs,
        num_rows=num_rows + empty_rows,
        comp_ids=comp_ids,
        swa_ids=swa_ids,
        indices=indices.contiguous(),
        lengths=lengths,
    )


DequantFn = Callable[..., torch.Tensor]


def fill_workspace(
    step: SyntheticStep, plan: WorkspacePlan, dequant: DequantFn, ws: torch.Tensor | None = None
) -> torch.Tensor:
    """Dequantize the plan's tokens into a ``(tokens, 1, 512)`` bf16 workspace (two launches)."""
    n = plan.num_tokens
    if ws is None:
        ws = torch.empty(n, 1, kvl.HEAD_DIM, dtype=torch.bfloat16, device=step.q.device)
    nc = 0 if plan.comp_ids is None else plan.comp_ids.numel()
    if nc:
        dequant(step.extra_cache, step.extra_page_size, plan.comp_ids, out=ws[:nc])
    if plan.swa_ids.numel():
        dequant(step.swa_cache, step.swa_page_size, plan.swa_ids, out=ws[nc:n])
    return ws


def softmax_scale() -> float:
    return kvl.HEAD_DIM**-0.5


def _sparse_prefill(
    step: SyntheticStep,
    plan: WorkspacePlan,
    dequant: DequantFn,
    sparse_fwd: Callable,
    ws: torch.Tensor | None,
) -> torch.Tensor:
    """The sparse prefill over the plan's rows, through its bf16 workspace."""
    ws = fill_workspace(step, plan, dequant, ws)
    out, _, _ = sparse_fwd(
        step.q[: plan.num_rows],
        ws,
        plan.indices.unsqueeze(1),
        softmax_scale(),
        kvl.HEAD_DIM,
        step.attn_sink,
        plan.lengths,
    )
    return out


def unsplit_attention(
    step: SyntheticStep,
    plan_all: WorkspacePlan,
    dequant: DequantFn,
    sparse_fwd: Callable,
    ws: torch.Tensor | None = None,
) -> torch.Tensor:
    """Upstream's path: every real row through the bf16 workspace and sparse prefill."""
    b = step.boundary
    out = _sparse_prefill(step, plan_all, dequant, sparse_fwd, ws)
    if b.num_padding_rows:
        return assemble_rows(b, out[: b.b0], out[b.b0 :], like=out)
    return out


def split_attention(
    step: SyntheticStep,
    plan_pre: WorkspacePlan | None,
    dequant: DequantFn,
    sparse_fwd: Callable,
    tail: DecodeTail,
    ratio_key: int | None = None,
    ws: torch.Tensor | None = None,
) -> torch.Tensor:
    """The split: prefill rows through a prefill-only workspace, decode rows through the fp8
    decode kernel (``core.decode_tail``), one output in row order.

    How the two outputs are joined depends on ``plan_pre`` (FlashMLA has no ``out=``):

    * ``plan_pre.num_rows == b0``: ``torch.cat``-style join of every row (``assemble_rows``);
    * ``plan_pre.num_rows == num_rows`` (built with ``empty_rows = D + padding``): the sparse
      prefill runs over all rows with the decode and padding rows empty (zero output), and only
      the D decode rows are copied into its output.
    """
    b = step.boundary
    o_dec = None
    if b.num_decode_reqs:
        rows = b.decode_rows
        o_dec = tail.forward(
            step.spec.ratio if ratio_key is None else ratio_key,
            step.q[rows],
            step.swa_view,
            step.swa_indices[rows],
            step.swa_lengths[rows],
            step.attn_sink,
            extra_k_cache=step.extra_view,
            extra_indices=None if step.extra_indices is None else step.extra_indices[rows],
            extra_lengths=None if step.extra_lengths is None else step.extra_lengths[rows],
            softmax_scale=softmax_scale(),
        )
    if not b.b0:
        if b.num_padding_rows == 0:
            return o_dec
        return assemble_rows(b, None, o_dec, like=step.q)
    o_pre = _sparse_prefill(step, plan_pre, dequant, sparse_fwd, ws)
    n = plan_pre.num_rows
    if n == b.num_rows:  # decode (and padding) rows came out empty: the patch's join
        return copy_in_join(b, o_pre, o_dec)
    if n != b.b0:
        raise ValueError(f"prefill plan has {n} rows; expected b0={b.b0} or num_rows={b.num_rows}")
    if o_dec is None and b.num_padding_rows == 0:
        return o_pre
    return assemble_rows(b, o_pre, o_dec, like=step.q)


def plan_split_prefill(step: SyntheticStep, join: str = "copy") -> WorkspacePlan | None:
    """The split's prefill plan: ``join="copy"`` (empty decode/padding rows, copy-in) or ``"cat"``."""
    b = step.boundary
    if not b.num_prefill_reqs:
        return None
    if join == "copy":
        return plan_workspace(step, b.num_prefill_reqs, b.b0, empty_rows=b.num_rows - b.b0)
    if join == "cat":
        return plan_workspace(step, b.num_prefill_reqs, b.b0)
    raise ValueError(join)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.double()
    b = b.double()
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)
