"""`sglang-mixgraph ab` blocks: a repeat is a block of visits that runs whole on one machine.

Against the CPU stand-in server over several "machines" (`--machine`): each record names its
machine, `--max-blocks` leaves the rest for the next machine, a machine that has served
nothing of the run first serves one discarded warm visit, a block begun on another machine is
measured again whole, a pair across machines is refused, and the pooled ratio's interval is
over blocks with each block's ratio beside it. The configuration checks and the pooling
arithmetic are tested without a server.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from ab_kit import Recorder, pids_alive, standin_config

from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.ab import runner, versions
from sglang_mixgraph.ab.config import ConfigError, parse_config
from sglang_mixgraph.ab.stats import paired_ratio, t975

ARMS = """
[[arm]]
name = "base"
args = ["--tpot-ms", "10"]

[[arm]]
name = "fast"
args = ["--tpot-ms", "5"]

[[arm]]
name = "mid"
args = ["--tpot-ms", "8"]
"""
SWEEP = """concurrencies = [2]
dataset = "random-ids"
input_len = 8
output_len = 6
num_prompts = 2
warmup_requests = 1
block = ["base", "fast", "mid", "mid", "fast", "base"]
blocks = 2
warm_visit = "mid"
"""


@pytest.fixture(autouse=True)
def _offline_and_pids(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("STANDIN_PID_FILE", str(tmp_path / "pids"))
    yield
    assert pids_alive(tmp_path / "pids") == [], "a server process outlived the run"


def _raw(**sweep) -> dict:
    base = {
        "server": {"model_path": "/m"},
        "arm": [{"name": "U"}, {"name": "E"}, {"name": "L"}],
        "sweep": {"concurrencies": [4], **sweep},
    }
    return base


def _run(config: Path, run_dir: Path, recorder: Recorder, *extra: str) -> int:
    argv = ["run", str(config), "--run-dir", str(run_dir), *extra]
    return ab_cli.main(argv, invoker=recorder)


def _records(run_dir: Path, folder: str = "cells") -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob(f"{folder}/*/*.cell.json"))]


# ---------------------------------------------------------------- configuration


def test_a_block_order_gives_each_visit_its_repeat_and_block():
    config = parse_config(_raw(block=["U", "E", "L", "L", "E", "U"], blocks=2))
    assert config.sweep.repeats == 4 and config.sweep.visits_per_block() == 2
    order = [(v.arm.name, v.repeat, v.block) for v in runner.plan(config)]
    assert order == [
        ("U", 0, 0), ("E", 0, 0), ("L", 0, 0), ("L", 1, 0), ("E", 1, 0), ("U", 1, 0),
        ("U", 2, 1), ("E", 2, 1), ("L", 2, 1), ("L", 3, 1), ("E", 3, 1), ("U", 3, 1),
    ]  # fmt: skip
    # Without a block order each repeat is its own block (A B C, C B A).
    legacy = parse_config(_raw(repeats=2))
    assert [(v.arm.name, v.repeat, v.block) for v in runner.plan(legacy)] == [
        ("U", 0, 0), ("E", 0, 0), ("L", 0, 0), ("L", 1, 1), ("E", 1, 1), ("U", 1, 1),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"block": ["U", "E", "L", "U"]}, "not balanced, every arm must appear equally often"),
        ({"block": ["U", "E"]}, "arm 'L' is not in it"),
        ({"block": ["U", "E", "X"]}, "no arm named 'X'"),
        ({"block": []}, "give the visit order of one block"),
        ({"block": ["U", "E", "L"], "repeats": 2}, "give blocks (with block) or repeats"),
        ({"blocks": 2}, "blocks: needs block"),
        ({"warm_visit": "X"}, "warm_visit: no arm named 'X'"),
    ],
)
def test_bad_blocks_are_one_line_errors(sweep, message):
    with pytest.raises(ConfigError, match=None) as e:
        parse_config(_raw(**sweep))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "pairs, message",
    [(["E-U"], "expected CANDIDATE/BASELINE"), (["E/X"], "no arm named 'X'"), (["E/E"], "itself")],
)
def test_bad_pairs_are_one_line_errors(pairs, message):
    with pytest.raises(ConfigError) as e:
        parse_config({**_raw(), "pairs": pairs})
    assert message in str(e.value)


def test_the_pooled_interval_is_over_blocks_not_pairs():
    # Two blocks of two pairs each: block log-ratios are the means of their pairs' logs.
    cand = {0: 11.0, 1: 12.0, 2: 9.0, 3: 10.0}
    base = {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0}
    est = paired_ratio(cand, base, lambda r: r // 2)
    b1 = statistics.fmean([math.log(1.1), math.log(1.2)])
    b2 = statistics.fmean([math.log(0.9), math.log(1.0)])
    assert est.n == 2 and est.pairs == 4
    assert est.log_mean == pytest.approx((b1 + b2) / 2)
    assert est.log_ci95 == pytest.approx(t975(1) * statistics.stdev([b1, b2]) / math.sqrt(2))
    assert [(b, round(r, 6), n) for b, r, n in est.blocks] == [
        (0, round(math.exp(b1), 6), 2),
        (1, round(math.exp(b2), 6), 2),
    ]
    # Each repeat its own block: the plain paired ratio over repeats.
    plain = paired_ratio(cand, base)
    assert plain.n == 4 and plain.log_mean == pytest.approx(
        statistics.fmean(math.log(cand[r] / base[r]) for r in cand)
    )


# ---------------------------------------------------------------- over several machines


def test_blocks_run_one_per_machine_with_a_warm_visit_and_pool_over_machines(tmp_path, capsys):
    config = standin_config(tmp_path, arms=ARMS, sweep=SWEEP)
    config.write_text('pairs = ["fast/mid"]\n' + config.read_text())  # top-level: before tables
    run_dir = tmp_path / "run"

    # Machine m1: the warm visit (discarded), then block 1 only; the rest waits for m2.
    first = Recorder()
    assert _run(config, run_dir, first, "--machine", "m1", "--max-blocks", "1") == 1
    err = capsys.readouterr().err
    assert "machine m1 has served nothing of this run: one warm visit of 'mid'" in err
    assert "stopping after 1 block(s) (--max-blocks 1)" in err
    # Served in order: the warm visit (mid, 8 ms), then block 1's visits U E L L E U.
    assert first.bench_servers() == [8.0, 10.0, 5.0, 8.0, 8.0, 5.0, 10.0]
    warm = _records(run_dir, "warm")
    assert len(warm) == 1 and warm[0]["machine"] == "m1" and warm[0]["status"] == "ok"
    assert {(r["machine"], r["block"]) for r in _records(run_dir)} == {("m1", 0)}

    # Machine m2: it has served nothing of the run either, so its own warm visit, then block 2.
    second = Recorder()
    assert _run(config, run_dir, second, "--machine", "m2", "--max-blocks", "1") == 0
    err = capsys.readouterr().err
    assert "machine m2 has served nothing" in err and "6 finished cells are kept" in err
    assert second.bench_servers() == [8.0, 10.0, 5.0, 8.0, 8.0, 5.0, 10.0]
    records = _records(run_dir)
    assert sorted({(r["machine"], r["block"]) for r in records}) == [("m1", 0), ("m2", 1)]
    assert len(_records(run_dir, "warm")) == 2

    results = json.loads((run_dir / "results.json").read_text())
    assert results["passed"]
    assert {c["machine"] for c in results["cells"]} == {"m1", "m2"}  # warm cells are not cells
    tpot = results["ratios_vs_baseline"]["fast"]["2"]["median_tpot_ms"]
    assert tpot["n"] == 2 and tpot["pairs"] == 4 and [b["block"] for b in tpot["blocks"]] == [1, 2]
    assert tpot["mean"] == pytest.approx(0.5, rel=0.25)
    assert tpot["low"] <= tpot["mean"] <= tpot["high"]
    # The pooled log-ratio is the mean of the blocks' (one machine each).
    logs = [math.log(b["ratio"]) for b in tpot["blocks"]]
    assert math.log(tpot["mean"]) == pytest.approx(statistics.fmean(logs))
    pair = results["pair_ratios"]["fast/mid"]["2"]["median_tpot_ms"]
    assert pair["n"] == 2 and pair["mean"] == pytest.approx(5 / 8, rel=0.25)

    report = (run_dir / "report.md").read_text()
    assert "2 block(s) of visits `base fast mid mid fast base`" in report
    # Each block names its machine and that machine's host CPU (here both are this one).
    cpu = versions.describe_field("cpu", versions.environment()["cpu"])
    assert (
        f"| load | pair | metric | pooled [95% interval] | block 1 (m1: {cpu}) "
        f"| block 2 (m2: {cpu}) |" in report
    )
    assert "| 2 | `fast/mid` | TPOT p50 |" in report

    # A pair across machines is refused: one line, exit 2.
    path = next(p for p in run_dir.glob("cells/fast/*_r2_*.cell.json"))
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "machine": "m9"}))
    assert ab_cli.main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "measured on machines m9 and m2; a ratio pairs cells of one machine only" in err
    assert len(err.splitlines()) == 1


def test_a_block_begun_on_another_machine_is_measured_again_whole(tmp_path, capsys):
    config = standin_config(tmp_path, arms=ARMS, sweep=SWEEP.replace("blocks = 2", "blocks = 1"))
    run_dir = tmp_path / "run"
    assert _run(config, run_dir, Recorder(), "--machine", "m1") == 0
    capsys.readouterr()
    # As if machine m1 was taken away mid-block: one cell never finished.
    next(run_dir.glob("cells/base/*_r1_*.cell.json")).unlink()

    again = Recorder()
    assert _run(config, run_dir, again, "--machine", "m2") == 0
    err = capsys.readouterr().err
    assert "block 1 was begun on machine m1: measuring it again whole on m2" in err
    assert "one warm visit of 'mid'" in err  # m2 had served nothing of the run
    assert again.bench_servers() == [8.0, 10.0, 5.0, 8.0, 8.0, 5.0, 10.0]
    assert {r["machine"] for r in _records(run_dir)} == {"m2"}

    # Back on m2, where the block finished: nothing runs, not even a warm visit.
    idle = Recorder()
    assert _run(config, run_dir, idle, "--machine", "m2") == 0
    assert idle.calls == []
