"""tools/rank-slice/regime_map.py and regime_map.sh without a GPU: the cells' device calls planned
from the burst's steps, and the map's rows read from probe reports shaped as run_slice_probe.py
writes them (its own step summary builds the synthetic ones here)."""

from __future__ import annotations

import json
import lzma
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from tool_scripts import TOOLS, load

A = load("slice_arms")
load("adaptive_steps")
drv = load("run_slice_probe")
R = load("regime_map")

CELLS = [R.cell_name(p, c) for p in R.PREFILL for c in R.CONTEXTS]


# ---- the plan ---------------------------------------------------------------------------------


def test_cells_are_the_prefill_parts_by_context_with_256_decode_rows_beside():
    assert CELLS == ["1024x2k", "1024x8k", "2048x2k", "2048x8k", "4096x2k", "4096x8k"]
    for cell in CELLS:
        prefill, _ = R.parse_cell(cell)
        assert R.prefill_of(R.chunk_of(prefill)) == prefill
    assert R.chunk_of(2560) == A.CHUNK  # the rank's usual chunk is the 2560 cell
    with pytest.raises(ValueError, match="unknown cell"):
        R.parse_cell("2560x2k")
    with pytest.raises(ValueError, match="unknown cell"):
        R.parse_cell("1024x4k")


def test_the_visit_model_reproduces_the_measured_visits_at_chunk_2816():
    """At the usual chunk the model prices the visits that ran: 217 MIXED steps with step 185
    profiled, an 8k eager visit of 190-220 s (docs/results/split_8k_h100.md), and the 2k visits
    no shorter than they took (eager 141 s, replayed 132 s: docs/results/replay_cost_h100)."""
    k2, k8 = R.visit_cost(2560, "2k"), R.visit_cost(2560, "8k")
    assert (k2.mixed_steps, k2.profile_step) == (217, 185) == (k8.mixed_steps, k8.profile_step)
    assert 190 <= k8.eager_s <= 220
    assert k2.eager_s >= 141 and k2.replay_s >= 132
    # a smaller chunk: more, cheaper steps, whose eager host shrinks less than their kernels
    small, large = R.visit_cost(1024, "8k"), R.visit_cost(4096, "8k")
    assert small.mixed_steps > k8.mixed_steps > large.mixed_steps
    assert small.eager_s > k8.eager_s > large.eager_s


def test_the_visit_model_prices_the_measured_1024x2k_visits_no_shorter_than_they_took():
    """The 1024x2k cell on one H100 (docs/results/regime_map_h100.md): 542 MIXED steps; an eager
    visit took its start (26.8-27.2 s) and burst (126.6-131.4 s), a replayed one 39.0-44.7 s and
    75.9 s. The model keeps a margin for a slower machine, but not the 1.6x of a host taken as
    fixed at the 2816-row step's."""
    cost = R.visit_cost(1024, "2k")
    assert cost.mixed_steps == 542 and cost.profile_step == 461
    eager_took, replay_took = 27.2 + 131.4, 44.7 + 75.9
    assert eager_took <= cost.eager_s <= 1.5 * eager_took
    assert replay_took <= cost.replay_s <= 1.5 * replay_took


@pytest.mark.parametrize("cell", CELLS)
def test_every_call_of_a_cell_fits_and_both_arms_visit(cell):
    prefill, context = R.parse_cell(cell)
    cost = R.visit_cost(prefill, context)
    planned = R.calls(cost)
    price = {R.EAGER: cost.eager_s, R.REPLAY: cost.replay_s}
    for arms in planned:
        assert sum(price[a] for a in arms) <= R.BUDGET_S
    assert {a for arms in planned for a in arms} == {R.EAGER, R.REPLAY}
    if len(planned) == 1:  # one call: the arms alternate, eager first
        (arms,) = planned
        assert arms[::2] == [R.EAGER] * len(arms[::2])
        assert arms[1::2] == [R.REPLAY] * len(arms[1::2])
    else:  # one of each would not fit: each arm in a call of its own
        assert cost.eager_s + cost.replay_s > R.BUDGET_S
        assert [set(arms) for arms in planned] == [{R.EAGER}, {R.REPLAY}]
    assert 1 <= cost.profile_step <= cost.mixed_steps


