"""tools/rank-slice/standin_costs.py without a GPU: the step plan (shapes and calls per step of
each stand-in) against the slice's config, the MIXED step's rows, and the clean skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tool_scripts import load

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "rank-slice" / "standin_costs.py"
MAKE_MODEL = ROOT / "tools" / "rank-slice" / "make_slice_model.py"


SC = load("standin_costs")
MSM = load("make_slice_model")


def _slice_config(layers=None):
    return MSM.build_config(MSM.load_pro_config(), layers)


def _by_key(plan):
    return {row["key"]: row for row in plan}


def test_layer_kinds_are_counted_from_the_config_compress_ratios():
    config = _slice_config()
    ratios = config["compress_ratios"]
    kinds = SC.layer_kinds(config)
    assert kinds == {
        "c0": ratios.count(0),
        "c4": ratios.count(4),
        "c128": ratios.count(128),
        "all": config["num_hidden_layers"],
    }
    # the slice the results page describes: 2 sliding-window, 30 c4, 29 c128
    assert (kinds["c0"], kinds["c4"], kinds["c128"], kinds["all"]) == (2, 30, 29, 61)
    assert SC.layer_kinds(_slice_config(4)) == {"c0": 2, "c4": 1, "c128": 1, "all": 4}


def test_calls_per_step_follow_the_layer_kinds():
    for layers in (None, 4, 9):
        config = _slice_config(layers)
        kinds = SC.layer_kinds(config)
        plan = _by_key(SC.step_plan(config))
        # one indexer logits and one top-k per c4 layer, at each width
        for w in (SC.LIVE_WIDTH, SC.WIDE):
            assert plan[f"indexer_logits_w{w}"]["calls"] == kinds["c4"]
            assert plan[f"topk_w{w}"]["calls"] == kinds["c4"]
            assert plan["gemm_indexer.wq_b"]["calls"] == kinds["c4"]
        # two hyper-connections per layer (attention and MoE), each a pre and a post
        assert plan["hc_pre"]["calls"] == plan["hc_post"]["calls"] == 2 * kinds["all"]
        assert plan["hc_split_sinkhorn"]["part_of"] == "hc_pre"
        h = config["hidden_size"]
        assert plan[f"rmsnorm_{h}"]["calls"] == 2 * kinds["all"] + 1  # + the final norm
        assert plan[f"rmsnorm_{config['q_lora_rank']}"]["calls"] == kinds["all"]
        for key in ("moe_sum_reduce", "moe_align_block_size", "gemm_wq_a", "gemm_wo_b"):
            assert plan[key]["calls"] == kinds["all"]


def test_shapes_are_the_slice_config_at_the_mixed_step():
    config = _slice_config()
    plan = _by_key(SC.step_plan(config))
    rows = SC.CHUNK
    assert rows == 2816
    live = plan[f"indexer_logits_w{SC.LIVE_WIDTH}"]
    assert live["dims"] == dict(
        rows=rows,
        heads=config["index_n_heads"],
        head_dim=config["index_head_dim"],
        pages=-(-SC.LIVE_WIDTH // SC.PAGE),
        width=SC.LIVE_WIDTH,
    )
    wide = plan[f"indexer_logits_w{SC.WIDE}"]
    assert wide["dims"]["pages"] == SC.WIDE // SC.PAGE == 32
    assert f"{32 * SC.C4_PAGE} compressed columns" in wide["shape"]
    assert plan[f"topk_w{SC.WIDE}"]["dims"]["topk"] == config["index_topk"]
    assert plan["hc_pre"]["dims"] == dict(rows=rows, hc=config["hc_mult"], hidden=7168)
    assert f"[{(2 + 4) * 4}, {4 * 7168}]" in plan["hc_pre"]["shape"]
    assert plan["gemm_wq_b"]["dims"] == dict(rows=rows, n_in=1536, n_out=128 * 512)
    assert plan["moe_align_block_size"]["dims"]["experts"] == config["n_routed_experts"]
    assert plan["moe_sum_reduce"]["dims"]["topk"] == config["num_experts_per_tok"]
    # every row names what a full install runs instead, and a module to look for
    for row in plan.values():
        assert row["full"] and row["full_module"] and row["standin"]


def test_the_mixed_step_rows():
    ctx = SC.row_contexts()
    assert len(ctx) == SC.CHUNK
    prefill = ctx[: SC.CHUNK - SC.DECODE_ROWS]
    decode = ctx[SC.CHUNK - SC.DECODE_ROWS :]
    # the chunk finishes one prompt and starts the next, causally
    assert {r for _, r in prefill} == {0, 1}
    assert max(c for c, _ in prefill) == SC.PROMPT and min(c for c, _ in prefill) == 1
    # decode rows: one request each, contexts inside the live width
    assert len({r for _, r in decode}) == SC.DECODE_ROWS
    assert all(SC.PROMPT < c <= SC.LIVE_WIDTH for c, _ in decode)
    assert max(c for c, _ in ctx) <= SC.LIVE_WIDTH


def test_totals_add_each_width_once_and_skip_rows_inside_others():
    rows = [
        dict(key="a", width=2304, ms_per_step=10.0),
        dict(key="b", width=8192, ms_per_step=40.0),
        dict(key="c", ms_per_step=5.0),
        dict(key="d", ms_per_step=3.0, part_of="c"),
        dict(key="e", error="x"),
    ]
    assert SC.totals(rows, (2304, 8192)) == {"2304": 15.0, "8192": 45.0}


def test_the_plan_imports_neither_torch_nor_sglang():
    code = (
        "import importlib.util, sys, json\n"
        "def load(name, path):\n"
        "    s = importlib.util.spec_from_file_location(name, path)\n"
        "    m = importlib.util.module_from_spec(s); s.loader.exec_module(m); return m\n"
        f"m, msm = load('sc', {str(SCRIPT)!r}), load('msm', {str(MAKE_MODEL)!r})\n"
        "c = msm.build_config(msm.load_pro_config())\n"
        "m.step_plan(c); m.row_contexts()\n"
        "print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in "
        "('torch', 'sglang', 'sgl_kernel'))))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == []


def test_without_a_gpu_it_skips_with_one_line_and_writes_nothing(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("standin_costs: ")
        and "nothing measured" in lines[0]
    )
    assert not (tmp_path / "out").exists()


def test_the_table_says_what_was_timed_and_what_a_full_install_would_run():
    plan = _by_key(SC.step_plan(_slice_config()))
    logits = dict(plan[f"indexer_logits_w{SC.LIVE_WIDTH}"], ms_per_call=1.5, ms_per_step=45.0)
    logits["full_on_machine"] = False
    sinkhorn = dict(plan["hc_split_sinkhorn"], ms_per_call=0.1, ms_per_step=12.2)
    sinkhorn["full_on_machine"] = False
    topk = dict(plan[f"topk_w{SC.LIVE_WIDTH}"], ms_per_call=2.0, ms_per_step=60.0)
    topk.update(full_on_machine=True, full_ms_per_call=0.05, full_ms_per_step=1.5)
    broken = dict(plan["hc_post"], error="RuntimeError: a | b\nc", full_on_machine=False)
    moe = dict(plan["triton_moe"], full_on_machine=False)
    rows = [logits, sinkhorn, topk, broken, moe]
    for r in rows:
        r.pop("dims")
    meta = dict(rows=2816, device="GPU", iters=10, warmup=3, totals=SC.totals(rows, (2304,)))
    table = SC.markdown(rows, meta)
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(body) == 1 + len(rows)  # header + one line per row
    assert all(line.count(" | ") == 5 for line in body)  # an error's "|" cannot add a column
    assert "deep_gemm.fp8_paged_mqa_logits (not on this machine)" in body[1]
    assert "12.2 (in hc_pre)" in body[2]
    assert "0.050 ms/call, 1.5 ms/step" in body[3]
    assert "RuntimeError: a / b c" in body[4]
    assert "not timed" in body[5]
    # the sinkhorn is inside hc_pre: not added twice
    assert "width 2304: 105.0 ms per step" in table
