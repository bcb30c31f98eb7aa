"""The report of `sglang-mixgraph ab`, rebuilt from recorded raw outputs.

`docs/results/ab_example/` is a run directory the tool wrote against the stand-in server
(SGLang's real bench_serving and GSM8K eval); its report.md and results.json are the golden
files. Rebuilding from its raw outputs must reproduce them, its numbers must be the raw
outputs' own, and a result that changes (an accuracy under the threshold, a lost cell) must
turn the verdict and the exit status.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import shutil
import statistics
import struct
import sys
import tomllib
from pathlib import Path

import pytest

from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.ab import report
from sglang_mixgraph.ab.config import CONCURRENCY, GOODPUT_METRICS, RATE, parse_config
from sglang_mixgraph.ab.results import METRICS, SCHEMA_VERSION, frontier
from sglang_mixgraph.ab.stats import score_difference

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RUN = ROOT / "docs" / "results" / "ab_example"
RAW_PARTS = ("run.json", "cells", "gsm8k")


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """The example's raw outputs only: everything the report is built from."""
    target = tmp_path / "run"
    target.mkdir()
    for part in RAW_PARTS:
        source = EXAMPLE_RUN / part
        if source.is_dir():
            shutil.copytree(source, target / part)
        else:
            shutil.copy(source, target / part)
    return target


def _gsm8k_raw(run_dir: Path, arm: str) -> Path:
    (path,) = [p for p in (run_dir / "gsm8k").glob(f"{arm}_*.json") if p.suffixes == [".json"]]
    return path


def _raw_lines(run_dir: Path) -> dict[tuple[str, str, int], dict]:
    """(arm, file name part of the load point, repeat) -> bench_serving's line, from the files."""
    lines = {}
    for path in (run_dir / "cells").glob("*/*.jsonl"):
        shape, load, rep = path.name.split("_")[:3]
        lines[(path.parent.name, f"{shape}_{load}", int(rep[1:]))] = json.loads(
            path.read_text().splitlines()[-1]
        )
    return lines


def test_rebuild_reproduces_the_committed_report(run_dir):
    assert report.build(run_dir)[0].passed
    assert (run_dir / "report.md").read_text() == (EXAMPLE_RUN / "report.md").read_text()
    assert json.loads((run_dir / "results.json").read_text()) == json.loads(
        (EXAMPLE_RUN / "results.json").read_text()
    )
    assert (run_dir / "results.csv").read_text() == (EXAMPLE_RUN / "results.csv").read_text()


def _file_part(point) -> str:
    load = f"c{int(point.value):05d}" if point.kind == CONCURRENCY else f"rate{point.value:g}"
    return f"{point.shape}_{load}"


def test_numbers_are_the_raw_outputs_own(run_dir):
    built, _ = report.build(run_dir)
    raw = _raw_lines(run_dir)
    gpus = built.config.server.gpus
    points = built.config.sweep.points()
    assert {p.kind for p in points} == {CONCURRENCY, RATE} and len(built.config.sweep.shapes) == 2
    reps = range(built.config.sweep.repeats)
    for arm in ("baseline", "split"):
        for point in points:
            lines = [raw[(arm, _file_part(point), r)] for r in reps]
            summary = built.summary[arm][point]
            for metric in ("median_tpot_ms", "request_goodput", "slo_attainment"):
                assert summary[metric].mean == pytest.approx(
                    statistics.fmean(line[metric] for line in lines)
                )
            assert summary["output_throughput_per_gpu"].mean == pytest.approx(
                statistics.fmean(line["output_throughput"] / gpus for line in lines)
            )
    chat32 = next(p for p in points if p.shape == "chat" and p.value == 32)
    ratios = [
        raw[("split", "chat_c00032", r)]["p99_itl_ms"]
        / raw[("baseline", "chat_c00032", r)]["p99_itl_ms"]
        for r in reps
    ]
    # The ratio is the geometric mean of the paired ratios (the exp of their mean log).
    assert built.ratios["split"][chat32]["p99_itl_ms"].mean == pytest.approx(
        statistics.geometric_mean(ratios)
    )
    for arm in ("baseline", "split"):
        score = json.loads(_gsm8k_raw(run_dir, arm).read_text())["score"]
        assert built.gsm8k[arm]["score"] == score
    # bench_serving's own end-to-end latency and request throughput; tok/s per user from TPOT
    for arm in ("baseline", "split"):
        lines = [raw[(arm, "chat_c00032", r)] for r in reps]
        summary = built.summary[arm][chat32]
        for metric in ("median_e2e_latency_ms", "p99_e2e_latency_ms", "request_throughput"):
            assert summary[metric].mean == pytest.approx(statistics.fmean(x[metric] for x in lines))
        assert summary["output_tok_per_s_per_user"].mean == pytest.approx(
            statistics.fmean(1000 / x["median_tpot_ms"] for x in lines)
        )