def test_a_budget_too_small_for_one_visit_is_refused():
    cost = R.visit_cost(1024, "8k")
    with pytest.raises(ValueError, match="does not fit"):
        R.calls(cost, budget_s=cost.replay_s - 1)
    # room for the longer visit alone, not for one of each: each arm in a call of its own
    assert R.calls(cost, budget_s=cost.eager_s + 1) == [[R.EAGER], [R.REPLAY]]


@pytest.mark.parametrize("cell", CELLS)
def test_a_cells_arguments_are_the_probes_workload_at_the_cells_chunk(cell):
    prefill, context = R.parse_cell(cell)
    cost = R.visit_cost(prefill, context)
    for call, arms in enumerate(R.calls(cost), 1):
        args = drv.parse_args(R.probe_args(cell, call))
        assert args.arms == arms
        assert (args.requests, args.output_len, args.chunk) == (272, 200, R.chunk_of(prefill))
        assert (args.kernels, args.fp8, args.fp8_gemm, args.radix) == (
            "faithful",
            True,
            "torch",
            "on",
        )
        assert args.profile_mixed == str(cost.profile_step)
        assert args.budget_s == R.BUDGET_S
        want = R.CONTEXTS[context]
        got = {k: getattr(args, k) for k in want}
        assert got == want
        kw = drv.visit_engine_kwargs(args, "/m", A.ARMS[arms[0]])
        assert kw["chunked_prefill_size"] == R.chunk_of(prefill)
    with pytest.raises(ValueError, match="call"):
        R.probe_args(cell, len(R.calls(cost)) + 1)


