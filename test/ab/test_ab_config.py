"""`sglang-mixgraph ab`: configuration, arm checks, plan order, cell keys, statistics, invoker."""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import shlex
import shutil
import statistics
import sys
import time
import tomllib
from pathlib import Path

import pytest
from ab_kit import sharegpt_text
from pydantic import ValidationError

from sglang_mixgraph.ab import arms, config_schema, runner
from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.ab.config import (
    CONCURRENCY,
    ConfigError,
    Point,
    cell_settings,
    gsm8k_settings,
    parse_config,
    read_toml,
    settings_key,
)
from sglang_mixgraph.ab.results import judge_bounds
from sglang_mixgraph.ab.server import ServerError, launch_argv, launch_problems
from sglang_mixgraph.ab.stats import estimate, paired_ratio, t975, t_quantile, wilson
from sglang_mixgraph.ab.tools import TIMED_OUT, bench_argv, subprocess_invoker
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ab_dsv4.toml"
RAW = tomllib.loads(EXAMPLE.read_text())


SHARED_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK=2816"
OWN_ENV = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"
DEVICE = "bash tools/gpu-upstream/device.sh"


# The lines of an arm's resolved preview under its server line (ab/arm_plans.py).
PREVIEW = ("  resolved on ", "    ")


def _without_previews(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith(PREVIEW)]


def local_model(tmp_path: Path) -> str:
    """A model directory that exists (the example's /models/... is checked before a run) with
    the DeepSeek-V4-Pro-shaped config.json `plan` embeds, which --dry-run resolves each arm on."""
    model = tmp_path / "models" / "DeepSeek-V4-Pro"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(DSV4_MODEL_DIR / "config.json", model / "config.json")
    return str(model)


GATE = {
    "metric": "median_tpot_ms",
    "candidate": "split",
    "baseline": "baseline",
    "concurrency": 64,
    "max_ratio": 1.0,
}
RATES = {"concurrencies": [64], "request_rates": [2.0, 1.5]}


def at(config, concurrency: int, shape: int = 0) -> Point:
    """The load point of `concurrency` in the configuration's `shape`-th shape."""
    return Point(config.sweep.shapes[shape].name, CONCURRENCY, concurrency)


def raw_with(**changes) -> dict:
    """The example configuration with some sections changed (None removes one)."""
    raw = copy.deepcopy(RAW)
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


SHARED_PREFIX = {"num_groups": 4, "prompts_per_group": 8, "system_prompt_len": 1000}


def _shared_prefix_sweep(**keys) -> dict:
    sweep = {k: v for k, v in RAW["sweep"].items() if k not in ("input_len", "output_len")}
    sweep = {k: v for k, v in sweep.items() if k not in ("range_ratio", "prompts_per_concurrency")}
    return {**sweep, "dataset": "generated-shared-prefix", **keys}


def test_example_config_is_the_dsv4_split_experiment():
    config = parse_config(read_toml(EXAMPLE))
    assert [a.name for a in config.arms] == ["baseline", "split"]
    assert config.arm("split").env == {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "1"}
    assert config.sweep.concurrencies[-1] == 2048
    assert config.gsm8k.threshold == 0.93
    assert config.gates[0].candidate == "split" and config.gates[0].min_ratio == 0.98
    assert arms.env_problems(config) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arm": [{"name": "only"}]}, "give at least 2 arms (found 1); one arm: --accuracy-only"),
        ({"arm": [{"name": "a"}, {"name": "a"}]}, "the name 'a' is used twice"),
        ({"arm": [{"name": "a b"}, {"name": "c"}]}, "use letters, digits"),
        ({"arm": [{"name": "a", "colour": 1}, {"name": "b"}]}, "unknown key 'colour'"),
        (
            {"arm": [{"name": "a", "env": {"SGLANG_X": 1}}, {"name": "b"}]},
            "write environment values as strings",
        ),
        ({"sweep": None}, "missing section [sweep]"),
        ({"sweep": {"concurrencies": [8, 8]}}, "a value is listed twice"),
        ({"sweep": {"concurrencies": [0]}}, "concurrencies[0]: must be at least 1"),
        ({"sweep": {"concurrencies": [1], "repeats": True}}, "repeats: expected an integer"),
        ({"server": {"args": ["--model-path", "x"]}}, "give the model as model_path"),
        ({"server": {}}, "model_path: needed to launch arm 'baseline'"),
        ({"gsm8k": {"threshold": 93}}, "[gsm8k] threshold: must be at most 1, got 93"),
        ({"gsm8k": {"arms": ["nope"]}}, "no arm named 'nope'"),
        (
            {"gate": [{"metric": "median_tpot_ms", "candidate": "split", "baseline": "baseline"}]},
            "give concurrency or request_rate (one of them)",
        ),
        (
            {"gate": [{"metric": "tok", "candidate": "split", "baseline": "baseline"}]},
            "metric 'tok': one of",
        ),
        (
            {"gate": [{**GATE, "metric": "request_goodput"}]},
            "metric 'request_goodput': needs the SLOs of an [slo] section",
        ),
        ({"gate": [{**GATE, "request_rate": 2.0}]}, "give concurrency or request_rate"),
        (
            {"gate": [{**GATE, "concurrency": None, "request_rate": 3}], "sweep": RATES},
            "request_rate 3: not in [sweep] request_rates [1.5, 2.0]",
        ),
        (
            {
                "gate": [GATE],
                "shape": [{"input_len": 8, "output_len": 2}, {"input_len": 9, "output_len": 2}],
            },
            "missing key 'shape' (the run has shapes ['in8_out2', 'in9_out2'])",
        ),
        (
            {"gate": [{**GATE, "shape": "long"}]},
            "shape: no shape named 'long'",
        ),
        ({"sweep": {"request_rates": [0]}}, "request_rates[0]: must be a finite number above 0"),
        ({"sweep": {"repeats": 2}}, "missing key 'concurrencies' (or 'request_rates')"),
        (
            {"sweep": {"concurrencies": [1], "num_prompts": 8, "min_prompts": 4}},
            "give num_prompts (a count) or min_prompts, not both",
        ),
        (
            {"sweep": {"concurrencies": [1], "warmup_requests": 8, "warmup_per_concurrency": 1}},
            "give warmup_requests (a count) or warmup_per_concurrency, not both",
        ),
        (
            {"sweep": {"concurrencies": [1], "extra_args": ["--goodput", "ttft:1"]}},
            "--goodput is set by the tool",
        ),
        (
            {
                "sweep": {"concurrencies": [1], "input_len": 8},
                "shape": [{"input_len": 8, "output_len": 2}],
            },
            "[sweep] input_len: with [[shape]] entries, give the lengths there",
        ),
        ({"shape": [{"input_len": 8}]}, "[[shape]] #1: missing key 'output_len'"),
        (
            {"shape": [{"input_len": 8, "output_len": 2}, {"input_len": 8, "output_len": 2}]},
            "[[shape]]: the name 'in8_out2' is used twice",
        ),
        ({"slo": {}}, "[slo]: give at least one of ttft_ms, tpot_ms, e2el_ms"),
        ({"slo": {"itl_ms": 5}}, "[slo]: unknown key 'itl_ms'"),
        ({"slo": {"tpot_ms": -1}}, "[slo] tpot_ms: must be a finite number above 0"),
        (
            {
                "gate": [
                    {
                        "metric": "median_tpot_ms",
                        "candidate": "split",
                        "baseline": "baseline",
                        "concurrency": 3,
                        "max_ratio": 1.0,
                    }
                ]
            },
            "not in [sweep] concurrencies",
        ),
        (
            {
                "gate": [
                    {
                        "metric": "median_tpot_ms",
                        "candidate": "split",
                        "baseline": "baseline",
                        "concurrency": 64,
                    }
                ]
            },
            "give min_ratio, max_ratio or both",
        ),
        (
            {"sweep": _shared_prefix_sweep(extra_args=["--gsp-num-g", "2"])},
            "[sweep] extra_args: --gsp-num-groups is set by [sweep] shared_prefix num_groups",
        ),
    ],
)
def test_bad_configs_are_one_line_errors(change, message):
    for gate in change.get("gate", []):
        for key in [k for k, v in gate.items() if v is None]:
            del gate[key]
    if "shape" in change and "sweep" not in change:
        change = {**change, "sweep": {k: v for k, v in RAW["sweep"].items()
                                      if k not in ("input_len", "output_len")}}  # fmt: skip
    with pytest.raises(ConfigError) as e:
        parse_config(raw_with(**change))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("section", "change", "message"),
    [
        (
            "gsm8k",
            {"threshhold": 0.9},
            "[gsm8k]: unknown key 'threshhold' (known: arms, data_path, enabled, judge, "
            "max_tokens, num_examples, num_shots, parallel, threshold, timeout_s)",
        ),
        ("server", {"gpus": True}, "[server] gpus: expected an integer, got True"),
        ("sweep", {"range_ratio": 1.5}, "[sweep] range_ratio: must be at most 1, got 1.5"),
        ("server", {"args": ["--tp", 8]}, "[server] args[1]: expected a string, got 8"),
        (
            "sweep",
            {"extra_args": ["--max-conc", "1"]},
            "[sweep] extra_args: --max-conc (--max-concurrency) is set by the tool ([slo], "
            "request_rates, concurrencies)",
        ),
        (
            "sweep",
            {"extra_args": ["--disable-tqdm", "--request-r=5"]},
            "[sweep] extra_args: --request-r=5 (--request-rate) is set by the tool ([slo], "
            "request_rates, concurrencies)",
        ),
        (
            "sweep",
            {"extra_args": ["--goodput=ttft:5"]},
            "[sweep] extra_args: --goodput is set by the tool ([slo], request_rates, "
            "concurrencies)",
        ),
    ],
    ids=[
        "unknown key",
        "bool for an int",
        "float out of range",
        "list item type",
        "abbreviated --max-concurrency",
        "abbreviated --request-rate=",
        "--goodput=",
    ],
)
def test_the_schemas_refusals_are_one_exact_line(tmp_path, capsys, section, change, message):
    """pydantic's errors come out as the tool's own line, from the file and on the CLI."""
    raw = raw_with(**{section: {**RAW[section], **change}})
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert str(e.value) == message
    config = tmp_path / "ab.toml"
    config.write_text(_toml(raw))
    argv = ["run", str(config), "--dry-run", "--run-dir", str(tmp_path / "run")]
    assert _one_line_exit_2(argv, capsys) == f"sglang-mixgraph ab: {message}\n"
    assert not (tmp_path / "run").exists()


