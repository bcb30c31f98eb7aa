"""The step profile's command and the roofline estimate, without a GPU
(tools/rank-slice/step_classes.py, step_roofline.py; the classes themselves are tested in
test/core/test_kernel_classes.py)."""

from __future__ import annotations

import json
import lzma

import pytest
from tool_scripts import load

from sglang_mixgraph.kits.profiler_trace import TraceBuilder

C = load("step_classes")
R = load("step_roofline")


def test_the_command_reads_compressed_traces_and_says_one_line_for_a_bad_file(tmp_path, capsys):
    b = TraceBuilder()
    b.frame("nn.Module: C4Indexer_0", 0, 100)
    b.launch(10, [("nvjet_sm90_tst_128x288_64x4_2x1_v_bz_coopA_TNT", 50, 2100)])
    path = tmp_path / "trace.json.xz"
    with lzma.open(path, "wt") as f:
        json.dump(b.document(), f)
    assert C.main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["classes"]["indexer"]["ms"] == 2.1
    assert C.main([str(path)]) == 0
    assert "| indexer | 2.10 | 100.0% | 1 |" in capsys.readouterr().out
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