def test_pareto_frontier_points_are_the_undominated_ones():
    assert frontier([(1, 5), (2, 4), (2, 3), (0, 5), (3, 1)]) == [True, True, False, False, True]
    assert frontier([(1, 1), (1, 1)]) == [True, True]  # equal points do not dominate each other
    results = json.loads((EXAMPLE_RUN / "results.json").read_text())
    per_user, per_gpu = "output_tok_per_s_per_user", "output_throughput_per_gpu"
    for shape, rows in results["pareto"].items():
        assert len(rows) == 2 * 4  # arms x load points
        for row in rows:
            summary = results["summary"][row["arm"]][row["point"]]
            assert (row[per_user], row[per_gpu]) == (
                summary[per_user]["mean"],
                summary[per_gpu]["mean"],
            )

            def beaten(among, row=row):
                return any(
                    o[per_user] >= row[per_user]
                    and o[per_gpu] >= row[per_gpu]
                    and (o[per_user], o[per_gpu]) != (row[per_user], row[per_gpu])
                    for o in among
                )

            assert row["joint_frontier"] is not beaten(rows), (shape, row)
            own = [o for o in rows if o["arm"] == row["arm"]]
            assert row["arm_frontier"] is not beaten(own), (shape, row)
        # the stand-in's split decodes faster at every load: its points alone are the frontier
        assert {r["arm"] for r in rows if r["joint_frontier"]} == {"split"}
    text = (EXAMPLE_RUN / "report.md").read_text()
    assert "### Pareto frontier: output tok/s per GPU against tok/s per user" in text
    assert "| `chat` | `split` | 40 req/s | 72.7 | 1,100 | yes | yes |" in text


def test_gsm8k_difference_between_arms_has_newcombes_interval(run_dir, capsys):
    # Newcombe (1998), Statistics in Medicine 17:873, method 10: 56/70 - 48/80 and 9/10 - 3/10
    assert score_difference(56 / 70, 70, 48 / 80, 80) == pytest.approx(
        (0.2, 0.0524, 0.3339), abs=5e-5
    )
    assert score_difference(9 / 10, 10, 3 / 10, 10) == pytest.approx(
        (0.6, 0.1705, 0.8090), abs=5e-5
    )
    raw = _gsm8k_raw(run_dir, "split")
    raw.write_text(json.dumps({**json.loads(raw.read_text()), "score": 12 / 30}))
    assert ab_cli.main(["report", str(run_dir)]) == 1  # split under the 0.7 threshold
    (diff,) = json.loads((run_dir / "results.json").read_text())["gsm8k_differences"]
    expected = score_difference(12 / 30, 30, 23 / 30, 30)
    assert (diff["candidate"], diff["baseline"]) == ("split", "baseline")
    assert (diff["difference"], diff["low"], diff["high"]) == pytest.approx(expected)
    assert diff["high"] < 0  # the drop is shown, not only the threshold miss
    text = (run_dir / "report.md").read_text()
    assert (
        f"| `split` - `baseline` | {expected[0]:+.3f} [{expected[1]:+.3f}, {expected[2]:+.3f}] |"
        in text
    )