def test_the_configuration_the_run_uses_is_frozen_and_derived_values_are_no_keys():
    config = parse_config(read_toml(EXAMPLE))
    for part, key in [(config, "note"), (config.sweep, "repeats"), (config.arms[0], "url"),
                      (config.gates[0], "min_ratio"), (config.sweep.shapes[0], "input_len")]:  # fmt: skip
        with pytest.raises(ValidationError, match="frozen"):
            setattr(part, key, None)
    # The shapes and a gate's point are derived, not written in the file.
    with pytest.raises(ConfigError, match=r"^\[sweep\]: unknown key 'shapes'"):
        parse_config(raw_with(sweep={**RAW["sweep"], "shapes": []}))
    with pytest.raises(ConfigError, match=r"^\[\[gate\]\] #1: unknown key 'point'"):
        parse_config(raw_with(gate=[{**RAW["gate"][0], "point": 1}]))


def test_accuracy_only_takes_one_arm_and_needs_a_threshold():
    one_arm = {"arm": [{"name": "candidate", "url": "http://h:1"}], "gsm8k": {"threshold": 0.9}}
    config = parse_config(one_arm, accuracy_only=True)
    visits = runner.plan(config, accuracy_only=True)
    assert [(v.arm.name, [c.kind for c in v.cells]) for v in visits] == [("candidate", ["gsm8k"])]
    with pytest.raises(ConfigError, match="needs enabled = true and a threshold"):
        parse_config({"arm": one_arm["arm"]}, accuracy_only=True)


def test_arms_interleave_a_b_b_a_and_gsm8k_runs_on_first_visits():
    config = parse_config(
        raw_with(
            arm=[{"name": "a"}, {"name": "b"}, {"name": "c"}],
            sweep={"concurrencies": [4, 1], "repeats": 3},
            gate=[],
        )
    )
    visits = runner.plan(config)
    assert [(v.arm.name, v.repeat) for v in visits] == [
        ("a", 0), ("b", 0), ("c", 0), ("c", 1), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("c", 2),
    ]  # fmt: skip
    assert [c.kind for c in visits[0].cells] == ["gsm8k", "bench", "bench"]
    assert [c.concurrency for c in visits[3].cells] == [1, 4]  # ascending, GSM8K done already


def test_cell_keys_follow_what_is_measured():
    config = parse_config(read_toml(EXAMPLE))
    arm = config.arm("split")
    key = settings_key(cell_settings(config, arm, at(config, 64), 0))
    assert key == settings_key(
        cell_settings(parse_config(read_toml(EXAMPLE)), arm, at(config, 64), 0)
    )
    assert key != settings_key(cell_settings(config, arm, at(config, 64), 1))
    assert key != settings_key(cell_settings(config, config.arm("baseline"), at(config, 64), 0))
    longer = parse_config(raw_with(sweep={**RAW["sweep"], "output_len": 2048}))
    assert key != settings_key(cell_settings(longer, longer.arm("split"), at(longer, 64), 0))
    # A threshold or a gate decides pass/fail; it measures nothing.
    stricter = parse_config(raw_with(gsm8k={**RAW["gsm8k"], "threshold": 0.99}, gate=[]))
    assert key == settings_key(cell_settings(stricter, stricter.arm("split"), at(stricter, 64), 0))
    assert settings_key(gsm8k_settings(config, arm)) == settings_key(
        gsm8k_settings(stricter, stricter.arm("split"))
    )


def test_arm_flags_are_checked_against_sglang_and_the_plugin():
    env = {
        "SGLANG_OPT_MIXED_SPLT_DECODE_ATTN": "1",  # typo
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "maybe",  # plugin flag, bad value
        "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK": "abc",  # upstream, bad value
        "SGLANG_SOMETHING_READ_ELSEWHERE": "1",  # allowed below
        "NCCL_DEBUG": "INFO",  # not an SGLang name
    }
    raw = raw_with(arm=[{"name": "baseline"}, {"name": "split", "env": env}], gate=[])
    raw["server"]["allow_env"] = ["SGLANG_SOMETHING_READ_ELSEWHERE"]
    problems = arms.env_problems(parse_config(raw))
    assert len(problems) == 3, problems
    assert all(p.startswith("arm 'split': ") for p in problems)
    expected = (
        "SGLANG_OPT_MIXED_SPLT_DECODE_ATTN is neither an SGLang flag",
        "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN='maybe' is not a valid value",
        "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK='abc' is not a valid value",
    )
    for text in expected:
        assert sum(text in p for p in problems) == 1, (text, problems)
    assert "did you mean SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN?" in "".join(problems)


