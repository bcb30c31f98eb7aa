"""Upstream's real metadata builder equals the CPU kit's torch metadata, which the CPU tests of
the mixed split rely on (``sglang_mixgraph.kits.dsv4_cpu.World.build_metadata``)."""

import pytest
import torch

from sglang_mixgraph.kits import dsv4_cpu as K
from sglang_mixgraph.kits import dsv4_gpu as G


def _extend():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.EXTEND


STEPS = {
    "mixed": K.Step(prefill=[(300, 29), (0, 7)], decode=[255, 256, 129, 0, 700], seed=1),
    "mixed_page_edges": K.Step(prefill=[(255, 2), (510, 3)], decode=[127, 128, 511, 1000], seed=2),
    "extend": K.Step(prefill=[(0, 40), (130, 17), (900, 5)], decode=[], seed=3),
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_metadata_mixed_and_extend(sglang_cuda, name):
    world = G.GpuWorld(STEPS[name])
    fb = world.forward_batch(mode=None if world.step.decode else _extend(), num_decode_attr=None)
    real = world.upstream_metadata(fb)
    torch.cuda.synchronize()
    assert G.compare_metadata(real, world.standin_core(fb), world.step.num_rows) == []


@pytest.mark.parametrize("relabelled", [False, True], ids=["decode", "dp_relabelled_extend"])
def test_metadata_decode(sglang_cuda, relabelled):
    world = G.GpuWorld(K.Step(prefill=[], decode=[0, 5, 127, 128, 300, 1000], seed=4))
    fb = world.decode_batch(relabelled=relabelled)
    real = world.upstream_metadata(fb)
    torch.cuda.synchronize()
    assert G.compare_metadata(real, world.standin_core(fb), world.step.num_rows) == []


def test_seeded_random_steps(sglang_cuda):
    """Random MIXED steps, seeded: ragged prefixes and extends, contexts up to the pool's width."""
    g = torch.Generator().manual_seed(20261130)
    for i in range(6):
        n_pre = int(torch.randint(0, 3, (1,), generator=g))
        n_dec = int(torch.randint(1 if n_pre == 0 else 0, 6, (1,), generator=g))
        pre = [
            (
                int(torch.randint(0, 900, (1,), generator=g)),
                int(torch.randint(1, 60, (1,), generator=g)),
            )
            for _ in range(n_pre)
        ]
        dec = [int(torch.randint(0, 1000, (1,), generator=g)) for _ in range(n_dec)]
        world = G.GpuWorld(K.Step(prefill=pre, decode=dec, seed=100 + i))
        fb = world.forward_batch(mode=None if dec else _extend(), num_decode_attr=None)
        real = world.upstream_metadata(fb)
        torch.cuda.synchronize()
        assert G.compare_metadata(real, world.standin_core(fb), world.step.num_rows) == [], (
            pre,
            dec,
        )


def test_upstream_c4_topk_selects_visible_entries_in_the_kit_layout(sglang_cuda):
    """Upstream's own top-k and page mapping (the indexer's torch path) pick, for every row,
    min(visible, top-k) distinct compressed entries of that row's request, at the cache slots
    the CPU kit's layout gives them."""
    step = K.Step(prefill=[(300, 29), (0, 7)], decode=[255, 1000, 600, 2], seed=6)
    world = G.GpuWorld(step)
    core = world.upstream_metadata(world.forward_batch(num_decode_attr=None))
    page = core.c4_sparse_page_indices.cpu()
    t = 0
    for r, (seq, ext) in enumerate(zip(step.seq_lens, step.extend_lens, strict=False)):
        for pos in range(seq - ext, seq):
            n4 = (pos + 1) // 4
            got = page[t][page[t] >= 0].tolist()
            assert len(got) == len(set(got)) == min(n4, K.TOPK), (r, pos)
            visible = set(world.compressed_slots(r, torch.arange(n4), 4).tolist())
            assert set(got) <= visible, (r, pos)
            t += 1
