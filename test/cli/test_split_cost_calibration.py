"""`plan` and `doctor` say where the mixed_split patch's cost-model coefficients come from: the
calibration file and its architecture, the per-layer, eager and step terms' sources, in the
text with --verbose (a line or a few per source; plan's default text has one line naming the
GPU measured, no paths) and as typed fields in `--json`. In this process (`cli.main`).
"""

from __future__ import annotations

import json

import pytest

from sglang_mixgraph import cli
from sglang_mixgraph.core import split_cost_model as scm

HEADING = "Split cost model (mixed_split, adaptive policy) on the "


def _run(capsys, *args: str) -> tuple[str, dict]:
    """The verbose text and the JSON of one command."""
    assert cli.main([*args, "--verbose"]) in (0, 1)  # doctor exits 1 on problems unrelated
    text = capsys.readouterr().out
    cli.main([args[0], "--json", *args[1:]])
    return text, json.loads(capsys.readouterr().out)


def _source_lines(text: str, start: str) -> str:
    """The calibration block starting at the line that starts with ``start``, joined."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(start))
    block = [lines[i]]
    indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
    for line in lines[i + 1 :]:
        if len(line) - len(line.lstrip()) < indent:
            break
        block.append(line.strip())
    return " ".join(block)


def _words(source: str) -> list[str]:
    """A source's words as the text shows them (commands in backquotes are left to the JSON)."""
    import re

    return re.sub(r",? `[^`]*`", "", source).split()


def test_plan_names_the_calibration_and_each_source_on_the_h200(plan_env, capsys):
    text, report = _run(capsys, "plan", "--target-gpu", "H200")
    shipped = scm.load_coefficients("sm90")
    info = report["graph"]["split_cost_calibration"]
    assert info == json.loads(json.dumps(scm.calibration_info(shipped)))
    assert info["arch"] == "sm90" and info["file"].endswith("split_cost_sm90.json")
    assert info["step"]["fitted"] is True
    assert info["step"]["terms"] == pytest.approx(dict(shipped.step_terms()))
    assert "mixed_steady_state" in info["step"]["source"]
    # the text: between the capture estimate and the advice, the file and every source
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(HEADING))
    assert lines[head] == HEADING + "H200:"
    capture = next(i for i, line in enumerate(lines) if line.startswith("Capture estimate"))
    advice = lines.index("Advice:")
    assert capture < head < advice
    block = " ".join(line.strip() for line in lines[head + 1 : advice])
    assert "calibration sm90: " + info["file"] in block
    for key in ("per_layer", "eager", "step"):
        assert " ".join(_words(info[key]["source"])) in block, key
    assert "fitted" in block and "NOT fitted" not in block


def test_plan_on_a_gpu_without_a_file_names_the_fallback_and_its_margin(plan_env, capsys):
    text, report = _run(capsys, "plan")  # the B300 (SM103): no calibration file of its own
    info = report["graph"]["split_cost_calibration"]
    assert info["arch"] == "sm103 (fallback: sm90)"
    assert info["margin"] == scm.UNKNOWN_ARCH_MARGIN
    assert HEADING + "B300:" in text.splitlines()
    block = _source_lines(text, "  calibration ")
    assert "calibration sm103 (fallback: sm90): " + info["file"] in block
    assert "split only for a predicted gain of at least 10%" in block
    # without --verbose: one line, the GPU measured and the borrowing, no paths
    assert cli.main(["plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [x for x in lines if x.startswith(HEADING)]
    assert line == HEADING + (
        "B300: calibrated on the NVIDIA H200 (sm90), borrowed: sm103 has no calibration of its "
        "own; splits only for a predicted gain of at least 10% (sources: --verbose)"
    )
    assert not any(x.startswith("  calibration ") for x in lines)


def test_plan_of_a_model_the_split_does_not_touch_has_no_calibration(plan_env, capsys):
    text, report = _run(capsys, "plan", "--preset", "glm5")
    assert report["graph"]["split_cost_calibration"] is None
    assert HEADING not in text


def test_doctor_shows_the_split_patchs_calibration(plan_env, capsys):
    text, report = _run(capsys, "doctor")
    entry = next(p for p in report["patches"] if p["id"] == "mixed_split")
    expected = scm.calibration_info(scm.load_coefficients(scm.detect_arch()))
    assert entry["calibration"] == json.loads(json.dumps(expected))
    assert all("calibration" not in p for p in report["patches"] if p["id"] != "mixed_split")
    block = _source_lines(text, "      calibration ")
    assert entry["calibration"]["arch"] in block
    for key in ("per_layer", "step"):
        assert " ".join(_words(entry["calibration"][key]["source"])) in block, key
    # --verbose also shows every target's signature
    for target in entry["targets"]:
        assert f"      [ok ] {target['target']}: {target['found']}" in text.splitlines()
