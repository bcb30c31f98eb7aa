"""What the host knows of one mixed step before anything launches: per layer kind (compress
ratio), the workspace rows each path dequantizes and the (query row, key) pairs each kernel
attends to, for the prefill requests, the decode requests and all of them.

No sglang imports. `StepShape` is one layer kind's counts (`from_lists` from the per-request
host lists, `uniform` for the benchmark's steps); `StepCounts` counts every layer kind of a step
at once without a Python loop over the decode requests (a mixed step's 256 running requests per
rank), and gives each kind's `StepShape` in O(1). The key counts are closed forms of
``sum min(x, swa)`` and ``sum min(x // ratio, topk)`` over a request's query positions, as the
DSV4 backend attends (SWA window, c4 layers' indexer top-k, c128 layers every compressed entry).
The split's cost model (`core.split_cost_model`) prices these counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch

SWA_WINDOW = 128
C4_TOPK = 1024


# --------------------------------------------------------------------------------------------
# closed-form key counts
# --------------------------------------------------------------------------------------------


def _sum_floor_div(n: int, r: int) -> int:
    """sum_{x=0}^{n} floor(x / r) for n >= -1."""
    if n < 0:
        return 0
    q, rem = divmod(n, r)
    return r * q * (q - 1) // 2 + q * (rem + 1)


def sum_min_floor_div(lo: int, hi: int, r: int, cap: int | None) -> int:
    """sum_{x=lo}^{hi} min(floor(x / r), cap) (cap None: no cap); 0 when hi < lo."""
    if hi < lo:
        return 0

    def prefix(n: int) -> int:
        if n < 0:
            return 0
        if cap is None:
            return _sum_floor_div(n, r)
        knee = cap * r - 1  # last x with floor(x/r) < cap
        return _sum_floor_div(min(n, knee), r) + cap * max(0, n - knee)

    return prefix(hi) - prefix(lo - 1)


def sum_min_linear(lo: int, hi: int, cap: int) -> int:
    """sum_{x=lo}^{hi} min(x, cap); 0 when hi < lo."""
    if hi < lo:
        return 0
    below_hi = min(hi, cap)
    part = 0
    if lo <= below_hi:
        part = (lo + below_hi) * (below_hi - lo + 1) // 2
    over = max(0, hi - max(lo - 1, cap))
    return part + cap * over


def request_keys(
    seq_len: int, extend_len: int, ratio: int, topk: int | None, swa: int = SWA_WINDOW
) -> int:
    """Valid (row, key) pairs of one request's query rows.

    A query at position ``pos`` (``x = pos + 1`` tokens visible) attends to ``min(x, swa)`` SWA
    keys plus ``min(x // ratio, topk)`` compressed keys (c128 layers use every compressed
    entry: ``topk=None``; SWA-only layers ``ratio=0``).
    """
    lo, hi = seq_len - extend_len + 1, seq_len
    keys = sum_min_linear(lo, hi, swa)
    if ratio:
        keys += sum_min_floor_div(lo, hi, ratio, topk)
    return keys


# --------------------------------------------------------------------------------------------
# step features
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepShape:
    """Host-side counts of one mixed step for one layer kind (compress ratio)."""

    ratio: int
    num_decode: int  # D
    prefill_rows: int  # b0
    ws_all: int
    ws_pre: int
    keys_all: int
    keys_pre: int
    keys_dec: int

    @property
    def rows_all(self) -> int:
        return self.prefill_rows + self.num_decode

    @classmethod
    def from_lists(
        cls,
        ratio: int,
        seq_lens: Sequence[int],
        extend_seq_lens: Sequence[int],
        num_decode: int,
        topk: int | None = C4_TOPK,
        swa: int = SWA_WINDOW,
    ) -> StepShape:
        """From per-request host lists, prefill requests first (the MIXED batch order)."""
        seqs = [int(s) for s in seq_lens]
        exts = [int(e) for e in extend_seq_lens]
        if len(seqs) != len(exts):
            raise ValueError("seq_lens and extend_seq_lens differ in length")
        p = len(seqs) - int(num_decode)
        if p < 0:
            raise ValueError("more decode requests than requests")
        eff_topk = None if ratio == 128 else topk
        keys = [request_keys(s, e, ratio, eff_topk, swa) for s, e in zip(seqs, exts, strict=False)]
        ws_all = sum(workspace_tokens(seqs, exts, ratio, swa))
        ws_pre = sum(workspace_tokens(seqs[:p], exts[:p], ratio, swa))
        return cls(
            ratio=ratio,
            num_decode=int(num_decode),
            prefill_rows=sum(exts[:p]),
            ws_all=ws_all,
            ws_pre=ws_pre,
            keys_all=sum(keys),
            keys_pre=sum(keys[:p]),
            keys_dec=sum(keys[p:]),
        )

    @classmethod
    def uniform(
        cls,
        ratio: int,
        context: int,
        decode_rows: int,
        prefill_rows: int,
        topk: int | None = C4_TOPK,
        swa: int = SWA_WINDOW,
    ) -> StepShape:
        """The benchmark's step: ``decode_rows`` requests at ``context`` tokens plus (when
        ``prefill_rows > 0``) one prefill request whose chunk of ``prefill_rows`` tokens ends at
        ``max(context, prefill_rows)``."""
        seqs, exts = uniform_step_lists(context, decode_rows, prefill_rows)
        return cls.from_lists(ratio, seqs, exts, decode_rows, topk, swa)


def uniform_step_lists(
    context: int, decode_rows: int, prefill_rows: int
) -> tuple[list[int], list[int]]:
    seqs: list[int] = []
    exts: list[int] = []
    if prefill_rows > 0:
        seqs.append(max(context, prefill_rows))
        exts.append(prefill_rows)
    seqs += [context] * decode_rows
    exts += [1] * decode_rows
    return seqs, exts


def workspace_tokens(
    seqs: Sequence[int], exts: Sequence[int], ratio: int, swa: int = SWA_WINDOW
) -> tuple[int, int]:
    """Rows of the bf16 sparse-prefill workspace for these requests (host lists of ints):
    ``(compressed, swa)``. Upstream's sizing: the SWA gather covers ``min(seq, extend + W - 1)``
    positions per request (``DeepseekV4AttnBackend._build_sparse_prefill_chunk_cache``); a top-k
    ratio gathers each request's whole compressed history ``seq // ratio``
    (``SparsePrefillChunkCache.ensure_compressed``); c128 ``max(max_seq // 128, 1)`` slots per
    request (``SparsePrefillChunkCache.ensure_c128``)."""
    if len(seqs) != len(exts):
        raise ValueError("seq_lens and extend_seq_lens differ in length")
    if not seqs:
        return 0, 0
    swa_rows = sum(min(s, e + swa - 1) for s, e in zip(seqs, exts, strict=False))
    if ratio == 0:
        return 0, swa_rows
    if ratio == 128:
        return len(seqs) * max(max(seqs) // 128, 1), swa_rows
    return sum(s // ratio for s in seqs), swa_rows


@dataclasses.dataclass(frozen=True)
class StepCounts:
    """Host counts of one mixed step for every layer kind at once (prefill requests first).

    :meth:`shape` gives one compress ratio's :class:`StepShape` (equal to
    ``StepShape.from_lists`` on the same lists) in O(1). Building the counts costs one closed
    form per prefill request and, for the decode requests, a fixed number of reductions over
    their lengths (one numpy pass each when they come as a tensor, as
    ``ForwardBatch.seq_lens_cpu`` does): no Python loop over the decode requests, which is
    where a mixed step's requests are (256 per rank in the reference deployment).
    """

    num_decode: int  # D
    num_prefill_reqs: int  # P
    prefill_rows: int  # b0
    swa: int
    max_seq_pre: int  # 0 without prefill requests
    max_seq_all: int
    swa_ws_pre: int  # sum over prefill requests of min(seq, ext + swa - 1)
    swa_keys_pre: int  # (row, SWA key) pairs of the prefill rows
    swa_dec: int  # sum over decode requests of min(seq, swa): their SWA keys and SWA rows
    # per compressed ratio: (prefill requests, decode requests) workspace rows and key pairs;
    # c128's workspace follows the longest request instead (see ``workspace_tokens``)
    comp_ws: Mapping[int, tuple[int, int]]
    comp_keys: Mapping[int, tuple[int, int]]

    @classmethod
    def from_lists(
        cls,
        seq_lens,
        extend_seq_lens: Sequence[int],
        num_decode: int,
        topk: int | None = C4_TOPK,
        swa: int = SWA_WINDOW,
        ratios: Sequence[int] = (4, 128),
    ) -> StepCounts:
        """``seq_lens``: a host list or a 1-D CPU tensor (every request, prefill ones first);
        ``extend_seq_lens``: a host list. ``ratios``: the compressed ratios to count (SWA-only
        layers need none). c128 layers attend every compressed entry (no top-k cap)."""
        n = len(extend_seq_lens)
        d = int(num_decode)
        p = n - d
        if p < 0:
            raise ValueError("more decode requests than requests")
        if len(seq_lens) != n:
            raise ValueError("seq_lens and extend_seq_lens differ in length")
        comp = [int(r) for r in ratios if r]
        if isinstance(seq_lens, torch.Tensor):
            pre_seqs = [int(x) for x in seq_lens[:p].tolist()]
            dec = _decode_sums_tensor(seq_lens[p:], d, comp, topk, swa)
        else:
            pre_seqs = [int(x) for x in seq_lens[:p]]
            dec = _decode_sums_list([int(x) for x in seq_lens[p:]], comp, topk, swa)
        pre_exts = [int(e) for e in extend_seq_lens[:p]]
        swa_ws_pre = swa_keys_pre = 0
        comp_ws_pre = dict.fromkeys(comp, 0)
        comp_keys_pre = dict.fromkeys(comp, 0)
        for s, e in zip(pre_seqs, pre_exts, strict=True):
            lo = s - e + 1
            swa_ws_pre += min(s, e + swa - 1)
            swa_keys_pre += sum_min_linear(lo, s, swa)
            for r in comp:
                comp_ws_pre[r] += s // r
                comp_keys_pre[r] += sum_min_floor_div(lo, s, r, None if r == 128 else topk)
        swa_dec, max_dec, dec_ws, dec_keys = dec
        max_pre = max(pre_seqs) if pre_seqs else 0
        return cls(
            num_decode=d,
            num_prefill_reqs=p,
            prefill_rows=sum(pre_exts),
            swa=swa,
            max_seq_pre=max_pre,
            max_seq_all=max(max_pre, max_dec),
            swa_ws_pre=swa_ws_pre,
            swa_keys_pre=swa_keys_pre,
            swa_dec=swa_dec,
            comp_ws={r: (comp_ws_pre[r], dec_ws[r]) for r in comp},
            comp_keys={r: (comp_keys_pre[r], dec_keys[r]) for r in comp},
        )

    def shape(self, ratio: int) -> StepShape:
        """The counts of one layer kind, as ``StepShape.from_lists`` gives them."""
        p, d = self.num_prefill_reqs, self.num_decode
        keys_pre, keys_dec = self.swa_keys_pre, self.swa_dec
        ws_pre = self.swa_ws_pre if p else 0
        ws_all = self.swa_ws_pre + self.swa_dec if p + d else 0
        if ratio:
            kp, kd = self.comp_keys[ratio]
            keys_pre, keys_dec = keys_pre + kp, keys_dec + kd
            if ratio == 128:
                if p:
                    ws_pre += p * max(self.max_seq_pre // 128, 1)
                if p + d:
                    ws_all += (p + d) * max(self.max_seq_all // 128, 1)
            else:
                wp, wd = self.comp_ws[ratio]
                ws_pre += wp if p else 0
                ws_all += wp + wd
        return StepShape(
            ratio=ratio,
            num_decode=d,
            prefill_rows=self.prefill_rows,
            ws_all=ws_all,
            ws_pre=ws_pre,
            keys_all=keys_pre + keys_dec,
            keys_pre=keys_pre,
            keys_dec=keys_dec,
        )


def _decode_sums_list(dec: list[int], comp: Sequence[int], topk: int | None, swa: int):
    """(sum min(s, swa), max s, {r: sum s // r}, {r: sum min(s // r, cap)}) over decode lengths."""
    ws, keys = {}, {}
    for r in comp:
        q = [s // r for s in dec]
        ws[r] = sum(q)
        cap = None if r == 128 else topk
        keys[r] = ws[r] if cap is None else sum(min(x, cap) for x in q)
    return sum(min(s, swa) for s in dec), max(dec, default=0), ws, keys


def _decode_sums_tensor(dec: torch.Tensor, d: int, comp: Sequence[int], topk, swa: int):
    """The same sums from a 1-D CPU tensor of the decode requests' lengths: a fixed number of
    numpy reductions over the tensor's memory (no copy), whatever the number of requests.
    numpy, not torch: a torch op on a small CPU tensor costs about twice a numpy one."""
    if d == 0:
        return 0, 0, dict.fromkeys(comp, 0), dict.fromkeys(comp, 0)
    a = dec.numpy()
    ws, keys = {}, {}
    for r in comp:
        q = a // r
        ws[r] = int(q.sum(dtype=np.int64))
        cap = None if r == 128 else topk
        keys[r] = ws[r] if cap is None else int(np.minimum(q, cap).sum(dtype=np.int64))
    return int(np.minimum(a, swa).sum(dtype=np.int64)), int(a.max()), ws, keys


def layer_mix(compress_ratios: Sequence[int]) -> dict:
    """``{compress ratio: layers}`` of a model (or a pipeline stage) from its per-layer
    compress ratios (``compress_ratios`` of the config, ``compression_ratios`` of the pool)."""
    mix: dict = {}
    for r in compress_ratios:
        mix[int(r)] = mix.get(int(r), 0) + 1
    return mix