def test_cli_rejects_unknown_flags_before_launching(tmp_path, capsys):
    config = tmp_path / "ab.toml"
    config.write_text(EXAMPLE.read_text().replace("MIXED_SPLIT_DECODE", "MIXED_SPLT_DECODE"))
    assert ab_cli.main(["run", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "SGLANG_OPT_MIXED_SPLT_DECODE_ATTN is neither an SGLang flag" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "nobody=http://h:1"], "no arm named 'nobody'"),
        (["--url", "split"], "expected ARM=URL"),
        (["--concurrencies", "1,x"], "integers, comma-separated"),
        (["--repeats", "0"], "repeats: must be at least 1"),
        (["--gsm8k-data", "/no/such/test.jsonl"], "no such file"),
        (["--request-rates", "2,x"], "--request-rates '2,x': numbers, comma-separated"),
        (["--request-rates", "0"], "request_rates[0]: must be a finite number above 0"),
        (["--progress-every", "0"], "--progress-every 0: must be above 0 and at most 86400 s"),
        (["--assume-tpot-ms", "0"], "--assume-tpot-ms 0: must be above 0 and at most 60000 ms"),
        (["--assume-tpot-ms", "nan"], "--assume-tpot-ms nan: must be above 0"),
        (["--launch-prefix", "bash 'x"], "--launch-prefix: No closing quotation"),
        (
            ["--launch-prefix", "no-such-wrapper-xyz --kit k"],
            "[server] launch_prefix: 'no-such-wrapper-xyz' is not an executable on PATH",
        ),
        (
            ["--launch-prefix", "/no/such/wrap.sh"],
            "[server] launch_prefix: '/no/such/wrap.sh': no such file",
        ),
    ],
)
def test_cli_overrides_are_checked(tmp_path, capsys, argv, message):
    model = ["--model-path", local_model(tmp_path)]
    assert ab_cli.main(["run", str(EXAMPLE), "--dry-run", *model, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _hours(estimate: str) -> float:
    """The time of an estimate line ("estimate: about 13h08m for ..." or "about 43m30s")."""
    h, m = re.search(r"about (\d+)h(\d+)m ", estimate).groups()
    return int(h) + int(m) / 60


def test_the_estimate_takes_tpot_from_the_option_or_slo_and_says_where_from(tmp_path, capsys):
    slo = tmp_path / "slo.toml"
    slo.write_text(_toml(raw_with(slo={"tpot_ms": 190.0})))

    def estimate(config: Path, *flags: str) -> str:
        argv = ["run", str(config), "--dry-run", "--run-dir", str(tmp_path / "r")]
        assert ab_cli.main([*argv, "--model-path", local_model(tmp_path), *flags]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("estimate: ")]
        return line

    assumed = estimate(EXAMPLE)
    assert "TTFT 1000 ms assumed without [slo] ttft_ms" in assumed
    assert "TPOT 50 ms assumed without [slo] tpot_ms or --assume-tpot-ms" in assumed
    option = estimate(EXAMPLE, "--assume-tpot-ms", "190")
    assert "TPOT 190 ms from --assume-tpot-ms)" in option
    from_slo = estimate(slo)
    assert "TPOT 190 ms from [slo] tpot_ms)" in from_slo
    assert "TPOT 100 ms from --assume-tpot-ms)" in estimate(slo, "--assume-tpot-ms", "100")
    # Every modelled cell is TTFT + tokens x TPOT: 190 ms instead of 50 makes it about 3.7x.
    assert _hours(option) == _hours(from_slo)
    assert 3.6 < _hours(option) / _hours(assumed) < 3.8


def test_assume_tpot_ms_is_only_for_a_dry_run(tmp_path, capsys):
    argv = ["run", str(EXAMPLE), "--model-path", local_model(tmp_path), "--assume-tpot-ms", "190"]
    err = _one_line_exit_2([*argv, "--run-dir", str(tmp_path / "run")], capsys)
    assert (
        err
        == "sglang-mixgraph ab: --assume-tpot-ms: only with --dry-run (it sets the estimate's TPOT)\n"
    )
    assert not (tmp_path / "run").exists()


def test_dry_run_prints_the_plan_with_attached_arms(tmp_path, capsys):
    run_dir = tmp_path / "r"
    argv = ["run", str(EXAMPLE), "--dry-run", "--run-dir", str(run_dir)]
    argv += ["--model-path", local_model(tmp_path)]
    assert ab_cli.main([*argv, "--url", "split=http://h:1", "--repeats", "2"]) == 0
    captured = capsys.readouterr()
    lines = _without_previews(captured.out)
    # the launched arm's preview only: an attached arm is not resolved here
    assert captured.out.count("\n  resolved on ") == 1
    assert lines[1].startswith(f"server baseline: {SHARED_ENV} {OWN_ENV}=0 {sys.executable} -m ")
    assert lines[2] == "server split: attached at http://h:1"
    assert lines[3] == "arm baseline, repeat 1: 6 cells (0 done)"
    assert lines[-1].startswith("versions: sglang ")
    # The example gives neither GSM8K data nor a dataset file: both are downloaded.
    fetches = [line for line in lines if line.startswith("needs network: ")]
    assert len(fetches) == 2 and "GSM8K" in fetches[0] and "ShareGPT" in fetches[1]
    assert lines[-4:-2] == fetches
    assert [line.split(":")[0] for line in lines[3:-4] if not line.startswith(" ")] == [
        "arm baseline, repeat 1",
        "arm split, repeat 1",
        "arm split, repeat 2",
        "arm baseline, repeat 2",
    ]
    # Every cell's exact command, against the server the visit starts or attaches.
    raw = read_toml(EXAMPLE)
    raw["server"]["model_path"] = local_model(tmp_path)
    raw["arm"][1]["url"] = "http://h:1"
    raw["sweep"]["repeats"] = 2
    cell = runner.plan(parse_config(raw))[1].cells[2]  # split, repeat 1, concurrency 256
    expected = shlex.join([
        sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url",
        "http://h:1", "--dataset-name", "random", "--random-input-len", "2048",
        "--random-output-len", "1024", "--random-range-ratio", "1.0", "--num-prompts", "1536",
        "--max-concurrency", "256", "--warmup-requests", "512", "--seed", "42", "--output-file",
        str(run_dir / cell.stem) + ".jsonl", "--flush-cache",
    ])  # fmt: skip
    assert f"  arm=split concurrency=256 repeat=1: {expected}" in lines
    assert "  server: attach http://h:1" in lines
    gsm8k = [line for line in lines if line.startswith("  gsm8k arm=baseline: ")]
    assert len(gsm8k) == 1 and "--base-url http://127.0.0.1:30000 --num-examples 200" in gsm8k[0]
    assert lines[-2].startswith("estimate: about ")
    assert "and 2 server starts, 2 of them not measured yet and not counted" in lines[-2]
    assert "arm 'split' is attached (http://h:1); its env is not applied" in captured.err


def test_report_of_a_directory_that_is_no_run(tmp_path, capsys):
    assert ab_cli.main(["report", str(tmp_path)]) == 2
    assert "no run.json; not a run directory" in capsys.readouterr().err


# t(0.975, df) to 12+ digits, from scipy.stats.t.ppf(0.975, df) (scipy 1.17.1); the printed
# tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2) agree to their 3 decimals: 12.706, 4.303,
# 2.776, 2.045, 2.000.
T975 = {
    1: 12.706204736174694,
    2: 4.302652729749462,
    4: 2.7764451051977934,
    29: 2.045229642132703,
    60: 2.0002978220142604,
}


def test_t_quantiles_are_exact():
    for df, value in T975.items():
        assert t975(df) == pytest.approx(value, rel=1e-11), df
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-12)
    assert t_quantile(0.025, 4) == pytest.approx(-T975[4], rel=1e-11)
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in range(1, 150):
        for p in (0.6, 0.9, 0.95, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), abs=1e-9)


def test_mean_intervals_against_scipy():
    values = [9064.0, 9300.0, 8900.0, 9100.0]
    est = estimate(values)
    assert est.mean == pytest.approx(statistics.fmean(values)) and est.n == 4
    assert estimate([5.0]).ci95 is None and estimate([]) is None
    scipy_stats = pytest.importorskip("scipy.stats")
    low, high = scipy_stats.t.interval(
        0.95, 3, loc=statistics.fmean(values), scale=scipy_stats.sem(values)
    )
    assert (est.low, est.high) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))