def test_results_json_is_versioned_and_typed():
    results = json.loads((EXAMPLE_RUN / "results.json").read_text())
    assert results["schema_version"] == SCHEMA_VERSION and isinstance(SCHEMA_VERSION, int)
    assert isinstance(results["passed"], bool) and isinstance(results["repeats"], int)
    for cell in results["cells"]:
        assert isinstance(cell["repeat"], int)
        assert all(isinstance(v, float | int) for v in cell.get("metrics", {}).values())


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return False
    width, height = struct.unpack(">II", data[16:24])
    return width > 100 and height > 100 and data.rstrip()[-8:-4] == b"IEND"


def test_plots_are_pngs(run_dir):
    pytest.importorskip("matplotlib")
    _, plots = report.build(run_dir)
    assert [Path(p).name for p in plots] == list(report.PLOTS)
    for name in report.PLOTS:
        assert _is_png(run_dir / name), name
    for name in report.PLOTS:  # the committed example's too
        assert _is_png(EXAMPLE_RUN / name), name


def test_without_matplotlib_the_plots_are_skipped_with_one_line(run_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert ab_cli.main(["report", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert err.strip() == f"sglang-mixgraph ab: {report.PLOTS_SKIPPED}"
    assert (run_dir / "report.md").exists() and not (run_dir / "pareto.png").exists()


def _fail_writes(monkeypatch, name: str, code: int) -> None:
    """Writing the report file `name` fails with `code`, as write() fails (no file name):
    a full disk once half the bytes are out, anything else before the first byte."""

    def fail(path: Path, data: bytes) -> None:
        if code == errno.ENOSPC:
            path.write_bytes(data[: len(data) // 2])
        raise OSError(code, os.strerror(code))

    real_write_text = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if self.name.startswith(name):  # the file or a temporary file beside it
            return fail(self, data.encode())
        return real_write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    figure = pytest.importorskip("matplotlib.figure").Figure
    real_savefig = figure.savefig

    def savefig(self, fname, *args, **kwargs):
        real_savefig(self, fname, *args, **kwargs)
        if Path(fname).name.startswith(name):
            fail(Path(fname), Path(fname).read_bytes())

    monkeypatch.setattr(figure, "savefig", savefig)


def _report_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


@pytest.mark.parametrize("name", ["report.md", "results.json", "results.csv", "pareto.png"])
def test_a_full_disk_keeps_the_previous_report_whole(run_dir, capsys, monkeypatch, name):
    report.build(run_dir)
    before = _report_files(run_dir)
    _fail_writes(monkeypatch, name, errno.ENOSPC)
    assert ab_cli.main(["report", str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"sglang-mixgraph ab: run directory {run_dir}: cannot write {run_dir / name}: No space "
        "left on device; every report file is whole (this one as before): free space and run "
        "again\n"
    )
    assert "report:" not in captured.out  # no report is announced
    after = _report_files(run_dir)
    assert after[name] == before[name] and after.keys() == before.keys()  # no .tmp left


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["read-only fs", "no permission"])
def test_a_read_only_run_directory_is_one_line_saying_what_to_do(
    run_dir, capsys, monkeypatch, code
):
    report.build(run_dir)
    before = _report_files(run_dir)
    _fail_writes(monkeypatch, "", code)  # every file of the run directory
    assert ab_cli.main(["report", str(run_dir)]) == 2
    assert capsys.readouterr().err == (
        f"sglang-mixgraph ab: run directory {run_dir}: cannot write {run_dir / 'report.md'}: "
        f"{os.strerror(code)}; the run directory is read-only (an archived run?): copy it "
        "somewhere writable and run `sglang-mixgraph ab report` on the copy\n"
    )
    assert _report_files(run_dir) == before


def test_accuracy_below_threshold_and_lost_cells_fail_the_report(run_dir, capsys):
    gsm8k_raw = _gsm8k_raw(run_dir, "split")
    metrics = json.loads(gsm8k_raw.read_text())
    gsm8k_raw.write_text(json.dumps({**metrics, "score": 0.5}))
    lost = next((run_dir / "cells" / "baseline").glob("chat_c00008_r1_*.cell.json"))
    lost.unlink()
    assert ab_cli.main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "GSM8K arm 'split': accuracy 0.500 is below the threshold 0.7" in err
    assert "arm=baseline shape=chat concurrency=8 repeat=2: missing: not run" in err
    text = (run_dir / "report.md").read_text()
    assert "**Result: FAIL**" in text
    assert (
        "| `split` | 0.500 [0.332, 0.668] | 30 | 0.7 (no_regression) | upper bound 0.668 < 0.7 "
        "| FAIL |"
    ) in text
    # The interval of concurrency 8 now rests on two repeats of the baseline.
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "FAIL"  # a failure outweighs what is missing
    assert results["summary"]["baseline"]["chat/8"]["median_tpot_ms"]["n"] == 2
    assert results["ratios_vs_baseline"]["split"]["chat/8"]["median_tpot_ms"]["n"] == 2


def test_cells_not_measured_yet_make_the_report_incomplete(run_dir, capsys):
    for path in (run_dir / "cells" / "split").glob("chat_c00008_r2_*"):
        path.unlink()  # as if the run was stopped before this cell
    assert ab_cli.main(["report", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "INCOMPLETE"
    text = (run_dir / "report.md").read_text()
    assert "**Result: INCOMPLETE** (2 not measured yet, listed below;" in text
    assert "- arm=split shape=chat concurrency=8 repeat=3: missing: not run" in text
    # The goodput gate at concurrency 8 waits for the cell rather than judging two repeats.
    gate = "request_goodput split/baseline at concurrency 8 of shape chat >= 1x"
    assert f"- gate {gate}: not measured yet" in text
    assert f"| {gate} | " in text
    assert "| no_regression | not measured yet | not measured yet |" in text
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["status"], results["problems"], len(results["missing"])) == (
        "INCOMPLETE",
        [],
        2,
    )
    assert results["gates"][1]["passed"] is None  # not judged; the other gate is
    assert results["gates"][0]["passed"] is True


def test_committed_ratio_intervals_are_positive_and_hold_their_ratio():
    results = json.loads((EXAMPLE_RUN / "results.json").read_text())
    by_point = results["ratios_vs_baseline"]["split"]
    assert len(by_point) == 2 * 4  # two shapes, three concurrencies and a rate
    for point, by_metric in by_point.items():
        # The stand-in has no speculative decoding: bench_serving records no accept length.
        expected = {key for key, _, _ in METRICS} - {*GOODPUT_METRICS, "accept_length"}
        assert expected <= set(by_metric), point
        for e in by_metric.values():
            # Equal values in every pair (everything within the SLOs) give [1, 1].
            assert 0 < e["low"] <= e["mean"] <= e["high"], (point, e)
    assert by_point["chat/8"]["output_throughput_per_gpu"]["low"] > 1
    text = (EXAMPLE_RUN / "report.md").read_text()
    # no negative bound anywhere in the report but a difference of GSM8K scores
    # only the GSM8K difference reaches below 0 (its table row, and the headline's last part)
    negative = [line for line in text.splitlines() if "[-" in line and line.startswith("|")]
    assert "; GSM8K +0.0 points [-21.0, +21.0]." in text
    assert negative == ["| `split` - `baseline` | +0.000 [-0.210, +0.210] |"]
    gsm8k = results["gsm8k"]["split"]
    assert (gsm8k["n"], gsm8k["low"], gsm8k["high"]) == (
        30,
        pytest.approx(0.5907167384187784),  # scipy's binomtest(23, 30) Wilson interval
        pytest.approx(0.8820761185551049),
    )


def _set(run_dir: Path, section: str, **values) -> None:
    data = json.loads((run_dir / "run.json").read_text())
    target = data["config"][section]
    (target[0] if isinstance(target, list) else target).update(values)
    (run_dir / "run.json").write_text(json.dumps(data))


def test_gates_and_the_threshold_are_judged_on_the_stated_bound(run_dir, capsys):
    # The committed throughput gate's ratio and GSM8K 0.767 [0.591, 0.882] (23 of 30).
    ratio = json.loads((EXAMPLE_RUN / "results.json").read_text())["gates"][0]["ratio"]
    mean, low, high = ratio["mean"], ratio["low"], ratio["high"]
    assert low < mean < high
    shown = f"{mean:.3f}x [{low:.3f}, {high:.3f}]"
    between_mean_and_high = round((mean + high) / 2, 4)
    _set(run_dir, "gate", min_ratio=between_mean_and_high)
    _set(run_dir, "gsm8k", threshold=0.85)
    assert ab_cli.main(["report", str(run_dir)]) == 0  # within the noise: not a regression
    text = (run_dir / "report.md").read_text()
    assert (
        "| output_throughput_per_gpu split/baseline at concurrency 32 of shape chat >= "
        f"{between_mean_and_high:g}x | {shown} | no_regression | upper bound {high:.3f}x >= "
        f"{between_mean_and_high:g}x | pass |"
    ) in text
    assert "| 0.85 (no_regression) | upper bound 0.882 >= 0.85 | pass |" in text
    _set(run_dir, "gate", judge="mean")
    _set(run_dir, "gsm8k", judge="mean")
    assert ab_cli.main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert f"FAILED at {shown} (value {mean:.3f}x < {between_mean_and_high:g}x)" in err
    assert "accuracy 0.767 is below the threshold 0.85 (value 0.767 < 0.85;" in err
    between_low_and_mean = round((low + mean) / 2, 4)
    _set(run_dir, "gate", judge="confirmed", min_ratio=between_low_and_mean)
    _set(run_dir, "gsm8k", judge="confirmed", threshold=0.6)
    assert ab_cli.main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert f"(lower bound {low:.3f}x < {between_low_and_mean:g}x)" in err
    assert "(lower bound 0.591 < 0.6;" in err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["gates"][0]["judge"] == "confirmed" and results["gates"][0]["passed"] is False


def test_a_failed_gate_fails_the_report(run_dir, capsys):
    data = json.loads((run_dir / "run.json").read_text())
    data["config"]["gate"][0]["min_ratio"] = 5.0  # the stand-in's split is not 5x faster
    (run_dir / "run.json").write_text(json.dumps(data))
    assert ab_cli.main(["report", str(run_dir)]) == 1
    assert "split/baseline at concurrency 32 of shape chat >= 5x: FAILED at" in (
        capsys.readouterr().err
    )


def test_committed_csv_rows_are_the_results(run_dir):
    results = json.loads((EXAMPLE_RUN / "results.json").read_text())
    rows = list(csv.DictReader(io.StringIO((EXAMPLE_RUN / "results.csv").read_text())))
    assert len(rows) == 2 * 2 * 4  # arms x shapes x load points
    for row in rows:
        load = row["concurrency"] or f"rate={float(row['request_rate']):g}"
        key = f"{row['shape']}/{load}"
        summary = results["summary"][row["arm"]][key]
        assert int(row["repeats"]) == summary["median_tpot_ms"]["n"] == 3
        for metric in ("output_throughput_per_gpu", "p99_ttft_ms", "request_goodput"):
            assert float(row[metric]) == pytest.approx(summary[metric]["mean"])
            assert float(row[f"{metric}_low"]) == pytest.approx(summary[metric]["low"])
        ratio = results["ratios_vs_baseline"].get(row["arm"], {}).get(key, {})
        tpot = ratio.get("median_tpot_ms")
        if tpot is None:
            assert row["arm"] == "baseline" and row["median_tpot_ms_ratio"] == ""
        else:
            assert float(row["median_tpot_ms_ratio_high"]) == pytest.approx(tpot["high"])


def test_committed_goodput_follows_the_slo(run_dir):
    """TPOT limit 18.5 ms: the baseline (12 + 0.25 per request in flight) passes it up to
    concurrency 8 and not at 32 (20 ms), the split (9 + 0.25 x 32 = 17 ms) at every one."""
    results = json.loads((EXAMPLE_RUN / "results.json").read_text())
    assert results["slo_ms"] == {"ttft_ms": 500, "tpot_ms": 18.5}
    attained = results["summary"]["baseline"]
    assert attained["chat/8"]["slo_attainment"]["mean"] == 1.0
    assert attained["chat/32"]["slo_attainment"]["mean"] == 0.0
    assert results["summary"]["split"]["chat/32"]["slo_attainment"]["mean"] == 1.0
    assert results["within_slo"]["baseline"]["chat"] == 8
    assert results["within_slo"]["split"]["chat"] == 32
    assert "request_goodput" not in results["ratios_vs_baseline"]["split"]["chat/32"]
    text = (EXAMPLE_RUN / "report.md").read_text()
    assert "Highest concurrency with at least 99% of requests within the SLOs" in text
    # The baseline's goodput at concurrency 32 is 0 in two of three repeats: no ratio over
    # zero, `-` in the table (not 30.427x [0.001, 874045.847] from the one pair left).
    ratios = results["ratios_vs_baseline"]["split"]["chat/32"]
    assert "request_goodput" not in ratios and "slo_attainment" not in ratios
    row = next(
        line
        for line in text.splitlines()
        if line.startswith("|  | `split` / ") and "0.850x [0.850, 0.850]" in line
    )
    assert row.endswith("| - | - | |")
    assert " of 3 pairs)" not in text


def test_intervals_are_bounded_and_each_candidate_has_a_headline():
    text = (EXAMPLE_RUN / "report.md").read_text()
    # the baseline's goodput at concurrency 32: 5.27 ± 17.5 reaches below 0, cut there
    assert "| 5.27 [0, 22.7] | 3.3% [0.0, 14.3] |" in text and "± 17.5" not in text
    assert "99.8% [99.1, 100.0]" in text  # an attainment interval stops at 100%
    headline = text.split("## Setup")[0].strip().splitlines()[-1]
    assert headline == (
        "`split` against `baseline`: output tok/s per GPU 1.161x [1.148, 1.173] the "
        "baseline's at c=32 of `chat`; 1.006x to 1.276x over its 8 load points; "
        "GSM8K +0.0 points [-21.0, +21.0]."
    )


def test_a_ratio_interval_wider_than_a_hundredfold_is_not_printed_as_bounds():
    from sglang_mixgraph.ab.stats import RatioEstimate

    wide = RatioEstimate(log_mean=3.4, log_ci95=10.0, n=2, pairs=2, blocks=())
    assert report._ratio(wide) == "29.964x [no bound: the 2 pairs disagree by over 100x]"
    narrow = RatioEstimate(log_mean=0.0, log_ci95=0.1, n=3, pairs=3, blocks=())
    assert report._ratio(narrow) == "1.000x [0.905, 1.105]"


def test_ratio_plot_caption_says_what_is_drawn():
    assert report.ratio_plot_caption(True) == "error bars: 95% interval"
    assert "no error bars" in report.ratio_plot_caption(False)


def test_readme_example_is_the_example_config():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    shown = parse_config(tomllib.loads(block))
    example = parse_config(tomllib.loads((ROOT / "examples" / "ab_dsv4.toml").read_text()))
    assert shown.arms == example.arms and shown.gates == example.gates
    assert shown.server.args == example.server.args and shown.server.env == example.server.env
    assert shown.sweep.concurrencies == example.sweep.concurrencies
    assert shown.gsm8k.threshold == example.gsm8k.threshold


def test_each_visits_server_log_gives_its_prefill_steps(run_dir):
    """SGLang's prefill batch lines in a launched visit's log: the steps counted, replayed and
    MIXED, and the time between back-to-back MIXED steps per kind, in the report and the JSON;
    a log without such lines (the stand-in's) gives no row."""
    config = json.loads((run_dir / "run.json").read_text())["config"]
    baseline, candidate = (a["name"] for a in config["arm"][:2])

    def line(gap_ms: float, replayed: bool, queued: int = 9) -> str:
        return (
            f"[t] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, #running-req: 4, "
            f"#queue-req: {queued}, #pending-token: 0, cuda graph: {replayed}, input throughput "
            f"(token/s): {512 / gap_ms * 1000:.2f}"
        )

    servers = run_dir / "servers"
    servers.mkdir()
    (servers / f"{baseline}_1.log").write_text("\n".join([line(250, False)] * 5) + "\n")
    (servers / f"{candidate}_1.log").write_text("\n".join([line(100, True)] * 4) + "\n")
    (servers / f"{candidate}_2.log").write_text("INFO: stand-in listening\n")
    report.build(run_dir)
    rows = json.loads((run_dir / "results.json").read_text())["server_steps"]
    assert [(r["arm"], r["visit"], r["prefill_batches"], r["replayed"]) for r in rows] == [
        (baseline, "1", 5, 0),
        (candidate, "1", 4, 4),
    ]
    assert rows[0]["eager_mixed_apart_ms"] == pytest.approx(250, abs=0.01)
    assert rows[1]["replayed_mixed_apart_ms"] == pytest.approx(100, abs=0.01)
    assert rows[1]["eager_mixed_apart_ms"] is None
    assert rows[0]["largest_burst"] is None  # no decode log interval of 1 in its log
    text = (run_dir / "report.md").read_text()
    assert "## Prefill steps as each server logged them" in text
    assert f"| `{candidate}` | 1 | 4 | 4 | 4 | - | 100.0 (3) | - |" in text


def test_a_visit_that_logged_every_decode_step_gives_its_bursts_phases(run_dir):
    """At --decode-log-interval 1 (as SGLang prints its server_args) the visit's largest burst:
    the prefill phase, the decode tail after it and the prefill share."""
    config = json.loads((run_dir / "run.json").read_text())["config"]
    baseline = config["arm"][0]["name"]

    def prefill(gap_ms: float, running: int, tokens: int = 512) -> str:
        return (
            f"[t] Prefill batch, #new-seq: 1, #new-token: {tokens}, #cached-token: 0, "
            f"#running-req: {running}, #queue-req: 3, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): {tokens / gap_ms * 1000:.4f}"
        )

    def decode(step_ms: float) -> str:
        return (
            f"[t] Decode batch, #running-req: 4, #full token: 256, full token usage: 0.00, "
            f"cuda graph: True, gen throughput (token/s): {4 / step_ms * 1000:.4f}, #queue-req: 0"
        )

    small = [prefill(9, 0, tokens=30), decode(5), decode(5)]  # the server's warm-up request
    load = [prefill(999, 0), prefill(300, 4), prefill(300, 4), decode(1e5), decode(100)]
    log = [*small, *load, *small]
    servers = run_dir / "servers"
    servers.mkdir()
    args = "server_args=ServerArgs(..., 'decode_log_interval': {}, ...)"
    (servers / f"{baseline}_1.log").write_text("\n".join([args.format(1), *log]) + "\n")
    (servers / f"{baseline}_2.log").write_text("\n".join([args.format(40), *log]) + "\n")
    # a resumed run served the cell again: the later of two equal bursts is the visit's
    again = [prefill(999, 0), prefill(500, 4), prefill(500, 4), decode(1e5), decode(100)]
    (servers / f"{baseline}_3.log").write_text("\n".join([args.format(1), *again, *log]))
    report.build(run_dir)
    rows = json.loads((run_dir / "results.json").read_text())["server_steps"]
    burst = rows[0]["largest_burst"]
    assert burst["prefill_tokens"] == 3 * 512
    assert burst["prefill_phase_s"] == pytest.approx(0.6, rel=1e-3)
    assert burst["decode_tail_s"] == pytest.approx(0.1, rel=1e-3)
    assert burst["prefill_share"] == pytest.approx(0.6 / 0.7, rel=1e-3)
    assert rows[1]["largest_burst"] is None  # every 40th decode step: no tail to sum
    assert rows[2]["largest_burst"]["prefill_phase_s"] == pytest.approx(0.6, rel=1e-3)
    text = (run_dir / "report.md").read_text()
    assert f"| `{baseline}` | 1 | 5 | 0 | 2 | 300.0 (2) | - | 0.60 + 0.10 s (0.857) |" in text
