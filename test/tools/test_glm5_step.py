"""The GLM-5 step timing (tools/glm5/glm5_step.py) on CPU: statistics, arguments, the driver.

The timing itself needs the H200 and the kit; here its statistics are checked on values whose
answer is known, its arguments on what it must refuse (one line on stderr, exit 2), its arms on
the Engine arguments they give, and its driver with stand-in worker processes that speak the
worker's protocol, including one that never answers (the deadline keeps what was timed).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tool_scripts import load


@pytest.fixture(scope="module")
def step():
    return load("glm5_step", "glm5")


# ---- statistics ---------------------------------------------------------------------------


def test_median_interval_is_the_binomial_order_statistics(step):
    # n = 10: x(2)..x(9) holds the median with probability 1 - 2 * 11/1024 = 0.9785; x(3)..x(8)
    # only 0.891
    lo, hi, coverage = step.median_interval([float(x) for x in range(10, 0, -1)])
    assert (lo, hi) == (2.0, 9.0) and coverage == pytest.approx(1 - 22 / 1024)
    # n = 5: even the extremes cover only 1 - 2/32 = 0.9375, and say so
    assert step.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0, pytest.approx(0.9375))
    assert step.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        step.median_interval([])


def test_ratios_are_paired_by_round(step):
    base = [10.0, 12.0, 11.0, 30.0, 10.5, 11.5, 10.2, 12.2]  # a noisy round (30) moves both arms
    faster = [x / 1.02 for x in base]
    r = step.ratio_stats(base, faster)
    assert r["ratio"] == pytest.approx(1.02) and r["lo"] == pytest.approx(1.02)
    assert r["hi"] == pytest.approx(1.02) and r["rounds"] == 8
    with pytest.raises(ValueError, match="paired"):
        step.ratio_stats(base, faster[:-1])


def test_summary_has_the_dashboard_s_keys(step):
    lengths = [1024, 8192]
    rounds = range(1, 7)
    samples = {
        "eager": {1024: [20.0 + r for r in rounds], 8192: [200.0 + r for r in rounds]},
        "bcg": {1024: [10.0 + r for r in rounds], 8192: [100.0 + r for r in rounds]},
        "bcg-des": {1024: [(10.0 + r) / 1.01 for r in rounds], 8192: [100.0 + r for r in rounds]},
    }
    s = step.summarize(samples, lengths, list(step.ARMS))
    gain = s["drop_empty_segments_gain"]
    assert gain["ratio"] == pytest.approx(1.01) and gain["prompt"] == 1024
    assert s["drop_empty_segments_gain_long"]["ratio"] == pytest.approx(1.0)
    assert (gain["lo"], gain["hi"]) == (pytest.approx(1.01), pytest.approx(1.01))
    piecewise = s["breakable_vs_piecewise_8k"]
    assert piecewise["ratio"] is None and "tc_piecewise was removed" in piecewise["why"]
    eager = s["breakable_vs_eager_8k"]
    assert eager["prompt"] == 8192 and 1.9 < eager["lo"] <= eager["ratio"] <= eager["hi"] < 2.0
    assert s["per_arm"]["bcg"]["1024"]["median_ms"] == 13.5
    samples["bcg"][1024].append(99.0)  # a round the des arm did not get to: left unpaired
    assert step.summarize(samples, lengths, list(step.ARMS))["drop_empty_segments_gain"] == gain
    without_des = step.summarize(samples, lengths, ["eager", "bcg"])
    assert without_des["drop_empty_segments_gain"]["ratio"] is None


def test_e2e_counts_come_from_the_harness_results(step, tmp_path):
    path = tmp_path / "e2e_results.json"
    report = {"checks_failed": 1, "phases": {"a": {"checks": [{}] * 3}, "b": {"checks": [{}]}}}
    path.write_text(json.dumps(report))
    assert step.e2e_counts(path) == {"e2e_checks": 4, "e2e_failed": 1}
    assert step.e2e_counts(None) == {"e2e_checks": None, "e2e_failed": None}


def test_schedule_interleaves_every_arm_each_round_in_rotating_order(step):
    plan = step.schedule(["eager", "bcg", "bcg-des"], [1024, 8192], 3)
    assert len(plan) == 18
    firsts = [plan[i][2] for i in range(0, 18, 6)]
    assert firsts == ["eager", "bcg", "bcg-des"]
    for r in range(3):
        mine = [(n, a) for rr, n, a in plan if rr == r]
        assert sorted(mine) == sorted((n, a) for n in (1024, 8192) for a in step.ARMS)


def test_dropped_segments_read_from_the_last_counter_line(step):
    line = 'x sglang-mixgraph counters {"pid": 1, "events": {"drop_empty_segments": {"segments_dropped": %d}}, "fallbacks": {}}'
    assert step.dropped_segments("\n".join([line % 3, "other", line % 5])) == 5
    assert step.dropped_segments("no counters") is None


# ---- arguments and arms -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lengths", "0,8192"], "--lengths: '0,8192': positive whole numbers"),
        (["--lengths", "1k"], "'1k': comma-separated whole numbers"),
        (["--arms", "eager,pcg"], "'eager,pcg': arms among eager,bcg,bcg-des"),
        (["--arms", "bcg,bcg"], "'bcg,bcg': arms among eager,bcg,bcg-des, each once"),
        (["--arms", "bcg#"], "'bcg#': arms among"),
        (["--rounds", "0"], "--rounds 0 --warmup 2: at least 1 round, warmup >= 0"),
        (["--layers", "1"], "--layers 1: at least 2"),
        (["--e2e-results", "/nonexistent.json"], "--e2e-results /nonexistent.json: no such file"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(step, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        step.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glm5_step: ") and message in err[0]


def test_arms_differ_in_graph_and_flag_only(step, tmp_path):
    eager, bcg = (step.engine_kwargs(a, "/m", [1024, 8192]) for a in ("eager", "bcg"))
    assert eager["disable_cuda_graph"] is True and "cuda_graph_bs_prefill" not in eager
    assert bcg["cuda_graph_backend_prefill"] == "breakable"
    assert bcg["cuda_graph_bs_prefill"] == [1024, 8192]  # captured at the timed lengths
    assert bcg["chunked_prefill_size"] == 8192 and bcg["disable_radix_cache"] is True
    assert step.engine_kwargs("bcg-des", "/m", [1024, 8192]) == bcg
    assert step.arm_env("bcg-des", str(tmp_path))[step.DES_FLAG] == "1"
    env = step.arm_env("bcg", str(tmp_path))
    assert env[step.DES_FLAG] == "0" and env["SGLANG_DSA_FUSE_TOPK"] == "0"
    assert env["MIXGRAPH_E2E_STARTUP"] == "glm5_step_timer"


# ---- the driver, with stand-in workers ----------------------------------------------------

FAKE_WORKER = """
import json, os, sys
arm = sys.argv[sys.argv.index("--worker") + 1]
assert os.environ["GLM5_STEP_LOG"] and os.environ["SGLANG_OPT_BCG_DROP_EMPTY_SEGMENTS"] in "01"
if os.environ.get("FAKE_SILENT") == arm:
    sys.stdin.read()