def test_ratio_intervals_are_log_ratio_t_intervals():
    # Hand-computed, no scipy: ratios 2 and 1/2 have logs +-ln 2, mean 0, s = sqrt(2) ln 2,
    # so the interval is exp(+-t(0.975, 1) ln 2) = 2 ** +-12.706...: positive, reciprocal.
    est = paired_ratio({0: 2.0, 1: 1.0}, {0: 1.0, 1: 2.0})
    assert est.n == 2 and est.mean == pytest.approx(1.0)
    assert est.low == pytest.approx(2.0 ** -T975[1], rel=1e-9)
    assert est.high == pytest.approx(2.0 ** T975[1], rel=1e-9)
    assert est.low > 0  # the linear interval of these ratios was 1.25 +- 9.53
    # Candidate / baseline and baseline / candidate: reciprocal ratios and intervals.
    c, b = {0: 9796.0, 1: 9900.0, 2: 9650.0}, {0: 9064.0, 1: 9000.0, 2: 9100.0}
    forward, backward = paired_ratio(c, b), paired_ratio(b, c)
    assert forward.mean * backward.mean == pytest.approx(1.0)
    assert forward.low * backward.high == pytest.approx(1.0)
    # Paired by repeat; a repeat only one arm finished, or a value <= 0, is left out.
    ratio = paired_ratio({0: 9796.0, 1: 9900.0, 2: 1.0, 3: 0.0}, {0: 9064.0, 1: 9000.0, 3: 5.0})
    assert ratio.n == 2
    assert ratio.mean == pytest.approx(statistics.geometric_mean([9796 / 9064, 9900 / 9000]))
    assert paired_ratio({0: 3.0}, {0: 2.0}).low is None
    scipy_stats = pytest.importorskip("scipy.stats")
    logs = [math.log(c[r] / b[r]) for r in range(3)]
    low, high = scipy_stats.t.interval(
        0.95, 2, loc=statistics.fmean(logs), scale=scipy_stats.sem(logs)
    )
    assert forward.mean == pytest.approx(math.exp(statistics.fmean(logs)), rel=1e-12)
    assert forward.low == pytest.approx(math.exp(low), rel=1e-12)
    assert forward.high == pytest.approx(math.exp(high), rel=1e-12)


# Wilson 95% intervals from scipy.stats.binomtest(k, n).proportion_ci(0.95, "wilson").
WILSON = {
    (23, 30): (0.5907167384187784, 0.8820761185551049),
    (0, 10): (0.0, 0.27753279986288926),
    (10, 10): (0.7224672001371109, 1.0),
    (186, 200): (0.8859451911438936, 0.9578478281716571),
}


def test_wilson_intervals_against_scipy():
    for (k, n), (low, high) in WILSON.items():
        got = wilson(k / n, n)
        assert got == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12)), (k, n)
    scipy_stats = pytest.importorskip("scipy.stats")
    for k, n in ((1, 1400), (1302, 1400), (7, 9), (50, 100)):
        ci = scipy_stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson(k / n, n) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_gates_fail_a_clear_regression_and_pass_a_neutral_change():
    def judged(candidate, baseline, judge, **bounds):
        est = paired_ratio(dict(enumerate(candidate)), dict(enumerate(baseline)))
        return judge_bounds(est.mean, est.low, est.high, judge=judge, fmt="{:.3f}x", **bounds)

    regression = ([800.0, 815.0, 790.0], [1000.0, 1010.0, 995.0])  # 0.80x, tight
    neutral = ([1003.0, 985.0, 1008.0], [1000.0, 1000.0, 1000.0])  # 0.999x [0.969, 1.029]
    for judge in ("no_regression", "confirmed", "mean"):
        ok, basis = judged(*regression, judge, minimum=1.0)
        assert not ok, (judge, basis)
    ok, basis = judged(*neutral, "no_regression", minimum=1.0)
    assert ok and basis == "upper bound 1.029x >= 1x"
    ok, basis = judged(*neutral, "mean", minimum=1.0)  # the old rule: the mean alone
    assert not ok and basis == "value 0.999x < 1x"
    ok, basis = judged(*neutral, "confirmed", minimum=1.0)
    assert not ok and basis == "lower bound 0.969x < 1x"
    # A maximum (TPOT must not grow) is judged on the lower bound by default.
    ok, basis = judged(*neutral, "no_regression", maximum=0.99)
    assert ok and basis == "lower bound 0.969x <= 0.99x"
    ok, basis = judged(*neutral, "confirmed", minimum=0.95, maximum=1.05)
    assert ok and basis == "lower bound 0.969x > 0.95x; upper bound 1.029x < 1.05x"
    # One repeat: no interval, the value, said so.
    ok, basis = judged([990.0], [1000.0], "no_regression", minimum=1.0)
    assert not ok and basis == "value 0.990x < 1x (no interval: one repeat)"


def test_how_often_a_min_ratio_gate_fails_neutral_and_regressed_changes():
    """3 paired repeats, 2% noise per cell: the default fails a neutral change about 1 time
    in 40 (the interval's upper tail), the mean alone about 1 in 2; a 10% loss is caught about
    9 times in 10, a 20% loss all but always."""
    rng = random.Random(20)

    def failure_rate(true_ratio: float, judge: str, trials: int = 3000) -> float:
        failed = 0
        for _ in range(trials):
            base = {r: 1000.0 * math.exp(rng.gauss(0, 0.02)) for r in range(3)}
            cand = {r: 1000.0 * true_ratio * math.exp(rng.gauss(0, 0.02)) for r in range(3)}
            est = paired_ratio(cand, base)
            failed += not judge_bounds(est.mean, est.low, est.high, judge=judge, minimum=1.0)[0]
        return failed / trials

    assert 0.01 < failure_rate(1.0, "no_regression") < 0.05
    assert 0.4 < failure_rate(1.0, "mean") < 0.6
    assert failure_rate(0.9, "no_regression") > 0.8
    assert failure_rate(0.8, "no_regression") > 0.98


def test_default_repeats_and_judges():
    config = parse_config(
        {
            "arm": [{"name": "a", "url": "http://h:1"}, {"name": "b", "url": "http://h:2"}],
            "sweep": {"concurrencies": [1]},
            "gate": [
                {
                    "metric": "median_tpot_ms",
                    "candidate": "b",
                    "baseline": "a",
                    "concurrency": 1,
                    "max_ratio": 1.0,
                }
            ],
        }
    )
    assert config.sweep.repeats == 3
    # gates: no_regression; GSM8K: the score itself, as SGLang's CI
    assert config.gates[0].judge == "no_regression" and config.gsm8k.judge == "mean"
    with pytest.raises(ConfigError, match=r"\[gsm8k\] judge 'lower': one of no_regression"):
        parse_config({**raw_with(), "gsm8k": {"judge": "lower"}})
    gate = {**RAW["gate"][0], "judge": "confirmed"}
    assert parse_config(raw_with(gate=[gate])).gates[0].judge == "confirmed"


