"""Our torch reference (fp32) against FlashMLA's legacy sparse kernels on the V4 584-byte layout."""

import pytest
import torch

from sglang_mixgraph.kits.decode_tail_call import DecodeTail, SchedMetaShapeError
from sglang_mixgraph.kits.synthetic_step import (
    StepSpec,
    build_step,
    plan_workspace,
    rel_l2,
    softmax_scale,
)
from sglang_mixgraph.reference.sparse_mla import (
    sparse_decode_reference,
    sparse_prefill_reference,
)
from sglang_mixgraph.reference.v4_dequant import dequantize_v4

pytestmark = [pytest.mark.gpu, pytest.mark.needs_flash_mla]
BOUND = 1e-2


def _decode_kernel():
    from flash_mla import flash_mla_with_kvcache

    return flash_mla_with_kvcache


def _decode_step(h_q, tail, topk, ratio, seed):
    gen = torch.Generator().manual_seed(seed)
    # ragged contexts: c4 lengths from 0 (SWA only) up to past the top-k width
    seqs = torch.randint(1, 4 * topk + 2000, (tail,), generator=gen).tolist()
    seqs[0] = min(seqs[0], 3)  # a row too short for any compressed entry
    swa_only = [tail // 2] if tail > 2 else []
    spec = StepSpec(
        ratio=ratio,
        seq_lens=seqs,
        extend_lens=[1] * tail,
        num_decode=tail,
        topk=topk,
        h_q=h_q,
        seed=seed,
        swa_only_rows=swa_only,
        min_swa_tokens=1 << 18,
        min_extra_tokens=1 << 18,
    )
    return build_step(spec, device="cuda", q_scale=2.0)


def _check(out, ref, lse=None, ref_lse=None):
    assert not torch.isnan(out).any()
    err = rel_l2(out.float(), ref.float())
    assert err <= BOUND, err
    if lse is not None:
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isposinf(lse), torch.isposinf(ref_lse))
        lse_err = rel_l2(lse[fin], ref_lse[fin])
        assert lse_err <= 1e-3, lse_err
    return err


CASES = [(h, t, k, 4) for h in (64, 128) for t in (1, 7, 64, 256) for k in (512, 1024)]
CASES += [(128, 7, 1024, 128), (128, 256, 1024, 128), (64, 64, 1024, 128)]


@pytest.mark.parametrize("h_q,tail,topk,ratio", CASES)
def test_decode_kernel_matches_reference(h_q, tail, topk, ratio):
    step = _decode_step(h_q, tail, topk, ratio, seed=tail * 7 + h_q + topk + ratio)
    kernel = _decode_kernel()
    lse_seen = {}

    def spy(**kw):
        out, lse = kernel(**kw)
        lse_seen["lse"] = lse
        return out, lse

    dt = DecodeTail(kernel=spy)
    rows = step.boundary.decode_rows
    args = (
        step.q[rows],
        step.swa_view,
        step.swa_indices[rows],
        step.swa_lengths[rows],
        step.attn_sink,
    )
    kw = dict(
        extra_k_cache=step.extra_view,
        extra_indices=step.extra_indices[rows],
        extra_lengths=step.extra_lengths[rows],
        softmax_scale=softmax_scale(),
    )
    out = dt.forward(ratio, *args, **kw)
    ref, ref_lse = sparse_decode_reference(
        step.q[rows],
        step.swa_view,
        step.swa_indices[rows],
        step.swa_lengths[rows],
        step.attn_sink,
        step.extra_view,
        step.extra_indices[rows],
        step.extra_lengths[rows],
        softmax_scale(),
    )
    err = _check(out, ref[:, 0], lse_seen["lse"], ref_lse)
    print(f"decode h_q={h_q} tail={tail} topk={topk} c{ratio}: rel_l2={err:.2e}")
    # the same metadata object serves the next layer of the step, bit-identically
    again = dt.forward(ratio, *args, **kw)
    assert torch.equal(again, out)
    if tail > 1:
        with pytest.raises(SchedMetaShapeError):
            dt.forward(
                ratio,
                step.q[rows][:-1],
                step.swa_view,
                step.swa_indices[rows][:-1],
                step.swa_lengths[rows][:-1],
                step.attn_sink,
                extra_k_cache=step.extra_view,
                extra_indices=step.extra_indices[rows][:-1],
                extra_lengths=step.extra_lengths[rows][:-1],
            )