def test_the_shell_script_runs_the_probe_with_the_cells_planned_arguments(tmp_path):
    """regime_map.sh with a `python3` that runs regime_map.py for real and records the probe's
    command line instead of starting it."""
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "probe_args"
    (fake / "python3").write_text(
        "#!/usr/bin/env bash\n"
        'case "$1" in\n'
        f'  *run_slice_probe.py) shift; printf "%s\\n" "$@" > {shlex.quote(str(record))} ;;\n'
        f'  *) exec {shlex.quote(sys.executable)} "$@" ;;\n'
        "esac\n"
    )
    (fake / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    script = TOOLS / "rank-slice" / "regime_map.sh"
    done = subprocess.run(
        ["bash", str(script), "1024x8k", "1"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    out = str(tmp_path / "out" / "1024x8k-1")
    assert record.read_text().split() == [*R.probe_args("1024x8k", 1), "--out", out]
    two = subprocess.run(
        ["bash", str(script), "1024x8k", "2"], env=env, capture_output=True, text=True
    )
    assert two.returncode != 0 and "has 1 call(s)" in two.stderr
    bad = subprocess.run(["bash", str(script), "3000x2k"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown cell" in bad.stderr


# ---- reading the probe's reports ---------------------------------------------------------------


def _entry(walls, hosts, *, graph, kernel_ms=None, busy_ms=None, outputs=((5, 6),), ok=True):
    """A visit as run_slice_probe.py records it: its own step summary over these MIXED steps."""
    steps = [
        {
            "mode": "MIXED",
            "graph": graph,
            "host_ms": h,
            "wall_ms": w,
            "n_dec": 200,
            "prefill_tokens": 2048,
        }
        for w, h in zip(walls, hosts, strict=True)
    ]
    steps.append({"mode": "DECODE", "graph": True, "host_ms": 2, "wall_ms": 40})
    profiles = []
    if kernel_ms is not None:
        step = {"mode": "MIXED", "rows": 2247, "n_dec": 199, "prefill_tokens": 2048}
        classes = {"kernel_ms": kernel_ms, "kernels": 3000, "classes": {}}
        if busy_ms is not None:
            classes["busy_ms"] = busy_ms
        profiles.append({"step": step, "kernel_ms_total": 3 * kernel_ms, "classes": classes})
    return {
        "ok": ok,
        "engine": {"chunked_prefill_size": 2304},
        "steps": drv.step_summary(steps),
        "profiles": profiles,
        "outputs": [list(o) for o in outputs],
    }


def _report(arms, *, input_len=2048, chunk=2304, device="NVIDIA H100 80GB HBM3"):
    workload = {"requests": 272, "input_len": input_len, "output_len": 200}
    report = {"workload": workload, "arms": arms, "torch": "2.11.0"}
    if chunk is not None:
        report["chunk"] = chunk
    if device is not None:
        report["device"] = device
    return report


EAGER_1 = ([300.0, 310.0, 350.0], [290.0, 305.0, 345.0])
EAGER_2 = ([320.0, 330.0, 334.0], [318.0, 327.0, 333.0])
REPLAY_1 = ([250.0, 252.0, 260.0], [25.0, 30.0, 240.0])


def _cell_reports():
    return [
        _report(
            {
                "upstream": _entry(*EAGER_1, graph=False, kernel_ms=240.0),
                R.REPLAY: _entry(*REPLAY_1, graph=True, kernel_ms=251.0, busy_ms=238.0),
                "upstream#2": _entry(*EAGER_2, graph=False, kernel_ms=242.0),
            }
        )
    ]


def test_a_cells_row_is_medians_over_visits_and_their_ratio():
    (row,) = R.regime_rows(_cell_reports())
    assert (row["cell"], row["chunk"], row["prefill_chunk"], row["context"]) == (
        "2048x2k",
        2304,
        2048,
        "2k",
    )
    visit_walls = [statistics.median(EAGER_1[0]), statistics.median(EAGER_2[0])]
    eager_wall = statistics.median(visit_walls)
    replay_wall = statistics.median(REPLAY_1[0])
    assert row["eager"]["visits"] == 2 and row["eager"]["wall_ms"] == eager_wall
    assert row["eager"]["wall_spread_ms"] == max(visit_walls) - min(visit_walls)
    assert row["replayed"]["wall_ms"] == replay_wall and row["replayed"]["replayed_share"] == 1
    assert row["gain"] == round(eager_wall / replay_wall, 3)
    assert row["gain_range"] == [round(min(visit_walls) / replay_wall, 3)] + [
        round(max(visit_walls) / replay_wall, 3)
    ]
    eager_host = statistics.median([statistics.median(EAGER_1[1]), statistics.median(EAGER_2[1])])
    assert row["eager"]["kernel_ms"] == statistics.median([240.0, 242.0])
    assert row["host_kernel_ratio"] == round(eager_host / row["eager"]["kernel_ms"], 3)
    # the replay's GPU busy time beside its summed kernels; reports without it give None
    assert (row["replayed"]["kernel_ms"], row["replayed"]["busy_ms"]) == (251.0, 238.0)
    assert row["eager"]["busy_ms"] is None and row["visits"][0]["busy_ms"] is None
    assert row["gain_beyond_spread"] == (eager_wall - replay_wall > row["eager"]["wall_spread_ms"])
    assert row["tokens_equal"] is True and row["cards"] == ["NVIDIA H100 80GB HBM3"]
    assert row["visits"][0]["profiled"] == {"rows": 2247, "n_dec": 199, "prefill_tokens": 2048}


def test_a_cell_spread_over_two_calls_is_one_row_and_cells_stay_apart():
    eager_call = _report({"upstream": _entry(*EAGER_1, graph=False, kernel_ms=240.0)}, chunk=1280)
    replay_call = _report(
        {
            R.REPLAY: _entry(*REPLAY_1, graph=True),
            f"{R.REPLAY}#2": _entry(*REPLAY_1, graph=True, outputs=((5, 7),)),
        },
        chunk=1280,
    )
    eight = _report(
        {
            "upstream": _entry(*EAGER_2, graph=False, kernel_ms=300.0),
            R.REPLAY: _entry(*REPLAY_1, graph=True),
        },
        input_len=8192,
        chunk=1280,
    )
    rows = R.regime_rows([eager_call, eight, replay_call])
    assert [r["cell"] for r in rows] == ["1024x2k", "1024x8k"]
    two = rows[0]
    assert (two["eager"]["visits"], two["replayed"]["visits"]) == (1, 2)
    assert two["gain"] == round(statistics.median(EAGER_1[0]) / statistics.median(REPLAY_1[0]), 3)
    assert two["tokens_equal"] is False  # one visit's greedy tokens differ


def test_unfinished_and_unreplayed_visits_are_shown_not_averaged():
    cut = _entry([900.0], [890.0], graph=False, ok=False)
    refused = _entry(*EAGER_2, graph=False)  # a replay arm whose graph was refused: all eager
    (row,) = R.regime_rows(
        [
            _report(
                {
                    "upstream": _entry(*EAGER_1, graph=False, kernel_ms=240.0),
                    R.REPLAY: refused,
                    "upstream#2": cut,
                }
            )
        ]
    )
    assert row["unfinished"] == ["upstream#2"] and row["eager"]["visits"] == 1
    assert row["replayed"]["replayed_share"] == 0
    assert row["gain"] is None and row["gain_range"] is None
    (no_replay,) = R.regime_rows([_report({"upstream": _entry(*EAGER_1, graph=False)})])
    assert no_replay["replayed"] is None and no_replay["gain"] is None
    assert no_replay["host_kernel_ratio"] is None  # no profiled step, no kernels to divide by


def test_read_writes_the_table_and_the_json_rows(tmp_path, capsys):
    """`read` takes report files or the folders a call left (xz-compressed as the results keep
    them); an older report (no chunk, no card) takes its Engine's chunk and its log's card."""
    (report,) = _cell_reports()
    plain = tmp_path / "a.json"
    plain.write_text(json.dumps(report))
    older = tmp_path / "call"
    older.mkdir()
    legacy = {k: v for k, v in report.items() if k not in ("chunk", "device")}
    legacy["workload"] = dict(legacy["workload"], input_len=8192)
    with lzma.open(older / "rank_slice_probe.json.xz", "wt") as f:
        json.dump(legacy, f)
    (older / "rank_slice_probe.log").write_text(
        "rank-slice probe 2026-12-06 07:00:00 UTC on NVIDIA H200\ntorch 2.11.0\n"
    )
    out = tmp_path / "regime_map.json"
    assert R.main(["read", str(plain), str(older), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["cell"] for r in rows] == ["2048x2k", "2048x8k"]
    assert rows[1]["cards"] == ["NVIDIA H200"] and rows[1]["chunk"] == 2304
    assert rows[0]["sources"] == [str(plain)]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("cell | eager wall ms")
    assert printed[2].startswith("2048x2k | ") and f"{rows[0]['gain']:.3f}x" in printed[2]
    assert printed[3].startswith("2048x8k | ") and "NVIDIA H200" in printed[3]


def test_plan_prints_every_cells_calls(capsys):
    assert R.main(["plan"]) == 0
    out = capsys.readouterr().out
    for prefill, context in [R.parse_cell(c) for c in CELLS]:
        cell = R.cell_name(prefill, context)
        for call in range(1, len(R.calls(R.visit_cost(prefill, context))) + 1):
            assert f"regime_map.sh {cell} {call}\n" in out
    assert R.main(["args", "2048x8k", "3"]) == 2


def test_the_script_is_where_the_plan_says():
    assert (Path(TOOLS).parent / R.SH).is_file()


def test_the_plot_draws_every_measured_cell_beside_the_seeds_point(tmp_path):
    """One dot per cell with a gain and a ratio, placed by them (a larger gain is drawn higher),
    the seed's point apart; a cell without a gain is left out, not drawn at zero."""
    import re

    rows = R.regime_rows(_cell_reports())
    rows.append(dict(rows[0], cell="1024x2k", gain=2.1, host_kernel_ratio=2.4))
    rows.append(dict(rows[0], cell="4096x8k", gain=None, host_kernel_ratio=0.9))
    svg = R.svg_plot(rows)
    dots = [
        (float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg)
    ]
    assert len(dots) == 2
    assert dots[1][0] > dots[0][0] and dots[1][1] < dots[0][1]  # SVG's y grows downwards
    assert "1024x2k 2.100x" in svg and "4096x8k" not in svg
    assert svg.count("<rect ") == 1 and R.SEED_POINT["label"] in svg
    out = tmp_path / "map.svg"
    (report,) = _cell_reports()
    plain = tmp_path / "a.json"
    plain.write_text(json.dumps(report))
    assert R.main(["read", str(plain), "--svg", str(out), "--json", str(tmp_path / "m.json")]) == 0
    assert out.read_text().startswith("<svg") and out.read_text().count("<circle") == 1
    assert json.loads((tmp_path / "m.json").read_text())["seed_point"] == R.SEED_POINT