def test_subprocess_invoker_stops_the_tool_on_a_dead_server_and_on_timeout(tmp_path, monkeypatch):
    (tmp_path / "sleepy_tool.py").write_text(
        "import os, pathlib, time\n"
        f"pathlib.Path({str(tmp_path / 'pid')!r}).write_text(str(os.getpid()))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    log = tmp_path / "tool.log"
    started = time.monotonic()

    def dead_server():
        if time.monotonic() - started > 1.0:
            raise ServerError("arm 'a': the server exited with code 9 during a cell")

    with pytest.raises(ServerError, match="code 9"):
        subprocess_invoker("sleepy_tool", [], log, 60.0, dead_server)
    assert time.monotonic() - started < 20
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped by the invoker
    assert "started" in log.read_text()
    assert subprocess_invoker("sleepy_tool", [], log, 1.0, lambda: None) == TIMED_OUT


FLAGS_ONLY = [
    "run",
    "--model-path",
    "deepseek-ai/DeepSeek-V4-Pro",  # a Hugging Face id: not checked on disk
    "--server-args",
    "--tp 8 --enable-mixed-chunk --chunked-prefill-size '22528'",
    "--arm",
    "baseline:SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=0",
    "--arm",
    "split:SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1,SGLANG_MIXGRAPH_SPLIT_POLICY=always",
    "--concurrencies",
    "64,256",
    "--input-len",
    "1024",
    "--output-len",
    "128",
    "--gsm8k-threshold",
    "0.9",
]


def test_a_run_described_by_flags_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ab_cli.main([*FLAGS_ONLY, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run directory: ab_runs/baseline-vs-split"
    assert lines[1] == (
        f"server baseline: {OWN_ENV}=0 {sys.executable} -m sglang.launch_server "
        "--model-path deepseek-ai/DeepSeek-V4-Pro --host 127.0.0.1 --port 30000 --tp 8 --enable-mixed-chunk "
        "--chunked-prefill-size 22528"
    )
    assert lines[3].startswith("arm baseline, repeat 1: ")
    assert lines[5].startswith("  gsm8k arm=baseline: ")
    args = ab_cli._parser().parse_args(FLAGS_ONLY)
    config = parse_config(ab_cli._apply_overrides({}, args))
    assert config.server.model_path == "deepseek-ai/DeepSeek-V4-Pro"
    assert config.server.args == (
        "--tp",
        "8",
        "--enable-mixed-chunk",
        "--chunked-prefill-size",
        "22528",
    )
    assert [(a.name, dict(a.env)) for a in config.arms] == [
        ("baseline", {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "0"}),
        (
            "split",
            {"SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN": "1", "SGLANG_MIXGRAPH_SPLIT_POLICY": "always"},
        ),
    ]
    sweep = config.sweep
    assert (sweep.concurrencies, sweep.input_len, sweep.output_len) == ((64, 256), 1024, 128)
    assert config.gsm8k.threshold == 0.9


def test_flags_add_to_a_configuration():
    args = ab_cli._parser().parse_args(
        ["run", str(EXAMPLE), "--arm", "adaptive:SGLANG_MIXGRAPH_SPLIT_POLICY=adaptive"]
        + ["--input-len", "512"]
    )
    config = parse_config(ab_cli._apply_overrides(read_toml(EXAMPLE), args))
    assert [a.name for a in config.arms] == ["baseline", "split", "adaptive"]
    assert config.sweep.input_len == 512


def test_only_arms_keeps_the_named_arms_in_the_configurations_order():
    argv = ["run", str(EXAMPLE), "--arm", "adaptive:SGLANG_MIXGRAPH_SPLIT_POLICY=adaptive"]
    args = ab_cli._parser().parse_args([*argv, "--only-arms", "adaptive, baseline"])
    config = parse_config(ab_cli._apply_overrides(read_toml(EXAMPLE), args))
    assert [a.name for a in config.arms] == ["baseline", "adaptive"]
    assert config.arms[1].env["SGLANG_MIXGRAPH_SPLIT_POLICY"] == "adaptive"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [("baseline,splt", "no arm named 'splt'"), (",", "give arm names, comma-separated")],
)
def test_only_arms_naming_no_arm_is_a_one_line_error(spec, problem, capsys):
    assert ab_cli.main(["run", str(EXAMPLE), "--only-arms", spec, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"--only-arms {spec!r}: {problem} (the arms: baseline, split)" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "--arm", "a", "--arm", "b"],
            "--concurrencies (or --request-rates): needed without a configuration",
        ),
        (["run", "--arm", "a:X", "--concurrencies", "1"], "expected NAME[:ENV=VALUE,...]"),
        (
            [*FLAGS_ONLY[:3], "--server-args", "--tp '8", *FLAGS_ONLY[5:]],
            "--server-args: No closing quotation",
        ),
        (
            [
                *FLAGS_ONLY[:7],
                "--arm",
                "split:SGLANG_OPT_MIXED_SPLT_DECODE_ATTN=1",
                *FLAGS_ONLY[9:],
            ],
            "SGLANG_OPT_MIXED_SPLT_DECODE_ATTN is neither an SGLang flag",
        ),
    ],
)
def test_flags_only_mistakes_are_one_line_errors(argv, message, capsys):
    assert ab_cli.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


# ---------------------------------------------------------------- launch prefix


def with_prefix(server_prefix=None, **arm_prefixes) -> dict:
    """The example as it was when launch prefixes came (its counts then: the keys below were
    recorded with them), with a [server] launch_prefix and per-arm ones (name=prefix)."""
    raw = raw_with(gate=[])
    sweep = {k: v for k, v in raw["sweep"].items() if k != "warmup_per_concurrency"}
    raw["sweep"] = {**sweep, "prompts_per_concurrency": 4, "min_prompts": 256}
    raw["sweep"]["warmup_requests"] = 64
    if server_prefix is not None:
        raw["server"]["launch_prefix"] = server_prefix
    for arm in raw["arm"]:
        if arm["name"] in arm_prefixes:
            arm["launch_prefix"] = arm_prefixes[arm["name"]]
    return raw


def test_launch_prefix_goes_in_front_of_python3_and_arms_override_it():
    example = parse_config(read_toml(EXAMPLE))
    tail = [
        "-m", "sglang.launch_server", "--model-path", "/models/DeepSeek-V4-Pro",
        "--host", "127.0.0.1", "--port", "30000", *example.server.args,
    ]  # fmt: skip
    # No prefix: this interpreter, exactly as before the prefix existed.
    assert launch_argv(example, example.arm("split")) == [sys.executable, *tail]
    # A string is split like a shell; a list is taken as it is; the same prefix either way.
    for value in (DEVICE, shlex.split(DEVICE)):
        config = parse_config(with_prefix(value))
        for arm in config.arms:
            assert launch_argv(config, arm) == [*shlex.split(DEVICE), "python3", *tail]
    # An arm's own prefix wins; an empty one means none (this interpreter again).
    config = parse_config(with_prefix(DEVICE, baseline=["srun", "-N1"], split=[]))
    assert launch_argv(config, config.arm("baseline")) == ["srun", "-N1", "python3", *tail]
    assert launch_argv(config, config.arm("split")) == [sys.executable, *tail]
    # An arm's prefix without a global one; another python after it; a command after it.
    config = parse_config(with_prefix(None, split="env -u X"))
    assert launch_argv(config, config.arm("baseline")) == [sys.executable, *tail]
    assert launch_argv(config, config.arm("split")) == ["env", "-u", "X", "python3", *tail]
    raw = with_prefix(DEVICE)
    raw["server"]["launch_python"] = "/opt/py/bin/python3.12"
    config = parse_config(raw)
    assert launch_argv(config, config.arm("split")) == [
        *shlex.split(DEVICE),
        "/opt/py/bin/python3.12",
        *tail,
    ]
    raw["server"]["command"] = ["docker", "run", "img", "launch"]
    config = parse_config(raw)
    assert launch_argv(config, config.arm("split")) == [
        *shlex.split(DEVICE),
        "docker",
        "run",
        "img",
        "launch",
        *tail[2:],
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (with_prefix(3), "[server] launch_prefix: expected a list of strings or a string"),
        (with_prefix(["bash", 1]), "[server] launch_prefix[1]: expected a string"),
        (with_prefix("bash 'x"), "[server] launch_prefix: No closing quotation"),
        (with_prefix(None, split={"a": 1}), "arm 'split' launch_prefix: expected a list"),
        ({**with_prefix(), "server": {**RAW["server"], "launch_python": ""}}, "must not be empty"),
    ],
)
def test_bad_launch_prefixes_are_one_line_errors(raw, message):
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cell_keys_without_a_prefix_are_unchanged_and_a_prefix_changes_them():
    config = parse_config(with_prefix())
    split = config.arm("split")
    # The keys of the example as they were before launch prefixes existed: runs without a
    # prefix resume their finished cells.
    assert settings_key(cell_settings(config, split, at(config, 64), 0)) == "15c7d1530bb135fa"
    assert settings_key(gsm8k_settings(config, config.arm("baseline"))) == "688927ef406b6d67"

    def keys(raw):
        c = parse_config(raw)
        return {a.name: settings_key(cell_settings(c, a, at(c, 64), 0)) for a in c.arms}

    plain = keys(with_prefix())
    assert plain["split"] == "15c7d1530bb135fa"
    assert keys(with_prefix([])) == plain  # an empty prefix is no prefix
    device = keys(with_prefix(DEVICE))
    assert device["baseline"] != plain["baseline"] and device["split"] != plain["split"]
    assert keys(with_prefix(shlex.split(DEVICE))) == device  # string or list: same prefix
    assert keys(with_prefix("bash other.sh"))["split"] != device["split"]
    # An arm that opts out keeps the key it has without any prefix; one that names the same
    # prefix as the global one has the key of inheriting it.
    mixed = keys(with_prefix(DEVICE, split=[], baseline=DEVICE))
    assert mixed == {"baseline": device["baseline"], "split": plain["split"]}
    # An attached arm is not launched: a prefix changes nothing about it.
    attached = with_prefix()
    attached["arm"][1]["url"] = "http://h:1"
    attached_device = with_prefix(DEVICE)
    attached_device["arm"][1]["url"] = "http://h:1"
    assert keys(attached)["split"] == keys(attached_device)["split"]


