"""`plan`'s text leads with what SGLang will do, then the capture estimate of a list SGLang
captures (labelled with what it was fitted on), then the advice and one line per switch of
each patch that is off; a verdict for a GPU the estimate was never measured on says so
instead of "does not fit", and a model it was not fitted on gets SGLang's own budget and no
verdict. Run in this process (`cli.main`), one plan per test.
"""

from __future__ import annotations

import json

import pytest

from sglang_mixgraph import cli
from sglang_mixgraph.core.capture_memory import CALIBRATION, not_calibrated_for
from sglang_mixgraph.kits.model_configs import write_model
from sglang_mixgraph.patches import all_patches
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

SECTIONS = ("What SGLang will do on ", "Capture estimate", "Advice:", "Patches:")


def _plan(capsys, *args: str) -> tuple[str, dict]:
    """The text of `plan ARGS` and its --json, both in this process."""
    assert cli.main(["plan", *args]) == 0
    text = capsys.readouterr().out
    assert cli.main(["plan", "--json", *args]) == 0
    return text, json.loads(capsys.readouterr().out)


def _section_starts(lines: list[str]) -> list[int]:
    return [next(i for i, line in enumerate(lines) if line.startswith(s)) for s in SECTIONS]


def _switch_lines(text: str, report: dict) -> None:
    """One `with FLAG=value:` line per switch of each patch that is off, and none for others."""
    switches = {p.id: [f.name for f in p.switches] for p in all_patches()}
    shown = [line for line in text.splitlines() if line.startswith("    with ")]
    assert len(shown) == sum(len(p.get("if_on", {})) for p in report["patches"])
    for patch in report["patches"]:
        names = switches[patch["id"]]
        if patch["status"] == "off":
            assert set(patch["if_on"]) == {f"{n}={v}" for n, v in _on_values(names).items()}
            for setting, what in patch["if_on"].items():
                assert f"    with {setting}: {what}" in shown
        else:
            assert "if_on" not in patch


def _on_values(names: list[str]) -> dict[str, str]:
    return {n: ("auto" if n == "SGLANG_MIXGRAPH_PREFILL_BUCKETS" else "1") for n in names}


def test_calibration_names_the_model_and_gpu_it_was_not_fitted_on():
    assert (CALIBRATION.gpus, CALIBRATION.architectures) == (
        ("H200", "H100"),
        ("DeepseekV4ForCausalLM",),
    )
    assert not_calibrated_for(["DeepseekV4ForCausalLM"], "H200") is None
    assert not_calibrated_for(["DeepseekV4ForCausalLM"], "H100") is None
    assert not_calibrated_for(["DeepseekV4ForCausalLM"], "B300") == "the B300"
    assert not_calibrated_for(["GlmMoeDsaForCausalLM"], "H200") == "GlmMoeDsaForCausalLM"
    assert (
        not_calibrated_for(["GlmMoeDsaForCausalLM"], "B200") == "GlmMoeDsaForCausalLM on the B200"
    )


def test_a_prefill_graph_that_is_off_gets_no_capture_verdict(plan_env, capsys):
    # The reference: upstream's DeepSeek-V4 rule turns the prefill graph off.
    text, report = _plan(capsys)
    lines = text.splitlines()
    starts = _section_starts(lines)
    assert starts == sorted(starts), starts  # decision, estimate, advice, patches
    decision = lines[starts[0] : starts[1]]
    assert any(
        line.startswith("  Prefill graph: OFF (disabled), decided by upstream rule")
        for line in decision
    )
    assert any("none captured (the prefill graph is off" in line for line in decision)
    assert lines[starts[1]].startswith("Capture estimate: none")
    # the list SGLang never captures is given no fit or miss, and no margin
    assert "does not fit" not in text and "margin" not in text
    graph = report["graph"]
    assert graph["capture_memory"]["captured"] is False
    assert graph["prefill_graph"]["backend"] == "disabled"
    # the advice compares what the lists would need with the graph on
    advice = lines[starts[2] : starts[3]]
    assert any(line.startswith("    upstream: 45 buckets") for line in advice)
    assert any(line.startswith("    derived : 10 buckets") for line in advice)
    _switch_lines(text, report)
    force = report["patches"][[p["id"] for p in report["patches"]].index("graph_config")]
    assert force["if_on"]["SGLANG_EXPERIMENTAL_FORCE_BCG=1"].startswith(
        "overrides 'DeepSeek-V4 (heavy capture-pool memory pressure)'"
    )


