"""The step profile's kernel classes and the roofline estimate, without a GPU
(tools/rank-slice/step_classes.py, step_roofline.py)."""

from __future__ import annotations

import json
import lzma

import pytest
from tool_scripts import load

C = load("step_classes")
R = load("step_roofline")


def _frame(name, ts, dur, tid=1, cat="python_function"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1}


def _launch(corr, ts, tid=1):
    return {
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "ts": ts,
        "dur": 1,
        "tid": tid,
        "args": {"correlation": corr},
    }


def _kernel(name, corr, dur):
    return {
        "cat": "kernel",
        "name": name,
        "ts": 1000 + corr,
        "dur": dur,
        "tid": 7,
        "args": {"correlation": corr},
    }


def synthetic_trace():
    """One layer's launches: an elementwise kernel inside the mHC pre, a cuBLAS GEMM inside the
    indexer, a GEMM and FlashMLA inside attention, a torch reduction inside RMSNorm, a Triton
    kernel of the MoE; then a graph replay whose kernels carry only their names."""
    ev = [
        _frame("sglang/srt/models/deepseek_v4.py(3400): forward", 0, 1000),
        _frame("sglang/srt/models/deepseek_v4.py(3460): hc_pre", 10, 90),
        _frame("aten::mul", 20, 10, cat="cpu_op"),
        _launch(1, 25),
        _frame("nn.Module: C4Indexer_0", 100, 100),
        _frame("aten::mm", 110, 20, cat="cpu_op"),
        _launch(2, 115),
        _frame("nn.Module: DeepseekV4Attention_0", 200, 200),
        _launch(3, 210),
        _launch(4, 250),
        _frame("nn.Module: RMSNorm_0", 400, 50),
        _launch(5, 410),
        _frame("nn.Module: DeepseekV4MoE_0", 450, 100),
        _launch(6, 460),
        _launch(7, 600),  # outside every frame but the step's
        {
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "ts": 700,
            "dur": 5,
            "tid": 1,
            "args": {"correlation": 8},
        },
    ]
    ev += [
        _kernel("void at::native::elementwise_kernel<128, 4, MulFunctor>", 1, 2000),
        _kernel("nvjet_sm90_tst_128x288_64x4_2x1_v_bz_coopA_TNT", 2, 300),
        _kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 3, 500),
        _kernel("void flash::sparse_attn_fwd_kernel<...>", 4, 700),
        _kernel("void at::native::reduce_kernel<512, 1, MeanOps>", 5, 40),
        _kernel("fused_moe_kernel", 6, 60),
        _kernel("void at::native::vectorized_elementwise_kernel<4, FillFunctor>", 7, 5),
        # graph replay: names only
        _kernel("mhc_post_kernel", 8, 100),
        _kernel("tl_fp8_paged_mqa_logits_kernel", 8, 80),
        _kernel("some_unknown_kernel", 8, 3),
        {
            "cat": "gpu_user_annotation",
            "name": "step[MIXED bs=12]",
            "ts": 0,
            "dur": 99999,
            "tid": 7,
        },
    ]
    return ev


def test_kernels_are_classed_by_the_python_that_launched_them_then_by_name():
    t = C.class_table(synthetic_trace())
    ms = {c: r["ms"] for c, r in t["classes"].items()}
    assert ms == {
        "mhc": 2.1,  # the torch multiply inside hc_pre, and the replayed mhc_post kernel
        "indexer": 0.38,  # the GEMM inside the indexer, the replayed TileLang logits
        "gemm": 0.5,  # the GEMM inside attention: GEMM names beat the attention scope
        "attention": 0.7,  # FlashMLA by its name
        "norm": 0.04,
        "moe": 0.06,
        "elementwise": 0.005,
        "other": 0.003,
    }
    # The CUDA-side step annotation is not a kernel and adds nothing.
    assert t["kernels"] == 10 and t["kernel_ms"] == pytest.approx(sum(ms.values()))
    # Every launch sat inside the step's forward; that frame names no class, so the replayed
    # kernels fell to their names.
    assert t["with_frames"] == 10


def test_a_frame_that_ended_before_the_launch_does_not_class_it():
    ev = [
        _frame("nn.Module: RMSNorm_0", 0, 10),
        _launch(1, 20),
        _kernel("void at::native::reduce_kernel<512, 1, MeanOps>", 1, 10),
    ]
    assert C.class_table(ev)["classes"]["norm"]["count"] == 0
    assert C.class_table(ev)["classes"]["elementwise"]["count"] == 1