def test_dry_run_prints_each_arms_command_through_the_prefix(tmp_path, capsys):
    model = local_model(tmp_path)
    argv = ["run", str(EXAMPLE), "--dry-run", "--run-dir", str(tmp_path / "r")]
    assert ab_cli.main([*argv, "--model-path", model, "--launch-prefix", DEVICE]) == 0
    lines = _without_previews(capsys.readouterr().out)
    args = " ".join(RAW["server"]["args"])
    launch = (
        f"{DEVICE} python3 -m sglang.launch_server --model-path {model} "
        f"--host 127.0.0.1 --port 30000 {args}"
    )
    assert lines[1:3] == [
        f"server baseline: {SHARED_ENV} {OWN_ENV}=0 {launch}",
        f"server split: {SHARED_ENV} {OWN_ENV}=1 {launch}",
    ]
    # A configuration's per-arm prefix, over the flag's; an empty one: no prefix.
    config = tmp_path / "ab.toml"
    text = EXAMPLE.read_text()
    text = text.replace('name = "split"\n', 'name = "split"\nlaunch_prefix = []\n', 1)
    config.write_text(text)
    argv = ["run", str(config), "--dry-run", "--model-path", model, "--launch-prefix", DEVICE]
    assert ab_cli.main(argv) == 0
    lines = _without_previews(capsys.readouterr().out)
    assert lines[1] == f"server baseline: {SHARED_ENV} {OWN_ENV}=0 {launch}"
    assert lines[2] == (
        f"server split: {SHARED_ENV} {OWN_ENV}=1 {sys.executable} "
        + launch.removeprefix(f"{DEVICE} python3 ")
    )


def test_a_prefix_that_cannot_run_is_a_one_line_error_before_anything(tmp_path, capsys):
    script = tmp_path / "wrap.sh"
    script.write_text('#!/bin/sh\nexec "$@"\n')  # not executable
    raw_text = EXAMPLE.read_text().replace(
        'name = "split"\n', f'name = "split"\nlaunch_prefix = ["{script}"]\n', 1
    )
    config = tmp_path / "ab.toml"
    config.write_text(raw_text)
    argv = ["run", str(config), "--run-dir", str(tmp_path / "run")]
    argv += ["--model-path", local_model(tmp_path)]
    assert ab_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"arm 'split' launch_prefix: '{script}' is not executable" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    # The arm's own prefix wins over --launch-prefix; made executable, it can run.
    assert ab_cli.main([*argv, "--dry-run", "--launch-prefix", f"bash {script}"]) == 2
    os.chmod(script, 0o755)
    assert ab_cli.main([*argv, "--dry-run"]) == 0
    capsys.readouterr()
    # An attached arm is not launched: its prefix is not checked.
    bad = parse_config(with_prefix("no-such-wrapper-xyz"))
    assert len(launch_problems(bad)) == 1  # said once, not per arm
    attached = with_prefix("no-such-wrapper-xyz")
    for arm in attached["arm"]:
        arm["url"] = "http://h:1"
    assert launch_problems(parse_config(attached)) == []


# ---------------------------------------------------------------- run directory and paths


def _one_line_exit_2(argv: list[str], capsys) -> str:
    assert ab_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("dry_run", [True, False])
def test_run_dir_is_checked_before_anything(tmp_path, capsys, dry_run):
    base = ["run", str(EXAMPLE), "--model-path", local_model(tmp_path)]
    base += ["--dry-run"] if dry_run else []
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    err = _one_line_exit_2([*base, "--run-dir", str(a_file)], capsys)
    assert f"run directory {a_file}: exists and is not a directory" in err
    err = _one_line_exit_2([*base, "--run-dir", str(a_file / "run")], capsys)
    assert f"cannot be created, {a_file} is not a directory" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("someone's files\n")
    err = _one_line_exit_2([*base, "--run-dir", str(other)], capsys)
    assert "holds files but no run.json" in err
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    assert a_file.read_text() == "not a directory\n"
    if dry_run:  # a new, an empty and an earlier run's directory are fine
        empty = tmp_path / "empty"
        empty.mkdir()
        earlier = tmp_path / "earlier"
        earlier.mkdir()
        (earlier / "run.json").write_text("{}")
        for run_dir in (tmp_path / "new" / "run", empty, earlier):
            assert ab_cli.main([*base, "--run-dir", str(run_dir)]) == 0
        assert not (tmp_path / "new").exists()


def test_configuration_paths_are_checked_before_anything(tmp_path, capsys):
    model = local_model(tmp_path)

    def run(raw: dict, *extra: str, dry_run: bool = True) -> str:
        config = tmp_path / "ab.toml"
        config.write_text(_toml(raw))
        argv = ["run", str(config), "--run-dir", str(tmp_path / "r"), *extra]
        return _one_line_exit_2(argv + ["--dry-run"] * dry_run, capsys)

    raw = raw_with()
    raw["server"]["model_path"] = model
    raw["sweep"]["dataset_path"] = str(tmp_path / "sharegpt.json")
    assert f"[sweep] dataset_path '{tmp_path / 'sharegpt.json'}': no such file" in run(raw)
    (tmp_path / "sharegpt.json").write_text(sharegpt_text(6 * 2048))  # a prompt per request
    raw["gsm8k"]["data_path"] = "missing/test.jsonl"
    assert "[gsm8k] data_path 'missing/test.jsonl': no such file" in run(raw)
    del raw["gsm8k"]["data_path"]
    raw["server"]["model_path"] = "/no/such/model"
    # a run needs the model; --dry-run previews without it (test_ab_dry_run_arms)
    assert "[server] model_path '/no/such/model': no such directory" in run(raw, dry_run=False)
    raw["server"]["model_path"] = model
    raw["server"]["command"] = [str(tmp_path / "no-such-launcher"), "--serve"]
    assert f"[server] command: '{tmp_path / 'no-such-launcher'}': no such file" in run(raw)
    del raw["server"]["command"]
    raw["server"]["launch_python"] = "no-such-python-xyz"
    assert "[server] launch_python: 'no-such-python-xyz' is not an executable on PATH" in run(raw)
    # After a prefix the wrapper decides what `python` is; a Hugging Face id is not a path;
    # a command (a container, srun) may see another filesystem.
    for change in (
        {"launch_prefix": ["env"]},
        {"launch_python": sys.executable, "model_path": "deepseek-ai/DeepSeek-V4-Pro"},
        {"command": ["env", "python3"], "model_path": "/in/the/container"},
    ):
        ok = copy.deepcopy(raw)
        ok["server"].pop("launch_python")
        ok["server"].update(change)
        config = tmp_path / "ok.toml"
        config.write_text(_toml(ok))
        assert ab_cli.main(["run", str(config), "--dry-run"]) == 0, capsys.readouterr().err
        capsys.readouterr()


def _toml(raw: dict) -> str:
    """The few TOML shapes of the example configuration (tables, arrays of tables)."""

    def value(v) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    lines = []
    for section, body in raw.items():
        if isinstance(body, list):
            for item in body:
                lines += [f"[[{section}]]"] + [f"{k} = {value(v)}" for k, v in item.items()]
        elif isinstance(body, dict):
            lines += [f"[{section}]"] + [f"{k} = {value(v)}" for k, v in body.items()]
        else:
            lines.append(f"{section} = {value(body)}")
    return "\n".join(lines) + "\n"


def _doc_section(text: str, first: str, end: str) -> str:
    return text[text.index(first) : text.index(end)]


def test_the_docs_name_every_key_and_run_option_and_only_paths_that_exist(capsys):
    text = (ROOT / "docs" / "ab.md").read_text()
    # "CI use" holds [[gate]]'s keys; "Configuration reference" every other section's.
    reference = _doc_section(text, "## CI use", "## Reproducing the upstream tables")
    for section, table in config_schema._SECTIONS.items():
        for key in table.model_fields:
            assert f"`{key}`" in reference, f"[{section}] {key} is not documented"
    with pytest.raises(SystemExit):
        ab_cli.main(["run", "--help"])
    options = set(re.findall(r"--[a-z][a-z-]+", capsys.readouterr().out)) - {"--help"}
    command_line = _doc_section(text, "Command line: `sglang-mixgraph ab run", "`--dry-run` checks")
    assert sorted(o for o in options if f"[{o}" not in command_line) == []
    for path in re.findall(r"`((?:tools|examples|docs|test)/[^` ]+)", text):
        assert (ROOT / path).exists(), f"docs/ab.md names {path}, which does not exist"


