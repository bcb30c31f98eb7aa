"""The report of `sglang-mixgraph ab`, rebuilt from recorded raw outputs.

`docs/results/ab_example/` is a run directory the tool wrote against the stand-in server
(SGLang's real bench_serving and GSM8K eval); its report.md and results.json are the golden
files. Rebuilding from its raw outputs must reproduce them, its numbers must be the raw
outputs' own, and a result that changes (an accuracy under the threshold, a lost cell) must
turn the verdict and the exit status.
"""

from __future__ import annotations

import json
import shutil
import statistics
import struct
import sys
import tomllib
from pathlib import Path

import pytest

from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.ab import report
from sglang_mixgraph.ab.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
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


def _raw_lines(run_dir: Path) -> dict[tuple[str, int, int], dict]:
    lines = {}
    for path in (run_dir / "cells").glob("*/*.jsonl"):
        conc, rep = path.name.split("_")[:2]
        lines[(path.parent.name, int(conc[1:]), int(rep[1:]))] = json.loads(
            path.read_text().splitlines()[-1]
        )
    return lines


def test_rebuild_reproduces_the_committed_report(run_dir):
    assert report.build(run_dir)[0].passed
    assert (run_dir / "report.md").read_text() == (EXAMPLE_RUN / "report.md").read_text()
    assert json.loads((run_dir / "results.json").read_text()) == json.loads(
        (EXAMPLE_RUN / "results.json").read_text()
    )


def test_numbers_are_the_raw_outputs_own(run_dir):
    built, _ = report.build(run_dir)
    raw = _raw_lines(run_dir)
    gpus = built.config.server.gpus
    for arm in ("baseline", "split"):
        for conc in built.config.sweep.concurrencies:
            reps = range(built.config.sweep.repeats)
            tpot = [raw[(arm, conc, r)]["median_tpot_ms"] for r in reps]
            assert built.summary[arm][conc]["median_tpot_ms"].mean == pytest.approx(
                statistics.fmean(tpot)
            )
            tput = [raw[(arm, conc, r)]["output_throughput"] / gpus for r in reps]
            assert built.summary[arm][conc]["output_throughput_per_gpu"].mean == pytest.approx(
                statistics.fmean(tput)
            )
    ratios = [
        raw[("split", 32, r)]["p99_itl_ms"] / raw[("baseline", 32, r)]["p99_itl_ms"]
        for r in range(built.config.sweep.repeats)
    ]
    # The ratio is the geometric mean of the paired ratios (the exp of their mean log).
    assert built.ratios["split"][32]["p99_itl_ms"].mean == pytest.approx(
        statistics.geometric_mean(ratios)
    )
    for arm in ("baseline", "split"):
        score = json.loads(_gsm8k_raw(run_dir, arm).read_text())["score"]
        assert built.gsm8k[arm]["score"] == score


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


def test_accuracy_below_threshold_and_lost_cells_fail_the_report(run_dir, capsys):
    gsm8k_raw = _gsm8k_raw(run_dir, "split")
    metrics = json.loads(gsm8k_raw.read_text())
    gsm8k_raw.write_text(json.dumps({**metrics, "score": 0.5}))
    lost = next((run_dir / "cells" / "baseline").glob("c00008_r1_*.cell.json"))
    lost.unlink()
    assert ab_cli.main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "GSM8K arm 'split': accuracy 0.500 is below the threshold 0.7" in err
    assert "arm=baseline concurrency=8 repeat=2: missing: not run" in err
    text = (run_dir / "report.md").read_text()
    assert "**Result: FAIL**" in text
    assert (
        "| `split` | 0.500 [0.332, 0.668] | 30 | 0.7 (no_regression) | upper bound 0.668 < 0.7 "
        "| FAIL |"
    ) in text
    # The interval of concurrency 8 now rests on two repeats of the baseline.
    results = json.loads((run_dir / "results.json").read_text())
    assert results["summary"]["baseline"]["8"]["median_tpot_ms"]["n"] == 2
    assert results["ratios_vs_baseline"]["split"]["8"]["median_tpot_ms"]["n"] == 2


def test_committed_ratio_intervals_are_positive_and_hold_their_ratio():
    results = json.loads((EXAMPLE_RUN / "results.json").read_text())
    ratios = [
        e for by_c in results["ratios_vs_baseline"].values() for by_m in by_c.values()
        for e in by_m.values()
    ]  # fmt: skip
    assert len(ratios) == 3 * 8
    for e in ratios:
        assert 0 < e["low"] < e["mean"] < e["high"], e
    text = (EXAMPLE_RUN / "report.md").read_text()
    assert "[-" not in text  # no negative bound anywhere in the report
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
    # split/baseline throughput at 32: 1.156x [1.143, 1.170]; GSM8K 0.767 [0.591, 0.882].
    _set(run_dir, "gate", min_ratio=1.16)
    _set(run_dir, "gsm8k", threshold=0.85)
    assert ab_cli.main(["report", str(run_dir)]) == 0  # within the noise: not a regression
    text = (run_dir / "report.md").read_text()
    assert (
        "| output_throughput_per_gpu split/baseline at concurrency 32 >= 1.16x | "
        "1.156x [1.143, 1.170] | no_regression | upper bound 1.170x >= 1.16x | pass |"
    ) in text
    assert "| 0.85 (no_regression) | upper bound 0.882 >= 0.85 | pass |" in text
    _set(run_dir, "gate", judge="mean")
    _set(run_dir, "gsm8k", judge="mean")
    assert ab_cli.main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "FAILED at 1.156x [1.143, 1.170] (value 1.156x < 1.16x)" in err
    assert "accuracy 0.767 is below the threshold 0.85 (value 0.767 < 0.85;" in err
    _set(run_dir, "gate", judge="confirmed", min_ratio=1.15)
    _set(run_dir, "gsm8k", judge="confirmed", threshold=0.6)
    assert ab_cli.main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert "(lower bound 1.143x < 1.15x)" in err
    assert "(lower bound 0.591 < 0.6;" in err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["gates"][0]["judge"] == "confirmed" and results["gates"][0]["passed"] is False


def test_a_failed_gate_fails_the_report(run_dir, capsys):
    data = json.loads((run_dir / "run.json").read_text())
    data["config"]["gate"][0]["min_ratio"] = 5.0  # the stand-in's split is not 5x faster
    (run_dir / "run.json").write_text(json.dumps(data))
    assert ab_cli.main(["report", str(run_dir)]) == 1
    assert "split/baseline at concurrency 32 >= 5x: FAILED at" in capsys.readouterr().err


def test_readme_example_is_the_example_config():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    shown = parse_config(tomllib.loads(block))
    example = parse_config(tomllib.loads((ROOT / "examples" / "ab_dsv4.toml").read_text()))
    assert shown.arms == example.arms and shown.gates == example.gates
    assert shown.server.args == example.server.args and shown.server.env == example.server.env
    assert shown.sweep.concurrencies == example.sweep.concurrencies
    assert shown.gsm8k.threshold == example.gsm8k.threshold
