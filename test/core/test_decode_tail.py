import pytest
import torch

from sglang_mixgraph.core.decode_tail import run_tail, tail_inputs
from sglang_mixgraph.kits.decode_tail_call import (
    DecodeTail,
    SchedMetaCache,
    SchedMetaShapeError,
    run_decode_tail,
)
from sglang_mixgraph.reference import v4_kv_layout as kvl
from sglang_mixgraph.reference.sparse_mla import (
    ReferenceSchedMeta,
    flash_mla_with_kvcache_reference,
    sparse_decode_reference,
)


def test_one_meta_per_ratio_reused_for_same_shape():
    made = []

    def factory():
        made.append(object())
        return made[-1]

    cache = SchedMetaCache(factory)
    m4 = cache.get(4, batch=7, topk=128, extra_topk=1024)
    assert cache.get(4, batch=7, topk=128, extra_topk=1024) is m4  # next layer, same step
    m128 = cache.get(128, batch=7, topk=128, extra_topk=64)
    assert m128 is not m4 and len(made) == 2 and len(cache) == 2
    assert cache.bound_shape(4).batch == 7


@pytest.mark.parametrize(
    "change",
    [
        dict(batch=8),
        dict(topk=64),
        dict(extra_topk=512),
        dict(extra_topk=None),
        dict(h_q=64),
    ],
)
def test_meta_refuses_other_shapes(change):
    cache = SchedMetaCache(object)
    args = dict(batch=7, topk=128, extra_topk=1024, h_q=128)
    cache.get(4, **args)
    with pytest.raises(SchedMetaShapeError):
        cache.get(4, **{**args, **change})
    cache.reset()  # a new step may bind a new shape
    assert cache.get(4, **{**args, **change}) is not None