def test_versions_of_this_environment():
    from importlib.metadata import version

    from sglang_mixgraph.ab import versions

    env = versions.environment()
    assert env["sglang"] == version("sglang") and env["torch"] == version("torch")
    assert env["sglang_mixgraph"] == version("sglang-mixgraph")
    assert env["git_commit"] is None or len(env["git_commit"]) == 40  # a checkout: its HEAD
    assert isinstance(env["gpus"]["names"], list)
    line = versions.describe(env)
    assert line.startswith(f"sglang {env['sglang']}, sglang-mixgraph ") and "GPUs: " in line
    changed = {**env, "gpus": {"count": 2, "names": ["NVIDIA H200", "NVIDIA H200"]}}
    assert versions.differences(env, changed) == [
        f"gpus {versions.describe_field('gpus', env['gpus'])} -> 2 x NVIDIA H200"
    ]
    assert versions.differences(None, env) == ["versions not recorded"]
    assert env["cpu"]["count"] == os.cpu_count()
    assert line.endswith(f"CPU: {versions.describe_field('cpu', env['cpu'])}")


def test_the_host_cpu_is_noted_never_compared(tmp_path, monkeypatch):
    """The host CPU's model comes from /proc/cpuinfo (its first `model name`, spaces folded);
    without one it is unknown. Another CPU never voids a cell: it is noted for the reader."""
    from sglang_mixgraph.ab import versions

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\n"
        "model name\t: AMD EPYC  9654 96-Core Processor\n\nprocessor\t: 1\n"
        "model name\t: AMD EPYC 9654 96-Core Processor\n"
    )
    monkeypatch.setattr(versions, "CPUINFO", info)
    monkeypatch.setattr(versions.os, "cpu_count", lambda: 16)
    epyc = versions._cpu()
    assert epyc == {"model": "AMD EPYC 9654 96-Core Processor", "count": 16}
    assert versions.describe_field("cpu", epyc) == "AMD EPYC 9654 96-Core Processor (16 CPUs)"
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\n")  # no model name (Arm)
    assert versions._cpu() == {"model": None, "count": 16}
    monkeypatch.setattr(versions, "CPUINFO", tmp_path / "absent")
    assert versions.describe_field("cpu", versions._cpu()) == "unknown model (16 CPUs)"

    env = {"sglang": "0.5.23", "source_digest": "d" * 64, "gpus": {"count": 0, "names": []}}
    assert versions.same({**env, "cpu": epyc}, {**env, "cpu": {"model": "Intel Xeon", "count": 8}})
    assert versions.describe({**env, "cpu": epyc}).endswith(
        "CPU: AMD EPYC 9654 96-Core Processor (16 CPUs)"
    )
    assert "CPU" not in versions.describe(env)  # a record from before the CPU was noted


def _fake_pynvml(init_error: str | None = None):
    """A stand-in pynvml: two H200s on driver 570.124.06 (names as bytes, as older releases
    return them), or nvmlInit raising `init_error` (one of pynvml's error class names)."""
    import types

    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    mod.NVMLError = NVMLError
    mod.NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (NVMLError,), {})
    mod.NVMLError_DriverNotLoaded = type("NVMLError_DriverNotLoaded", (NVMLError,), {})

    def init():
        if init_error:
            raise getattr(mod, init_error)("Driver Not Loaded")

    mod.nvmlInit, mod.nvmlShutdown = init, lambda: None
    mod.nvmlDeviceGetCount = lambda: 2
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetName = lambda handle: b"NVIDIA H200"
    mod.nvmlSystemGetDriverVersion = lambda: "570.124.06"
    return mod


def test_gpus_from_nvml_with_the_driver_and_unknown_when_it_fails(tmp_path, monkeypatch):
    """NVML (pynvml) names the GPUs and the driver; without the NVML library nvidia-smi is
    asked; a driver NVML cannot reach is unknown, which never differs from a known inventory."""
    import sys

    from sglang_mixgraph.ab import versions
    from sglang_mixgraph.kits.fake_nvidia_smi import fake_nvidia_smi

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    two = versions._gpus()
    assert two == {"count": 2, "names": ["NVIDIA H200"] * 2, "driver": "570.124.06"}
    assert versions.describe_field("gpus", two) == "2 x NVIDIA H200, driver 570.124.06"

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml("NVMLError_DriverNotLoaded"))
    unknown = versions._gpus()
    assert unknown["count"] is None and unknown["error"] == "NVML: Driver Not Loaded"
    assert versions.describe_field("gpus", unknown) == "unknown (NVML: Driver Not Loaded)"
    env = {"sglang": "0.5.23", "source_digest": "d" * 64}
    assert versions.same({**env, "gpus": two}, {**env, "gpus": unknown})
    assert versions.same({**env, "gpus": unknown}, {**env, "gpus": two})
    assert not versions.same({**env, "gpus": two}, {**env, "gpus": {"count": 0, "names": []}})
    # The driver is noted, not compared: a driver update keeps the cells.
    assert versions.same({**env, "gpus": two}, {**env, "gpus": {**two, "driver": "580.1"}})

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml("NVMLError_LibraryNotFound"))
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", b"NVIDIA H\xe9100, 550.1\n"))
    assert versions._gpus() == {"count": 1, "names": ["NVIDIA H\ufffd100"], "driver": "550.1"}


