"""Kernel classes of a profiled step (core/kernel_classes.py): by the Python that launched a
kernel, then by its name; the workspace dequantization as a class of its own; reading gzip and
xz traces and bare event lists."""

from __future__ import annotations

import gzip
import json

import pytest

from sglang_mixgraph.core import kernel_classes as K
from sglang_mixgraph.kits.profiler_trace import TraceBuilder


def synthetic_trace() -> list:
    """One layer's launches: an elementwise kernel inside the mHC pre, a cuBLAS GEMM inside the
    indexer, a GEMM and FlashMLA inside attention, the workspace dequant, a torch reduction
    inside RMSNorm, a Triton kernel of the MoE; then a graph replay whose kernels carry only
    their names."""
    b = TraceBuilder()
    b.annotation("step[MIXED bs=12]", 0, 99999, gpu_span=(0, 99999))
    b.frame("sglang/srt/models/deepseek_v4.py(3400): forward", 0, 1000)
    b.frame("sglang/srt/models/deepseek_v4.py(3460): hc_pre", 10, 90)
    b.cpu("cpu_op", "aten::mul", 20, 10)
    b.launch(25, [("void at::native::elementwise_kernel<128, 4, MulFunctor>", 1001, 2000)])
    b.frame("nn.Module: C4Indexer_0", 100, 100)
    b.cpu("cpu_op", "aten::mm", 110, 20)
    b.launch(115, [("nvjet_sm90_tst_128x288_64x4_2x1_v_bz_coopA_TNT", 1002, 300)])
    b.frame("nn.Module: DeepseekV4Attention_0", 200, 200)
    b.launch(210, [("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 1003, 500)])
    b.launch(250, [("void flash::sparse_attn_fwd_kernel<...>", 1004, 700)])
    b.frame("sglang/kernels/ops/attention/dsv4/dequant_k_cache.py(27): dequantize_k_cache", 260, 20)
    b.launch(265, [("_dequantize_k_cache_paged_kernel", 1005, 90)], call="cuLaunchKernel")
    b.frame("nn.Module: RMSNorm_0", 400, 50)
    b.launch(410, [("void at::native::reduce_kernel<512, 1, MeanOps>", 1006, 40)])
    b.frame("nn.Module: DeepseekV4MoE_0", 450, 100)
    b.launch(460, [("fused_moe_kernel", 1007, 60)])
    b.launch(600, [("void at::native::vectorized_elementwise_kernel<4, FillFunctor>", 1008, 5)])
    graph = [("mhc_post_kernel", 1100, 100), ("tl_fp8_paged_mqa_logits_kernel", 1200, 80)]
    graph += [("some_unknown_kernel", 1300, 3)]
    b.launch(700, graph, call="cudaGraphLaunch", dur=5)
    return b.document()["traceEvents"]


def test_kernels_are_classed_by_the_python_that_launched_them_then_by_name():
    t = K.class_table(synthetic_trace())
    ms = {c: r["ms"] for c, r in t["classes"].items()}
    assert ms == {
        "mhc": 2.1,  # the torch multiply inside hc_pre, and the replayed mhc_post kernel
        "indexer": 0.38,  # the GEMM inside the indexer, the replayed TileLang logits
        "gemm": 0.5,  # the GEMM inside attention: GEMM names beat the attention scope
        "attention": 0.7,  # FlashMLA by its name
        "dequant": 0.09,  # the workspace dequant, inside attention, a class of its own
        "norm": 0.04,
        "moe": 0.06,
        "elementwise": 0.005,
        "other": 0.003,
    }
    # The CUDA-side step annotation is not a kernel and adds nothing.
    assert t["kernels"] == 11 and t["kernel_ms"] == pytest.approx(sum(ms.values()))
    # The 2000 us elementwise kernel from 1001 us spans every other kernel's time: the GPU's
    # busy time counts that overlap once.
    assert t["busy_ms"] == pytest.approx(2.0)
    # Every launch sat inside the step's forward; that frame names no class, so the replayed
    # kernels fell to their names.
    assert t["with_frames"] == 11


def test_a_frame_that_ended_before_the_launch_does_not_class_it():
    b = TraceBuilder()
    b.frame("nn.Module: RMSNorm_0", 0, 10)
    b.launch(20, [("void at::native::reduce_kernel<512, 1, MeanOps>", 30, 10)])
    ev = b.document()["traceEvents"]
    assert K.class_table(ev)["classes"]["norm"]["count"] == 0
    assert K.class_table(ev)["classes"]["elementwise"]["count"] == 1


def test_the_innermost_frame_that_names_a_class_decides():
    moe_topk = [
        "nn.Module: DeepseekV4DecoderLayer_0",
        "nn.Module: DeepseekV4MoE_0",
        "sglang/srt/layers/moe/topk.py(1706): select",
    ]
    assert K.classify("topk_kernel", moe_topk) == "moe"
    index_topk = [
        "nn.Module: DeepseekV4Attention_0",
        "sglang/srt/layers/attention/dsv4/indexer.py(948): run_topk_transform",
        "sglang/kernels/ops/attention/dsv4/topk.py(209): topk_transform_paged_v2",
    ]
    assert K.classify("topk_v2_kernel", index_topk) == "indexer"
    norm_in_mhc = ["sglang/srt/models/deepseek_v4_mhc.py(481): forward", "nn.Module: RMSNorm_3"]
    assert K.classify("rmsnorm_kernel", norm_in_mhc) == "norm"
    # A compressor's GEMM: the indexer's is the indexer's, the attention's is a projection.
    assert (
        K.classify("nvjet_sm90_x", ["nn.Module: C4Indexer_0", "nn.Module: Compressor_1"])
        == "indexer"
    )
    assert (
        K.classify("nvjet_sm90_x", ["nn.Module: DeepseekV4Attention_0", "nn.Module: Compressor_0"])
        == "gemm"
    )


@pytest.mark.parametrize(
    "kernel, frames, cls",
    [
        # DeepSeek-V4's workspace: its Triton kernel and the SM90 Q8KV8 gather, by name alone
        ("_dequantize_k_cache_paged_kernel", [], "dequant"),
        ("_gather_dequant_requant_fp8_paged_kernel", [], "dequant"),
        # GLM-5's (DSA) workspace kernel
        ("_dequantize_k_cache_fast_kernel", [], "dequant"),
        # a torch fallback inside the dequant function: by its frame
        (
            "void at::native::elementwise_kernel<128, 4, MulFunctor>",
            ["sglang/kernels/ops/attention/dsa/dequant_k_cache.py(144): dequantize_k_cache_paged"],
            "dequant",
        ),
        # weight dequantization is not the workspace's: it keeps its scope
        ("per_token_group_dequant_fp8", ["nn.Module: DeepseekV4MoE_0"], "moe"),
    ],
)
def test_the_workspace_dequant_is_its_own_class_and_only_it(kernel, frames, cls):
    assert K.classify(kernel, frames) == cls


def test_traces_are_read_plain_gzip_xz_or_as_a_bare_event_list(tmp_path):
    events = synthetic_trace()
    b = TraceBuilder(gpu="B200")
    b.events = events
    gz = b.write(tmp_path / "t.trace.json.gz")
    doc = K.read_trace(str(gz))
    assert doc["deviceProperties"][0]["computeMajor"] == 10
    assert K.load_trace(str(gz))[-len(events) :] == events
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    assert K.read_trace(str(bare)) == {"traceEvents": events}
    not_a_trace = tmp_path / "x.json.gz"
    with gzip.open(not_a_trace, "wt") as f:
        json.dump({"rows": []}, f)
    with pytest.raises(ValueError, match="traceEvents"):
        K.read_trace(str(not_a_trace))