say = lambda **f: print("GLM5_STEP " + json.dumps(f), flush=True)
if arm == "bcg-des":
    counts = {"drop_empty_segments": {"segments_dropped": 0, "captures_checked": 2}}
    print("x sglang-mixgraph counters " + json.dumps({"pid": 3, "events": counts}), file=sys.stderr)
say(kind="ready", start_s=0.1)
base = {"eager": 2.0, "bcg": 1.0, "bcg-des": 1.0}[arm]
for line in sys.stdin:
    n, seed = map(int, line.split())
    rnd = (seed - 1) // 6  # 3 arms x 2 lengths per round: a round's noise hits every arm alike
    ms = base * n / 1024 * (1 + rnd % 3 / 10)
    say(kind="step", ms=ms, host_ms=ms / 2, graph=arm != "eager")
"""


def _drive(step, monkeypatch, tmp_path, *argv):
    fake = tmp_path / "fake_worker.py"
    fake.write_text(FAKE_WORKER)
    monkeypatch.setattr(step, "WORKER", fake)
    out = tmp_path / "out"
    rc = step.main(["--out", str(out), "--layers", "2", "--rounds", "6", "--warmup", "1", *argv])
    return rc, json.loads((out / "glm5_step.json").read_text())


def test_driver_times_interleaved_rounds_and_writes_the_summary(step, monkeypatch, tmp_path):
    e2e = tmp_path / "e2e_results.json"
    e2e.write_text(json.dumps({"checks_failed": 0, "phases": {"glm5-bcg": {"checks": [{}] * 9}}}))
    rc, result = _drive(step, monkeypatch, tmp_path, "--e2e-results", str(e2e))
    assert rc == 0 and result["status"] == "complete"
    assert all(len(v) == 6 for s in result["samples_ms"].values() for v in s.values())
    summary = result["summary"]
    assert summary["drop_empty_segments_gain"]["ratio"] == pytest.approx(1.0)
    assert summary["breakable_vs_eager_8k"]["ratio"] == pytest.approx(2.0)
    assert summary["empty_segments_dropped"] == 0
    assert (summary["e2e_checks"], summary["e2e_failed"]) == (9, 0)
    bcg = summary["per_arm"]["bcg"]["1024"]  # the host's part rides along, per arm and length
    assert bcg["host_median_ms"] == pytest.approx(bcg["median_ms"] / 2)
    assert result["host_ms"]["bcg"]["1024"] == [x / 2 for x in result["samples_ms"]["bcg"]["1024"]]


def test_engines_start_in_the_given_order_and_a_twin_gives_the_same_arm_ratio(
    step, monkeypatch, tmp_path
):
    rc, result = _drive(
        step, monkeypatch, tmp_path, "--arms", "bcg-des,bcg,bcg#2", "--lengths", "1024"
    )
    assert rc == 0 and list(result["samples_ms"]) == ["bcg-des", "bcg", "bcg#2"]
    assert result["engine_kwargs"]["bcg#2"] == result["engine_kwargs"]["bcg"]
    log = (tmp_path / "out" / "glm5_step.log").read_text().splitlines()
    assert [x.split(":")[0] for x in log if ": ready" in x] == ["bcg-des", "bcg", "bcg#2"]
    assert (tmp_path / "out" / "glm5_step_bcg-2.log").is_file()
    same = result["summary"]["same_arm"]
    assert list(same) == ["bcg#2"] and same["bcg#2"]["ratio"] == pytest.approx(1.0)
    assert same["bcg#2"]["definition"] == "bcg step ms / bcg#2 step ms"


def test_a_worker_that_never_answers_stops_the_run_at_its_deadline(step, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_SILENT", "bcg-des")
    rc, result = _drive(step, monkeypatch, tmp_path, "--budget-s", "3")
    assert rc == 1 and result["status"].startswith("stopped: bcg-des: worker ended")
    assert result["summary"]["empty_segments_dropped"] is None


def test_the_step_timer_logs_each_forward(monkeypatch, tmp_path):
    import torch

    timer = load("glm5_step_timer", "glm5")

    class ModelRunner:
        def forward(self, forward_batch):
            return SimpleNamespace(can_run_graph=forward_batch.input_ids.shape[0] == 8)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setenv(timer.LOG_ENV, str(tmp_path))
    module = SimpleNamespace(ModelRunner=ModelRunner)
    timer._wrap_forward(module)
    mode = SimpleNamespace(name="EXTEND")
    for rows in (8, 3):
        module.ModelRunner().forward(
            SimpleNamespace(forward_mode=mode, input_ids=torch.zeros(rows))
        )
    lines = [json.loads(x) for x in next(tmp_path.glob("steps_*.jsonl")).read_text().splitlines()]
    assert [(x["mode"], x["rows"], x["graph"]) for x in lines] == [
        ("EXTEND", 8, True),
        ("EXTEND", 3, False),
    ]
    assert all(0 <= x["host_ms"] <= x["ms"] for x in lines)


def test_sglang_plans_the_bcg_arm_with_the_timed_lengths_as_its_buckets(
    step, tmp_path, capsys, monkeypatch
):
    import os

    from sglang_mixgraph import cli

    for name in list(os.environ):
        if name.startswith("SGLANG_") and name != "SGLANG_PLATFORM":
            monkeypatch.delenv(name)
    gen = load("make_tiny_glm5", "glm5")
    model = gen.write(tmp_path / "m", 78).parent
    kw = step.engine_kwargs("bcg", str(model), [1024, 8192])
    args = ["--tp", "1", "--target-gpu", "H200", "--disable-radix-cache"]
    for key in ("chunked_prefill_size", "max_running_requests", "max_total_tokens"):
        args += [f"--{key.replace('_', '-')}", str(kw[key])]
    for key in ("dsa_topk_backend", "dsa_prefill_backend", "dsa_decode_backend", "kv_cache_dtype"):
        args += [f"--{key.replace('_', '-')}", str(kw[key])]
    args += ["--cuda-graph-backend-prefill", "breakable", "--cuda-graph-bs-prefill", "1024", "8192"]
    code = cli.main(["plan", "--model-path", str(model), *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    plan = json.loads(out)
    assert plan["graph"]["prefill_graph"]["backend"] == "breakable"
    assert plan["graph"]["prefill_graph"]["buckets"] == [1024, 8192]
    assert plan["dsa_surface"][0] == "DSA split-op surface (78 of 78 layers run the indexer):"