def _setup(d=5, h=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    swa = kvl.allocate_cache(4, 64)
    kvl.encode_tokens(swa, 64, torch.arange(256), torch.randn(256, 512, generator=gen))
    extra = kvl.allocate_cache(40, 2)
    kvl.encode_tokens(extra, 2, torch.arange(80), torch.randn(80, 512, generator=gen))
    q = torch.randn(d, h, 512, generator=gen).to(torch.bfloat16)
    si = torch.randint(0, 256, (d, 128), generator=gen).to(torch.int32)
    sl = torch.randint(1, 129, (d,), generator=gen).to(torch.int32)
    ei = torch.randint(-1, 80, (d, 64), generator=gen).to(torch.int32)
    el = torch.randint(1, 65, (d,), generator=gen).to(torch.int32)
    sink = torch.randn(h, generator=gen)
    return kvl.kernel_view(swa, 64), kvl.kernel_view(extra, 2), q, si, sl, ei, el, sink


def test_decode_tail_reuses_meta_across_layers_and_matches_reference():
    swa, extra, q, si, sl, ei, el, sink = _setup()
    calls = []

    def kernel(**kw):
        calls.append(kw["tile_scheduler_metadata"])
        return flash_mla_with_kvcache_reference(**kw)

    tail = DecodeTail(kernel=kernel, meta_factory=ReferenceSchedMeta)
    outs = [
        tail.forward(
            4, q, swa, si, sl, sink, extra_k_cache=extra, extra_indices=ei, extra_lengths=el
        )
        for _layer in range(3)
    ]
    assert calls[0] is calls[1] is calls[2]
    ref, _ = sparse_decode_reference(q, swa, si, sl, sink, extra, ei, el)
    for o in outs:
        assert o.shape == (5, 4, 512)
        torch.testing.assert_close(o, ref[:, 0].to(torch.bfloat16), rtol=0, atol=0)
    # an SWA-only layer kind gets its own object
    tail.forward(0, q, swa, si, sl, sink)
    assert calls[3] is not calls[0]

    # a different tail size in the same step is refused before it reaches the kernel
    def three_rows():
        return tail.forward(
            4,
            q[:3],
            swa,
            si[:3],
            sl[:3],
            sink,
            extra_k_cache=extra,
            extra_indices=ei[:3],
            extra_lengths=el[:3],
        )

    with pytest.raises(SchedMetaShapeError):
        three_rows()
    tail.new_step()
    three_rows()


def test_decode_tail_input_checks():
    swa, extra, q, si, sl, ei, el, sink = _setup()
    meta = ReferenceSchedMeta()
    k = flash_mla_with_kvcache_reference
    with pytest.raises(ValueError):  # width not a multiple of 64
        run_decode_tail(q, swa, si[:, :100], sl, sink, meta, kernel=k)
    with pytest.raises(TypeError):
        run_decode_tail(q, swa, si.long(), sl, sink, meta, kernel=k)
    with pytest.raises(ValueError):  # extra cache without indices
        run_decode_tail(q, swa, si, sl, sink, meta, extra_k_cache=extra, kernel=k)
    with pytest.raises(ValueError):  # metadata rows != decode rows
        run_decode_tail(q, swa, si[:4], sl, sink, meta, kernel=k)
    empty = run_decode_tail(q[:0], swa, si[:0], sl[:0], sink, meta, kernel=k)
    assert empty.shape == (0, 4, 512) and not meta.have_initialized


# ---- the plan's per-ratio inputs (tail_inputs / run_tail) -----------------------------------


def _step_metadata(b0=3, d=5, pad=2, seed=1):
    """Per-row metadata of a step: ``b0`` prefill rows, the ``d`` decode rows of ``_setup`` and
    ``pad`` padding rows, as the step's tensors hold them."""
    swa, extra, q, si, sl, ei, el, sink = _setup(d=d, seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)

    def around(t, fill):
        before = torch.full((b0, *t.shape[1:]), fill, dtype=t.dtype)
        after = torch.full((pad, *t.shape[1:]), fill, dtype=t.dtype)
        return torch.cat([before, t, after])

    q_all = torch.randn(b0 + d + pad, 1, 4, 512, generator=gen).to(torch.bfloat16)
    q_all[b0 : b0 + d, 0] = q
    return swa, extra, q, q_all, around(si, -1), around(sl, 1), around(ei, -1), around(el, 1), sink


def test_tail_inputs_are_views_of_the_tail_rows_and_run_tail_matches_the_per_call_path():
    b0, d = 3, 5
    swa, extra, q, q_all, si, sl, ei, el, sink = _step_metadata(b0, d)
    meta = ReferenceSchedMeta()
    got = []

    def kernel(**kw):
        got.append(kw)
        return flash_mla_with_kvcache_reference(**kw)

    inputs = tail_inputs(4, b0, d, si, sl, ei, el, sched_meta=meta, softmax_scale=0.04)
    assert inputs.sched_meta is meta and inputs.built_from(si, sl, ei, el)
    assert not inputs.built_from(si.clone(), sl, ei, el)
    kw = inputs.kernel_kwargs
    assert kw["indices"].shape == (d, 1, 128) and kw["indices"].data_ptr() == si[b0].data_ptr()
    assert kw["extra_indices_in_kvcache"].data_ptr() == ei[b0].data_ptr()
    out = run_tail(inputs, q_all.narrow(0, b0, d), swa, sink, extra, kernel)
    ref = run_decode_tail(
        q,
        swa,
        si[b0 : b0 + d],
        sl[b0 : b0 + d],
        sink,
        ReferenceSchedMeta(),
        extra_k_cache=extra,
        extra_indices=ei[b0 : b0 + d],
        extra_lengths=el[b0 : b0 + d],
        softmax_scale=0.04,
        kernel=flash_mla_with_kvcache_reference,
    )
    assert torch.equal(out.squeeze(1), ref)
    # a write into the step's tensor (the indexer's per-layer top-k) reaches the next call
    ei[b0 : b0 + d] = -1
    run_tail(inputs, q_all.narrow(0, b0, d), swa, sink, extra, kernel)
    assert (got[-1]["extra_indices_in_kvcache"] == -1).all()
    assert got[0]["tile_scheduler_metadata"] is got[1]["tile_scheduler_metadata"] is meta


def test_tail_inputs_check_once_what_the_kernel_needs():
    b0, d = 3, 5
    swa, extra, q, q_all, si, sl, ei, el, sink = _step_metadata(b0, d)
    m = ReferenceSchedMeta()
    with pytest.raises(ValueError):  # width not a multiple of 64
        tail_inputs(0, b0, d, si[:, :100], sl, sched_meta=m)
    with pytest.raises(TypeError):
        tail_inputs(0, b0, d, si.long(), sl, sched_meta=m)
    with pytest.raises(ValueError):  # a compressed ratio without its indices
        tail_inputs(4, b0, d, si, sl, sched_meta=m)
    with pytest.raises(ValueError):  # SWA-only with extra indices
        tail_inputs(0, b0, d, si, sl, ei, el, sched_meta=m)
    with pytest.raises(IndexError):  # metadata rows do not cover the tail
        tail_inputs(0, b0, d + 20, si, sl, sched_meta=m)
    swa_only = tail_inputs(0, b0, d, si, sl, sched_meta=m)
    assert swa_only.kernel_kwargs["extra_indices_in_kvcache"] is None
    assert swa_only.num_rows == d and swa_only.ratio == 0