def test_the_code_that_ran_keys_the_cells(tmp_path, monkeypatch):
    """Cells are keyed by a digest of the package's files, with or without git (the GPU
    machine's copy has none, or a stale one): a changed source file is a different version;
    an unchanged copy, a docs-only edit or a new commit of the same files is not."""
    import shutil

    from sglang_mixgraph.ab import versions

    pkg = tmp_path / "sglang_mixgraph"
    shutil.copytree(versions.PACKAGE_ROOT, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    git = {"rev-parse": None, "status": ""}
    monkeypatch.setattr(versions, "_git", lambda *a: git[a[0]])
    monkeypatch.setattr(versions, "PACKAGE_ROOT", pkg)

    def env():
        versions.environment.cache_clear()
        return versions.environment()

    try:
        no_git = env()
        assert no_git["git_commit"] is None and len(no_git["source_digest"]) == 64
        assert versions.comparable(no_git)["code"] == f"source {no_git['source_digest'][:12]}"
        assert f"source {no_git['source_digest'][:12]}" in versions.describe(no_git)
        (pkg / "README.md").write_text("docs only")
        assert versions.differences(no_git, env()) == []
        stats = pkg / "ab" / "stats.py"
        stats.write_text(stats.read_text() + "\n# edit\n")
        edited = env()
        assert versions.differences(no_git, edited) == [
            f"code source {no_git['source_digest'][:12]} -> source {edited['source_digest'][:12]}"
        ]
        git.update({"rev-parse": "a" * 40, "status": " M python/sglang_mixgraph/ab/stats.py"})
        dirty = env()
        assert dirty["dirty"] and versions.differences(edited, dirty) == []  # same files
        git["rev-parse"] = "b" * 40
        assert versions.differences(dirty, env()) == []  # another commit of the same files
        old_record = {**dirty, "source_digest": None}  # written before digests: the commit
        assert versions.comparable(old_record)["code"] == "commit aaaaaaaaaaaa"
    finally:
        versions.environment.cache_clear()


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "examples").glob("ab_*.toml"))
    + [
        ROOT / "tools" / "rank-slice" / name
        for name in ("ab_slice.toml", "ab_faithful.toml", "ab_fp8_lean.toml", "ab_fp8_8k.toml")
    ],
    ids=lambda p: p.name,
)
def test_shipped_configurations_dry_run(path, tmp_path, capsys, monkeypatch):
    """Every example (and the one-rank slice's configuration, written before shapes, rates
    and multiples existed) checks and prints its plan; the slice's counts stay explicit."""
    monkeypatch.chdir(ROOT)  # the slice's launch prefix is relative to the repository
    argv = ["run", str(path), "--dry-run", "--run-dir", str(tmp_path / "run")]
    assert ab_cli.main([*argv, "--model-path", local_model(tmp_path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.splitlines()[-2].startswith("estimate: about ")
    config = parse_config(read_toml(path))
    for point in config.sweep.points():
        assert f" --num-prompts {config.sweep.prompts(point)} " in out
    if path.name == "ab_slice.toml":
        (point,) = config.sweep.points()
        sweep = read_toml(path)["sweep"]  # its explicit counts, not the new multiples
        assert (
            (config.sweep.prompts(point), config.sweep.warmup(point))
            == (
                sweep["min_prompts"],
                sweep["warmup_requests"],
            )
            == (96, 2)
        )


def test_counts_in_multiples_of_concurrency_or_explicit():
    def sweep(**keys):
        return parse_config(raw_with(sweep={"concurrencies": [1, 64], **keys}, gate=[])).sweep

    def counts(s):
        return [(s.prompts(p), s.warmup(p)) for p in s.points()]

    # The upstream pull requests' runs: 6 x concurrency prompts after a 2 x warm-up.
    assert counts(sweep()) == [(64, 2), (384, 128)]  # at least min_prompts (64)
    assert counts(sweep(min_prompts=1, prompts_per_concurrency=3, warmup_per_concurrency=1)) == [
        (3, 1),
        (192, 64),
    ]
    assert counts(sweep(num_prompts=10, warmup_requests=0)) == [(10, 0), (10, 0)]
    rates = sweep(request_rates=[2.5], rate_duration_s=10, min_prompts=4)
    assert counts(rates)[-1] == (25, 6)  # 2.5 req/s for 10 s; 2 x ceil(2.5) warm-up
    assert [p.describe() for p in rates.points()] == [
        "concurrency=1",
        "concurrency=64",
        "request_rate=2.5",
    ]


def test_rates_shapes_and_slos_change_the_keys_only_when_used():
    base = parse_config(read_toml(EXAMPLE))
    key = settings_key(cell_settings(base, base.arm("split"), at(base, 64), 0))
    # Rates alone add cells; the concurrency cells keep their keys.
    with_rates = parse_config(raw_with(sweep={**RAW["sweep"], "request_rates": [4.0]}))
    assert (
        settings_key(cell_settings(with_rates, with_rates.arm("split"), at(with_rates, 64), 0))
        == key
    )
    assert len(with_rates.sweep.points()) == len(base.sweep.points()) + 1
    # SLOs change what bench_serving is asked to compute: new keys.
    slo = parse_config(raw_with(slo={"tpot_ms": 50}))
    assert settings_key(cell_settings(slo, slo.arm("split"), at(slo, 64), 0)) != key
    # A [[shape]] of the same lengths is the same measurement.
    sweep = {k: v for k, v in RAW["sweep"].items() if k not in ("input_len", "output_len")}
    same = parse_config(
        raw_with(sweep=sweep, shape=[{"name": "x", "input_len": 2048, "output_len": 1024}])
    )
    assert settings_key(cell_settings(same, same.arm("split"), at(same, 64), 0)) == key


def test_a_confirmed_gate_passes_only_on_an_interval_that_excludes_its_bound():
    # At the bound: `no_regression` passes an interval that reaches it, `confirmed` fails one
    # that touches it and passes one just past it; one repeat confirms nothing.
    assert judge_bounds(1.05, 1.0, 1.1, judge="confirmed", minimum=1.0) == (
        False,
        "lower bound 1.000 = 1",
    )
    assert judge_bounds(1.05, 1.0001, 1.1, judge="confirmed", minimum=1.0)[0]
    assert judge_bounds(0.95, 0.9, 1.0, judge="no_regression", minimum=1.0)[0]
    assert not judge_bounds(0.95, 0.9, 1.0, judge="confirmed", maximum=1.0)[0]
    assert judge_bounds(0.95, 0.9, 0.9999, judge="confirmed", maximum=1.0)[0]
    assert judge_bounds(1.2, None, None, judge="confirmed", minimum=1.0) == (
        False,
        "value 1.200 > 1 (no interval: one repeat confirms nothing)",
    )
    gate = {**RAW["gate"][0], "judge": "confirmed"}
    with pytest.raises(ConfigError, match=r"judge 'confirmed': .* at least 2 repeats .* has 1$"):
        parse_config(raw_with(gate=[gate], sweep={**RAW["sweep"], "repeats": 1}))


def test_shared_prefix_workload_is_bench_servings_flags_and_counts(tmp_path):
    config = parse_config(raw_with(sweep=_shared_prefix_sweep(shared_prefix=SHARED_PREFIX)))
    sw = config.sweep
    point = sw.points()[0]
    # bench_serving's defaults for the keys not given; 4 x 8 requests whatever the concurrency
    assert sw.shared_prefix.question_len == 128 and sw.shared_prefix.output_len == 256
    assert sw.prompts(point) == sw.completions(point) == 32
    assert (sw.shapes[0].input_len, sw.shapes[0].output_len) == (1000 + 128, 256)
    argv = bench_argv(config, "http://h:1", point, tmp_path / "out.jsonl")
    assert argv[argv.index("--gsp-num-groups") :][:4] == ["--gsp-num-groups", "4",
                                                         "--gsp-prompts-per-group", "8"]  # fmt: skip
    assert "--random-input-len" not in argv
    # Several turns: each is a completed request in bench_serving's count.
    turns = {**SHARED_PREFIX, "num_turns": 3}
    chat = parse_config(
        raw_with(sweep=_shared_prefix_sweep(shared_prefix=turns, backend="sglang-oai-chat"))
    )
    assert chat.sweep.completions(point) == 96
    # The dataset alone: bench_serving's own defaults, known to the tool (64 x 16 requests).
    alone = parse_config(raw_with(sweep=_shared_prefix_sweep()))
    assert alone.sweep.prompts(point) == 1024
    # Other cells keep their keys: the workload is in a cell's settings only when set.
    plain = parse_config(RAW)
    assert (
        "shared_prefix"
        not in cell_settings(plain, plain.arms[0], plain.sweep.points()[0], 0)["bench"]
    )


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"input_len": 8}, r"\[sweep\] input_len: the shared-prefix workload takes its lengths"),
        ({"num_prompts": 8}, r"\[sweep\] num_prompts: the shared-prefix workload sends num_groups"),
        ({"dataset": "random"}, "is the workload of dataset 'generated-shared-prefix', not of"),
        (
            {"extra_args": ["--gsp-num-groups=2"]},
            r"extra_args: --gsp-num-groups is set by \[sweep\] shared_prefix num_groups",
        ),
        (
            {"shared_prefix": {**SHARED_PREFIX, "num_turns": 2}},
            "num_turns 2: bench_serving sends several turns only through a chat backend",
        ),
        (
            {"shared_prefix": {"groups": 2}},
            r"\[sweep\] shared_prefix: unknown key 'groups' \(known: "
            "num_groups, num_turns, output_len",
        ),  # fmt: skip
        (
            {"shared_prefix": {"num_groups": 0}},
            r"\[sweep\] shared_prefix.num_groups: must be at least 1",
        ),
    ],
)
def test_shared_prefix_refuses_what_would_send_another_workload(keys, message):
    sweep = _shared_prefix_sweep(shared_prefix=SHARED_PREFIX)
    with pytest.raises(ConfigError, match=message):
        parse_config(raw_with(sweep={**sweep, **keys}))


def test_a_hundred_thousand_server_arguments_are_refused_at_once(tmp_path, capsys):
    """argparse parses n options in time n^2: 100,000 server arguments took 204 s to refuse.
    A list of more words than any real one is refused before any parser sees it."""
    import time

    raw = raw_with(server={**RAW["server"], "args": ["--disable-radix-cache"] * 100_000})
    config = tmp_path / "ab.toml"
    config.write_text(_toml(raw))
    started = time.monotonic()
    argv = ["run", str(config), "--dry-run", "--run-dir", str(tmp_path / "run")]
    line = _one_line_exit_2(argv, capsys)
    assert time.monotonic() - started < 10
    assert line == "sglang-mixgraph ab: [server] args: at most 1,000 words, got 100,000\n"
    # The bound is far above any real launch: 1,000 words still pass the schema.
    parse_config(raw_with(server={**RAW["server"], "args": ["--disable-radix-cache"] * 1000}))
