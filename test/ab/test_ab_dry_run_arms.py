"""`ab run --dry-run` resolves every launched arm with `plan`'s code for the GPU `plan` would
choose here (the default B300 on this CPU machine): each arm's graph lines under its server,
SGLang's refusals in one line naming the arm, `gpus` against tp x pp x dp, and a model that
is not on this machine previewed with a warning. In this process (`ab.cli.main`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.kits.fake_nvidia_smi import fake_nvidia_smi
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ab_dsv4.toml"


def _model(tmp_path: Path, config: bool = True) -> str:
    model = tmp_path / "DeepSeek-V4-Pro"
    model.mkdir()
    if config:
        shutil.copy(DSV4_MODEL_DIR / "config.json", model / "config.json")
    return str(model)


def _flags(model: str, server_args: str, *extra: str) -> list[str]:
    return [
        "run",
        "--model-path",
        model,
        "--server-args",
        server_args,
        "--arm",
        "baseline:SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=0",
        "--arm",
        "split:SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1",
        "--concurrencies",
        "64",
        "--dry-run",
        *extra,
    ]


@pytest.fixture
def no_gpu_here(monkeypatch, tmp_path):
    """No GPU on this machine (a failing nvidia-smi): plan's choice is the default B300."""
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "no-gpu", None))
    return monkeypatch


def test_each_arm_shows_its_resolved_graph(tmp_path, capsys, no_gpu_here):
    argv = ["run", str(EXAMPLE), "--dry-run", "--model-path", _model(tmp_path)]
    assert ab_cli.main([*argv, "--run-dir", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out.splitlines()
    for arm in ("baseline", "split"):
        at = next(i for i, line in enumerate(out) if line.startswith(f"server {arm}: "))
        assert out[at + 1].startswith("  resolved on B300 (SM103), 275040 MiB (the default: ")
        block = [line.split(":")[0] for line in out[at + 2 : at + 7]]
        assert block == [
            "    weights",
            "    WARNING",  # the reference's activation reserve, sized from the global chunk
            "    Prefill graph",
            "    Prefill buckets (policy upstream)",
            "    Decode graph",
        ]


@pytest.mark.parametrize(
    "server_args, message",
    [
        (
            "--tp 8 --attn-dp-size 3",
            "arms 'baseline', 'split': SGLang requires `cfg.tp_size % cfg.attn_dp_size == 0`",
        ),
        (
            "--tp 8 --speculative-algorithm EAGEL",
            "arms 'baseline', 'split': SGLang requires "
            "`cfg.speculative_algorithm in ('EAGLE', 'DSPARK')`",
        ),
    ],
)
def test_sglangs_resolution_refusals_stop_the_dry_run(
    tmp_path, capsys, no_gpu_here, server_args, message
):
    assert ab_cli.main(_flags(_model(tmp_path), server_args)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sglang-mixgraph ab: {message}") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_model_directory_without_config_json_is_refused_as_plan_does(
    tmp_path, capsys, no_gpu_here
):
    model = _model(tmp_path, config=False)
    assert ab_cli.main(_flags(model, "--tp 8")) == 2
    err = capsys.readouterr().err
    assert err == (
        f"sglang-mixgraph ab: arms 'baseline', 'split': --model-path {model} has no config.json "
        "(plan reads the model's config.json)\n"
    )


def test_gpus_must_be_what_the_server_takes(tmp_path, capsys, no_gpu_here):
    model = _model(tmp_path)
    raw = tmp_path / "four.toml"
    raw.write_text(
        EXAMPLE.read_text()
        .replace("gpus = 8 ", "gpus = 4 ")
        .replace('"/models/DeepSeek-V4-Pro"', repr(model).replace("'", '"'))
    )
    assert ab_cli.main(["run", str(raw), "--dry-run", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err == (
        "sglang-mixgraph ab: arms 'baseline', 'split': gpus = 4, but its server takes tp 8 x "
        "pp 1 x dp 1 = 8 GPUs; output tok/s per GPU would be divided by 4\n"
    )


def test_a_model_not_on_this_machine_is_previewed_with_a_warning(tmp_path, capsys, no_gpu_here):
    argv = ["run", str(EXAMPLE), "--dry-run", "--run-dir", str(tmp_path / "r")]
    assert ab_cli.main(argv) == 0  # the example's /models/DeepSeek-V4-Pro is not here
    captured = capsys.readouterr()
    assert captured.err == (
        "sglang-mixgraph ab: warning: [server] model_path '/models/DeepSeek-V4-Pro': not on this "
        "machine, so the arms' server arguments are parsed but not resolved (no graph preview, "
        "no GPU count check)\n"
    )
    assert "estimate: about " in captured.out
    assert ab_cli.main([a for a in argv if a != "--dry-run"]) == 2  # the run itself needs it
