"""``sgl_kernel.weak_ref_tensor`` aliases memory without owning it (real kernel or the kit's stand-in).

Upstream's breakable CUDA graph keeps every segment's captured outputs through this function; an
alias that owned its storage would keep all of them alive through capture (one 2816-token
DeepSeek-V4-Pro bucket took 58 GB that way). Whatever ``sgl_kernel`` is importable is tested:
the real extension on a full install, the stand-in of tools/gpu-upstream on a bare GPU machine.
"""

import pytest
import torch


@pytest.fixture(scope="module")
def weak_ref():
    # Through upstream's own import of it (a test's own import of a missing module is not stubbed).
    from sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor import weak_ref_tensor

    return weak_ref_tensor


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64, torch.uint8])
def test_alias_shares_address_shape_and_values(weak_ref, dtype):
    t = (torch.arange(6 * 10, device="cuda") % 97).to(dtype).reshape(6, 10)[:, 2:7]  # strided
    w = weak_ref(t)
    assert (w.data_ptr(), w.shape, w.stride(), w.dtype) == (
        t.data_ptr(),
        t.shape,
        t.stride(),
        dtype,
    )
    assert torch.equal(w, t)
    w.fill_(3)
    assert torch.equal(t, torch.full_like(t, 3))  # writes through the alias reach the tensor


def test_alias_does_not_keep_memory_alive(weak_ref):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    t = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = weak_ref(t)
    assert torch.cuda.memory_allocated() == before + (64 << 20)
    del t
    # Only the alias is left: the allocator counts the block as free (an owning alias would not).
    assert torch.cuda.memory_allocated() == before
    assert w.numel() == 64 << 20


def test_alias_taken_during_graph_capture(weak_ref):
    # Breakable graphs take their aliases while a stream is capturing.
    x = torch.ones(1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2
        w = weak_ref(y)
        z = w + 1
    x.fill_(5)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(z, torch.full_like(x, 11))
    assert w.data_ptr() == y.data_ptr()


def test_empty_tensor(weak_ref):
    e = torch.empty(0, device="cuda")
    assert weak_ref(e).numel() == 0