def test_decode_without_sink_and_swa_only_layer():
    step = _decode_step(128, 64, 512, 4, seed=11)
    rows = step.boundary.decode_rows
    out = DecodeTail(kernel=_decode_kernel()).forward(
        0, step.q[rows], step.swa_view, step.swa_indices[rows], step.swa_lengths[rows], None
    )
    ref, _ = sparse_decode_reference(
        step.q[rows], step.swa_view, step.swa_indices[rows], step.swa_lengths[rows], None
    )
    _check(out, ref[:, 0])


def test_flash_mla_itself_refuses_a_reused_meta_with_another_batch():
    """Why SchedMetaCache exists: the kernel binds the shape on first use."""
    from flash_mla import get_mla_metadata

    step = _decode_step(128, 7, 512, 4, seed=3)
    meta = get_mla_metadata()[0]
    k = _decode_kernel()
    q = step.q.unsqueeze(1)
    k(
        q=q,
        k_cache=step.swa_view,
        block_table=None,
        cache_seqlens=None,
        head_dim_v=512,
        tile_scheduler_metadata=meta,
        is_fp8_kvcache=True,
        indices=step.swa_indices.unsqueeze(1),
        topk_length=step.swa_lengths,
        attn_sink=step.attn_sink,
        use_legacy=True,
    )
    with pytest.raises(AssertionError):
        k(
            q=q[:3],
            k_cache=step.swa_view,
            block_table=None,
            cache_seqlens=None,
            head_dim_v=512,
            tile_scheduler_metadata=meta,
            is_fp8_kvcache=True,
            indices=step.swa_indices[:3].unsqueeze(1),
            topk_length=step.swa_lengths[:3],
            attn_sink=step.attn_sink,
            use_legacy=True,
        )


@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("ratio,topk", [(4, 512), (4, 1024), (128, 1024)])
def test_sparse_prefill_kernel_matches_reference(h_q, ratio, topk):
    from flash_mla import flash_mla_sparse_fwd

    spec = StepSpec(
        ratio=ratio,
        seq_lens=[6000, 900, 3000, 50],
        extend_lens=[700, 300, 1, 1],
        num_decode=2,
        topk=topk,
        h_q=h_q,
        seed=h_q + ratio + topk,
        swa_only_rows=[5, 701],
    )
    step = build_step(spec, device="cuda", q_scale=2.0)
    b = step.boundary
    plan = plan_workspace(step, 4, b.decode_end)
    ws = torch.empty(plan.num_tokens, 1, 512, dtype=torch.bfloat16, device="cuda")
    from sglang_mixgraph.kits.synthetic_step import fill_workspace

    fill_workspace(step, plan, dequantize_v4, ws)
    rows = plan.num_rows
    out, _, lse = flash_mla_sparse_fwd(
        step.q[:rows],
        ws,
        plan.indices.unsqueeze(1),
        softmax_scale(),
        512,
        step.attn_sink,
        plan.lengths,
        use_legacy=True,
    )
    ref, _, ref_lse = sparse_prefill_reference(
        step.q[:rows],
        ws,
        plan.indices.unsqueeze(1),
        softmax_scale(),
        512,
        step.attn_sink,
        plan.lengths,
    )
    err = _check(out, ref, lse, ref_lse)
    print(f"prefill h_q={h_q} c{ratio} topk={topk}: rel_l2={err:.2e}")
