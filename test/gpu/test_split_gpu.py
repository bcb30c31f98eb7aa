"""Split against unsplit with the real kernels at DSV4-Pro shapes (h_q 128, dim 512, SWA 128;
CSA c4 top-1024 and HCA c128): unsplit = our dequant into a bf16 workspace over every row +
flash_mla_sparse_fwd; split = the same over the prefill requests only + FlashMLA fp8 decode
for the decode rows."""

import pytest
import torch

from sglang_mixgraph.kits.decode_tail_call import DecodeTail
from sglang_mixgraph.kits.synthetic_step import (
    StepSpec,
    build_step,
    plan_split_prefill,
    plan_workspace,
    rel_l2,
    softmax_scale,
    split_attention,
    unsplit_attention,
)
from sglang_mixgraph.reference.sparse_mla import sparse_decode_reference
from sglang_mixgraph.reference.v4_dequant import dequantize_v4

pytestmark = [pytest.mark.gpu, pytest.mark.needs_flash_mla]
BOUND = 1e-2


def _kernels():
    from flash_mla import flash_mla_sparse_fwd, flash_mla_with_kvcache

    def sparse_fwd(q, kv, idx, scale, d_v, sink, lens):
        return flash_mla_sparse_fwd(
            q, kv, idx, scale, d_v, sink, lens, use_legacy=True, return_log2_lse=True
        )

    return sparse_fwd, flash_mla_with_kvcache


BATCHES = {
    # (seq_lens, extend_lens, num_decode, padding)
    "uniform_8k": ([8192] + [8192] * 64, [1792] + [1] * 64, 64, 0),
    "ragged_padded": (
        [700, 5000, 129, 30000, 3000, 1, 260, 8200, 128],
        [700, 333, 129, 1, 1, 1, 1, 1, 1],
        6,
        5,
    ),
    "decode_only": ([300 * i + 1 for i in range(1, 41)], [1] * 40, 40, 3),
}


@pytest.mark.parametrize("join", ["copy", "cat"])
@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("name", list(BATCHES))
def test_split_equals_unsplit_real_kernels(ratio, name, join):
    seqs, exts, d, pad = BATCHES[name]
    spec = StepSpec(
        ratio=ratio,
        seq_lens=seqs,
        extend_lens=exts,
        num_decode=d,
        topk=1024,
        h_q=128,
        num_padding=pad,
        seed=len(seqs) + ratio,
        min_swa_tokens=1 << 20,
        min_extra_tokens=1 << 20,
    )
    step = build_step(spec, device="cuda", q_scale=2.0)
    b = step.boundary
    sparse_fwd, decode = _kernels()
    plan_all = plan_workspace(step, len(seqs), b.decode_end)
    plan_pre = plan_split_prefill(step, join)
    unsplit = unsplit_attention(step, plan_all, dequantize_v4, sparse_fwd)
    split = split_attention(step, plan_pre, dequantize_v4, sparse_fwd, DecodeTail(kernel=decode))
    torch.cuda.synchronize()
    assert split.shape == unsplit.shape == (b.num_rows, 128, 512)
    assert not torch.isnan(split).any() and not torch.isnan(unsplit).any()
    err = rel_l2(split[: b.decode_end].float(), unsplit[: b.decode_end].float())
    print(
        f"split({join}) vs unsplit {name} c{ratio}: rel_l2={err:.2e} rows={b.num_rows} b0={b.b0} D={d}"
    )
    assert err <= BOUND
    assert (split[b.padding_rows] == 0).all()
    # the prefill rows are the same kernel on the same keys: identical up to workspace placement
    if b.b0:
        assert rel_l2(split[: b.b0].float(), unsplit[: b.b0].float()) <= BOUND
    # and the decode rows agree with the fp32 reference
    rows = b.decode_rows
    ref, _ = sparse_decode_reference(
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
    assert rel_l2(split[rows].float(), ref[:, 0]) <= BOUND
    if plan_pre is not None:
        assert plan_pre.num_tokens < plan_all.num_tokens


def test_sparse_prefill_rows_without_keys_are_zero():
    """The copy-join relies on it: rows with topk_length 0 (or only -1 indices) come out as 0."""
    from flash_mla import flash_mla_sparse_fwd

    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(5000, 1, 512, device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn(300, 128, 512, device="cuda", generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, 5000, (300, 1, 640), device="cuda", generator=gen).to(torch.int32)
    lens = torch.full((300,), 640, dtype=torch.int32, device="cuda")
    lens[100:200] = 0
    idx[200:250] = -1
    sink = torch.randn(128, device="cuda", generator=gen)
    out, _, lse = flash_mla_sparse_fwd(q, kv, idx, 512**-0.5, 512, sink, lens, use_legacy=True)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert (out[100:250] == 0).all()
    assert torch.isposinf(lse[100:250]).all()
    ref, _, _ = flash_mla_sparse_fwd(
        q[:100], kv, idx[:100], 512**-0.5, 512, sink, lens[:100], use_legacy=True
    )
    assert rel_l2(out[:100].float(), ref.float()) < 1e-6