@pytest.mark.parametrize("model", ["glm5", "dense"])
def test_a_model_the_estimate_was_not_fitted_on_gets_sglangs_budget_and_no_verdict(
    plan_env, capsys, tmp_path, model
):
    """GLM-5 on the B300 (its reference launch) and a plain dense model at tp 2 on the H100
    (SGLang's default breakable prefill graph): the activation term was fitted on
    DeepSeek-V4-Pro's stack, so no fit verdict, no memory advice, no capture figure; SGLang's
    own budget instead."""
    if model == "glm5":
        args, arch = ("--preset", "glm5"), "GlmMoeDsaForCausalLM"
    else:
        path = write_model(tmp_path / "dense")
        args, arch = (
            ("--model-path", str(path), "--tp", "2", "--target-gpu", "H100"),
            ("LlamaForCausalLM"),
        )
    text, report = _plan(capsys, *args)
    lines = text.splitlines()
    starts = _section_starts(lines)
    assert any(line.startswith("  Prefill graph: ON (breakable)") for line in lines[: starts[1]])
    assert lines[starts[1]] == (
        f"Capture estimate: none: the capture estimate does not apply to {arch} (fitted on "
        "DeepSeek-V4-Pro on the H200 and the H100 only): no fit verdict, no memory advice"
    )
    assert lines[starts[1] + 1].startswith("  SGLang's own budget: mem_fraction_static ")
    for word in ("does not fit", "over the available", "within the available", "to fit the"):
        assert word not in text, word
    assert "capture not estimated for this model" in lines[starts[2] + 2]
    cm = report["graph"]["capture_memory"]
    assert cm["applies"] is False and cm["captured"] is True
    assert not {"estimate", "verdict", "advice"} & set(cm)
    assert 0 < cm["budget"]["mem_fraction_static"] < 1 and cm["budget"]["outside_static_bytes"] > 0
    assert any(line.startswith("  memory: mem_fraction_static ") for line in lines[: starts[1]])
    _switch_lines(text, report)


def test_a_calibrated_verdict_on_the_h200_is_a_plain_fit(plan_env, capsys):
    plan_env.setenv("SGLANG_MIXGRAPH_PREFILL_BUCKETS", "auto")
    text, report = _plan(capsys, "--target-gpu", "H200")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Capture estimate"))
    assert lines[start] == "Capture estimate (fitted on DeepSeek-V4-Pro on the H200 and the H100):"
    verdict = report["graph"]["capture_memory"]["verdict"]
    assert verdict["calibrated"] is True
    assert f"-> {'fits' if verdict['fits'] else 'does not fit'} (needs" in lines[start + 1]
    graph_config = next(p for p in report["patches"] if p["id"] == "graph_config")
    assert graph_config["status"] == "active" and "if_on" not in graph_config
    assert isinstance(report["graph"]["flags"]["SGLANG_EXPERIMENTAL_FORCE_BCG"], bool)
    assert report["schema_version"] == 1


def test_what_the_split_would_do_follows_the_deployment(plan_env, capsys, tmp_path):
    """In this process, what `plan` says of the split where it is off (the fresh-process twin is
    test_cli.py's test_plan_says_what_the_mixed_split_would_do, in the slow tier)."""

    def split_if_on(*args: str) -> str:
        (patch,) = [p for p in _plan(capsys, *args)[1]["patches"] if p["id"] == "mixed_split"]
        return patch["if_on"]["SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1"]

    eager = split_if_on()  # upstream's DeepSeek-V4 rule turns the prefill graph off
    assert eager.startswith("splits mixed steps") and "in eager steps" in eager
    plan_env.setenv("SGLANG_MIXGRAPH_PREFILL_BUCKETS", "auto")
    assert "split inside the replay's attention break" in split_if_on()
    plan_env.delenv("SGLANG_MIXGRAPH_PREFILL_BUCKETS")
    trtllm = split_if_on(
        "--model-path", str(DSV4_MODEL_DIR), "--tp", "8", "--dsv4-attn-backend", "trtllm"
    )
    assert trtllm.startswith("falls back to upstream: trtllm")
    dense = split_if_on("--model-path", str(write_model(tmp_path / "dense")))
    assert dense == "not a DeepSeek-V4 model: nothing to split"
