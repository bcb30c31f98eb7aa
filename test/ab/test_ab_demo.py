"""`sglang-mixgraph demo`, run as a user runs it: the installed console script.

The whole demo (slow tier: six bench_serving children import SGLang, about 3 minutes on 2 busy cores)
exits 0, writes its configuration, tokenizer and run into --dir, and prints the report, whose
arms' TPOT is what the stand-in was told (the two arms differ there) and which says the numbers
are the stand-in's; no server outlives it. A --dir it cannot use is one line on stderr and exit
2, with nothing written and no server started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from ab_kit import pids_alive

from sglang_mixgraph.ab import demo

SCRIPT = shutil.which("sglang-mixgraph", path=os.path.dirname(sys.executable)) or shutil.which(
    "sglang-mixgraph"
)


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    assert SCRIPT, "the sglang-mixgraph console script is not installed"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "STANDIN_"))}
    full_env.update(env or {})
    return subprocess.run(
        [SCRIPT, "demo", *args], env=full_env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_demo_runs_ab_against_the_standin_and_prints_the_report(tmp_path):
    where, pids = tmp_path / "demo", tmp_path / "pids"
    result = _demo("--dir", str(where), env={"STANDIN_PID_FILE": str(pids)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (where / demo.CONFIG_NAME).is_file() and (where / "model").is_dir()
    report = where / "run" / "report.md"
    text = report.read_text()
    out = " ".join(result.stdout.split())  # the header is wrapped
    assert f"directory (kept): {where}" in out and demo.NOT_MEASURED in out
    assert f"report: {report}" in result.stdout and text in result.stdout
    assert demo.NOT_MEASURED in text and "**Result: PASS**" in text
    summary = json.loads((where / "run" / "results.json").read_text())["summary"]
    assert set(summary) == set(demo.TPOT_MS) and all(f"`{arm}`" in text for arm in summary)
    for arm, tpot in demo.TPOT_MS.items():
        # TPOT grows with each request in flight: 4 of them at concurrency 4.
        expected = tpot + 4 * demo.TPOT_PER_RUNNING_MS
        assert summary[arm]["4"]["median_tpot_ms"]["mean"] == pytest.approx(expected, rel=0.3)
    assert "| pass |" in text  # the one gate: the candidate's TPOT confirmed below 0.9x
    assert len(pids.read_text().split()) == 12  # a server per arm and repeat, each with its child
    assert pids_alive(pids) == []


def _refused(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    return result.stderr


def test_a_dir_that_is_not_empty_is_refused_and_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    line = _refused(_demo("--dir", str(tmp_path)))
    assert f"--dir {tmp_path}: exists and is not empty" in line
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_dir_that_cannot_be_created_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    assert "exists and is not a directory" in _refused(_demo("--dir", str(tmp_path / "file")))
    line = _refused(_demo("--dir", str(tmp_path / "file" / "demo")))
    assert "cannot create or read it (Not a directory)" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_an_unwritable_dir_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert "cannot write there (Permission denied)" in _refused(_demo("--dir", str(locked)))
        assert list(locked.iterdir()) == []
        line = _refused(_demo("--dir", str(locked / "demo")))
        assert "cannot create or read it (Permission denied)" in line
    finally:
        locked.chmod(0o700)


def test_an_argument_of_its_own_is_refused():
    assert "unrecognized arguments: extra" in _refused(_demo("extra"))


@pytest.mark.parametrize("given", [True, False], ids=["empty --dir", "new --dir"])
def test_a_full_disk_while_writing_the_inputs_leaves_the_dir_as_it_was(
    tmp_path, monkeypatch, capsys, given
):
    """The tokenizer half written when the disk fills: one line naming the directory, exit 2,
    and the directory as it was (empty, or gone when demo made it), so the retry runs."""
    import errno

    from sglang_mixgraph.ab import standin
    from sglang_mixgraph.cli import main

    def full_disk(path):
        path.mkdir(parents=True)
        (path / "tokenizer.json").write_text('{"half": ')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(standin, "write_model_dir", full_disk)
    where = tmp_path / "demo"
    if given:
        where.mkdir()
    assert main(["demo", "--dir", str(where)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"sglang-mixgraph demo: --dir {where}: cannot write there (No space left on device); "
        "nothing is left there, free space and run the same command again\n"
    )
    assert (list(where.iterdir()) == []) if given else not where.exists()


def test_demo_configuration_runs_three_repeats_under_one_gate(tmp_path):
    import tomllib

    from sglang_mixgraph.ab.config import parse_config

    config = parse_config(tomllib.loads(demo.demo_config(tmp_path / "model", 12345)))
    assert config.sweep.repeats == 3
    (gate,) = config.gates
    assert (gate.metric, gate.candidate, gate.baseline) == (
        "median_tpot_ms",
        "candidate",
        "baseline",
    )
    # the stand-in's TPOT is 9 ms against 12 (+1 ms at concurrency 4): 10/13 = 0.77 < 0.9
    expected = (demo.TPOT_MS["candidate"] + 4 * demo.TPOT_PER_RUNNING_MS) / (
        demo.TPOT_MS["baseline"] + 4 * demo.TPOT_PER_RUNNING_MS
    )
    assert expected < gate.max_ratio and gate.judge == "confirmed"