def test_the_innermost_frame_that_names_a_class_decides():
    moe_topk = [
        "nn.Module: DeepseekV4DecoderLayer_0",
        "nn.Module: DeepseekV4MoE_0",
        "sglang/srt/layers/moe/topk.py(1706): select",
    ]
    assert C.classify("topk_kernel", moe_topk) == "moe"
    index_topk = [
        "nn.Module: DeepseekV4Attention_0",
        "sglang/srt/layers/attention/dsv4/indexer.py(948): run_topk_transform",
        "sglang/kernels/ops/attention/dsv4/topk.py(209): topk_transform_paged_v2",
    ]
    assert C.classify("topk_v2_kernel", index_topk) == "indexer"
    norm_in_mhc = ["sglang/srt/models/deepseek_v4_mhc.py(481): forward", "nn.Module: RMSNorm_3"]
    assert C.classify("rmsnorm_kernel", norm_in_mhc) == "norm"
    # A compressor's GEMM: the indexer's is the indexer's, the attention's is a projection.
    assert (
        C.classify("nvjet_sm90_x", ["nn.Module: C4Indexer_0", "nn.Module: Compressor_1"])
        == "indexer"
    )
    assert (
        C.classify("nvjet_sm90_x", ["nn.Module: DeepseekV4Attention_0", "nn.Module: Compressor_0"])
        == "gemm"
    )


def test_the_command_reads_compressed_traces_and_says_one_line_for_a_bad_file(tmp_path, capsys):
    path = tmp_path / "trace.json.xz"
    with lzma.open(path, "wt") as f:
        json.dump({"traceEvents": synthetic_trace()}, f)
    assert C.main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["classes"]["mhc"]["ms"] == 2.1
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert C.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("step_classes: cannot read") and err.count("\n") == 1


def _config(layers=61):
    msm = load("make_slice_model")
    return msm.build_config(msm.load_pro_config(), layers)


def test_roofline_gemm_time_is_the_projections_flops_at_the_bf16_rate():
    cfg = _config()
    est = R.estimate(cfg, prefill=2560, decode=256, context=2048, fp8=False)
    h, ql, nh, hd = (
        cfg["hidden_size"],
        cfg["q_lora_rank"],
        cfg["num_attention_heads"],
        cfg["head_dim"],
    )
    og, ol = cfg["o_groups"], cfg["o_lora_rank"]
    rows, layers = 2816, 61
    n4 = cfg["compress_ratios"].count(4)
    n128 = cfg["compress_ratios"].count(128)
    per_row = h * ql + h * hd + ql * nh * hd + nh * hd * ol + og * ol * h
    flops = 2 * rows * (layers * per_row + n4 * h * 4 * hd + n128 * h * 2 * hd)
    assert est["classes"]["gemm"]["gflop"] == pytest.approx(flops / 1e9, rel=1e-6)
    # Compute-bound at this row count: the time is the FLOPs at the bf16 ceiling.
    assert est["classes"]["gemm"]["ms"] == pytest.approx(flops / R.PEAK_BF16 * 1e3, rel=1e-3)


def test_roofline_fp8_halves_the_gemm_time_and_context_grows_attention_and_indexer():
    cfg = _config()
    bf16 = R.estimate(cfg, 2560, 256, 2048, fp8=False)["classes"]
    fp8 = R.estimate(cfg, 2560, 256, 2048, fp8=True)["classes"]
    long = R.estimate(cfg, 2560, 256, 8192, fp8=False)["classes"]
    assert fp8["gemm"]["ms"] == pytest.approx(bf16["gemm"]["ms"] / 2, rel=0.02)
    assert long["attention"]["ms"] > bf16["attention"]["ms"]
    assert long["indexer"]["ops"]["indexer logits"] > 3 * bf16["indexer"]["ops"]["indexer logits"]
    # mHC and norms move bytes only: bandwidth-bound, and independent of the context.
    assert long["mhc"]["ms"] == bf16["mhc"]["ms"] and long["norm"]["ms"] == bf16["norm"]["ms"]


def test_roofline_scales_with_layers_read_from_the_config():
    full = R.estimate(_config(61), 2560, 256, 2048, False)
    four = R.estimate(_config(4), 2560, 256, 2048, False)
    assert four["classes"]["mhc"]["ms"] == pytest.approx(
        full["classes"]["mhc"]["ms"] * 4 / 61, rel=1e-3
    )
    assert four["classes"]["indexer"]["ms"] == pytest.approx(
        full["classes"]["indexer"]["ms"] / 30, abs=1e-3
    )


def test_roofline_command_refuses_negative_shapes_and_missing_files(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        R.main([str(tmp_path / "c.json"), "--decode", "-1"])
    assert e.value.code == 2
    assert R.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
