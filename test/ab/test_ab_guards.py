"""`sglang-mixgraph ab` refuses a bad run before any server starts and never loses a finished one.

Against the CPU stand-in server (ab/standin.py). Every mistake of the configuration file, the
flags or their combination is one line on stderr and exit 2, with no tool run and no server
started: the stand-in writes its pid to STANDIN_PID_FILE as it starts, so no such file means
no server. A run directory is locked by the run that holds it and refuses a configuration
that would leave out cells it finished (unless --force-new, which moves the earlier run
aside); a finished cell whose raw output is damaged or deleted is reported, named and measured
again; a cell record that is no JSON object is one line naming it; a full disk is one line
naming the file; what a run would download is listed by --dry-run, refused by --offline, a
dataset file bench_serving's ShareGPT loader cannot use is refused, and a cell whose download
fails names the setting that avoids it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ab_kit import (
    STANDIN,
    Recorder,
    pids_alive,
    sharegpt_text,
    small_sweep,
    standin_config,
    write_gsm8k,
)

from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.ab import rundir
from sglang_mixgraph.kits.model_configs import DENSE_LLAMA

ARMS = """
[[arm]]
name = "base"
args = ["--tpot-ms", "10"]

[[arm]]
name = "split"
args = ["--tpot-ms", "5"]
"""
GATE = """
[[gate]]
metric = "median_tpot_ms"
candidate = "{candidate}"
baseline = "base"
concurrency = 1
{bounds}
"""


@pytest.fixture(autouse=True)
def _offline_and_pids(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("STANDIN_PID_FILE", str(tmp_path / "pids"))
    monkeypatch.delenv("STANDIN_DIE_AFTER", raising=False)
    yield
    assert pids_alive(tmp_path / "pids") == [], "a server process outlived the run"


def _config(tmp_path: Path, *, replace: dict[str, str] | None = None, **kwargs) -> Path:
    kwargs.setdefault("arms", ARMS)
    kwargs.setdefault("sweep", small_sweep("[1]"))
    path = standin_config(tmp_path, **kwargs)
    text = path.read_text()
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _run(tmp_path: Path, config: Path, *extra: str, recorder: Recorder | None = None) -> int:
    argv = ["run", str(config), "--run-dir", str(tmp_path / "run"), *extra]
    return ab_cli.main(argv, invoker=recorder or Recorder())


def _refused(tmp_path: Path, config: Path, *extra: str, capsys) -> str:
    """Exit 2 with one line on stderr, no tool run and no server started; the line."""
    recorder = Recorder()
    assert _run(tmp_path, config, *extra, recorder=recorder) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert recorder.calls == []
    assert not (tmp_path / "pids").exists(), "a server was started"
    return err.strip()


# ---------------------------------------------------------------- refused before anything


def _bad_data(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    return path


CASES = {
    "not UTF-8": (
        {"extra": 'note = "cafX"'},
        (),
        "ab.toml: line {line}: byte 0xe9 is not UTF-8",
    ),
    "gate against itself": (
        {"extra": GATE.format(candidate="base", bounds="max_ratio = 1.0")},
        (),
        "[[gate]] #1: candidate and baseline are both 'base'; a gate compares two different arms",
    ),
    "gate no ratio passes": (
        {"extra": GATE.format(candidate="split", bounds="min_ratio = 1.2\nmax_ratio = 0.8")},
        (),
        "[[gate]] #1: min_ratio 1.2 is above max_ratio 0.8; no ratio can pass",
    ),
    "nan gate bound": (
        {"extra": GATE.format(candidate="split", bounds="min_ratio = nan")},
        (),
        "[[gate]] #1 min_ratio: must be a finite number above 0, got nan",
    ),
    "nan stop_timeout_s": (
        {"replace": {"stop_timeout_s = 10": "stop_timeout_s = nan"}},
        (),
        "[server] stop_timeout_s: must be a finite number, got nan",
    ),
    "inf health_timeout_s": (
        {"replace": {"health_timeout_s = 60": "health_timeout_s = inf"}},
        (),
        "[server] health_timeout_s: must be a finite number, got inf",
    ),
    "nan cell_timeout_s": (
        {"sweep": small_sweep("[1]") + "\ncell_timeout_s = nan"},
        (),
        "[sweep] cell_timeout_s: must be a finite number, got nan",
    ),
    "nan GSM8K threshold": (
        {"gsm8k": "threshold = nan"},
        (),
        "[gsm8k] threshold: must be a finite number, got nan",
    ),
    "nested 100,000 deep": (
        {"extra": "deep = " + "[" * 100_000 + "]" * 100_000},
        (),
        "ab.toml: tables and arrays nested more than 16 levels deep (no key of a configuration "
        "nests deeper than 3)",
    ),
    "20,000-part table name": (
        {"extra": "[" + ".".join(["t"] * 20_000) + "]"},
        (),
        "ab.toml: tables and arrays nested more than 16 levels deep",
    ),
    "port": ({"port": 70000}, (), "[server] port: a TCP port is 1-65535, got 70000"),
    "repeats": (
        {},
        ("--repeats", "1000000000"),
        "[sweep] repeats: must be at most 1,000, got 1,000,000,000",
    ),
    "cells": (
        {},
        ("--concurrencies", ",".join(map(str, range(1, 2001))), "--repeats", "3"),
        "[sweep]: 2 arms x 3 repeats x 2000 load points is 12,000 cells; at most 10,000",
    ),
    "shapes": (
        {
            "sweep": small_sweep("[1]").replace("input_len = 8\noutput_len = 2\n", ""),
            "extra": "".join(
                f"[[shape]]\ninput_len = {n}\noutput_len = 2\n" for n in range(1, 20001)
            ),
        },
        (),
        "[sweep]: 2 arms x 1 repeats x 20000 load points is 40,000 cells; at most 10,000",
    ),
    "arm url without scheme": (
        {"arms": ARMS.replace('name = "split"', 'name = "split"\nurl = "localhost:30000"')},
        (),
        "arm 'split' url 'localhost:30000': give the scheme, e.g. http://localhost:30000",
    ),
    "url without scheme": (
        {},
        ("--url", "split=localhost:30000"),
        "--url 'split=localhost:30000': give the scheme, e.g. http://localhost:30000",
    ),
    "GSM8K line not JSON": (
        {"gsm8k": "num_shots = 1"},
        ("--gsm8k-data", "{data_not_json}"),
        "bad.jsonl': line 2 is not JSON (Expecting value); the eval reads JSON lines",
    ),
    "GSM8K empty line": (
        {"gsm8k": "num_shots = 1"},
        ("--gsm8k-data", "{data_empty_line}"),
        "bad.jsonl': line 2 is empty; the eval reads every line as JSON",
    ),
    "GSM8K data empty": (
        {"gsm8k": "num_shots = 1"},
        ("--gsm8k-data", "{data_empty}"),
        "bad.jsonl': 0 questions; num_shots = 1 takes that many as examples",
    ),
    "GSM8K line without answer": (
        {"gsm8k": "num_shots = 1"},
        ("--gsm8k-data", "{data_no_answer}"),
        "bad.jsonl': line 1 has no 'answer' text; each line needs both",
    ),
    "offline flag": (
        {"sweep": small_sweep("[1]").replace('"random-ids"', '"random"')},
        ("--offline",),
        "offline run (--offline, [run] offline) needs network: ShareGPT from the Hugging Face hub",
    ),
    "offline in the file": (
        {
            "gsm8k": "enabled = true",
            "replace": {"data_path = ": "# data_path = "},
            "extra": "[run]\noffline = true",
        },
        (),
        "offline run (--offline, [run] offline) needs network: the GSM8K test set",
    ),
}


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_run_is_one_line_and_starts_nothing(tmp_path, capsys, case, dry_run):
    changes, flags, expected = CASES[case]
    config = _config(tmp_path, **changes)
    if case == "not UTF-8":  # a Latin-1 e-acute, as an editor in that encoding saves it
        data = config.read_bytes()
        config.write_bytes(data.replace(b"cafX", b"caf\xe9"))
        expected = expected.format(line=data[: data.index(b"cafX")].count(b"\n") + 1)
    data = {
        "{data_not_json}": '{"question": "q", "answer": "#### 1"}\nquestion: q\n',
        "{data_empty_line}": '{"question": "q", "answer": "#### 1"}\n\n',
        "{data_empty}": "",
        "{data_no_answer}": '{"question": "q"}\n',
    }
    flags = tuple(str(_bad_data(tmp_path, data[f])) if f in data else f for f in flags)
    started = time.monotonic()
    line = _refused(tmp_path, config, *flags, *(["--dry-run"] if dry_run else []), capsys=capsys)
    assert expected in line
    assert time.monotonic() - started < 30  # a billion repeats is refused, not planned
    assert not (tmp_path / "run").exists()


def test_a_gsm8k_file_sglangs_eval_reads_passes(tmp_path, capsys):
    # '#' lines are skipped as sglang.utils.read_jsonl skips them.
    data = write_gsm8k(tmp_path / "ok.jsonl", n=3)
    data.write_text("# a comment line\n" + data.read_text())
    config = _config(tmp_path, gsm8k="num_shots = 2")
    assert _run(tmp_path, config, "--dry-run", "--gsm8k-data", str(data)) == 0, capsys.readouterr()


# ---------------------------------------------------------------- the run directory


def test_a_locked_run_directory_is_refused_at_once(tmp_path, capsys):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from sglang_mixgraph.ab import rundir; "
            "rundir.Lock(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = _refused(tmp_path, _config(tmp_path), capsys=capsys)
        assert line == (
            f"sglang-mixgraph ab: run directory {run_dir}: in use by another `ab run` "
            f"(pid {holder.pid}); wait for it to end, or give another --run-dir"
        )
        assert not (run_dir / "run.json").exists()
    finally:
        holder.kill()
        holder.wait()
    # The lock dies with its holder: the directory is free again.
    rundir.Lock(run_dir).release()


def _report(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_another_configuration_is_refused_and_force_new_moves_the_run_aside(tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = _config(tmp_path)
    assert _run(tmp_path, first) == 0, capsys.readouterr().err
    capsys.readouterr()
    old_digest = rundir.recorded_digest(run_dir)
    run_json, report = (run_dir / "run.json").read_text(), (run_dir / "report.md").read_text()
    pids = (tmp_path / "pids").read_text()
    # Adding a load point keeps every finished cell: the same directory goes on.
    assert _run(tmp_path, first, "--concurrencies", "1,2", "--dry-run") == 0
    assert f"configuration {old_digest} -> " in capsys.readouterr().err

    other = _config(tmp_path, sweep=small_sweep("[1]").replace("input_len = 8", "input_len = 9"))
    recorder = Recorder()
    assert _run(tmp_path, other, recorder=recorder) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and recorder.calls == []
    assert f"run directory {run_dir}: holds a run of configuration {old_digest} and this" in err
    assert "leaves out 2 of its finished cells (e.g. cells/base/c00001_r0_" in err
    assert (tmp_path / "pids").read_text() == pids  # no server started
    assert (run_dir / "run.json").read_text() == run_json
    assert (run_dir / "report.md").read_text() == report

    assert _run(tmp_path, other, "--force-new") == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    new_digest = rundir.recorded_digest(run_dir)
    assert new_digest != old_digest
    (aside,) = tmp_path.glob("run.old-*")
    assert f"note: the earlier run is kept in {aside}" in err
    assert rundir.recorded_digest(aside) == old_digest
    assert (aside / "run.json").read_text() == run_json
    assert _report(aside)["passed"] and len(rundir.finished(aside)) == 2
    assert _report(run_dir)["passed"] and len(rundir.finished(run_dir)) == 2


def _cut(raw: Path) -> str | None:
    """Cut the raw output mid-line, as a full disk or a copy would; its text is kept aside."""
    text = raw.read_text()
    raw.write_text(text[: len(text) // 2])
    return text[: len(text) // 2]


def _delete(raw: Path) -> None:
    """Delete the raw output (someone cleaning up): nothing is left to keep aside."""
    raw.unlink()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(_cut, "does not parse as JSON"), (_delete, "is missing")],
    ids=["truncated", "deleted"],
)
def test_a_damaged_cell_is_reported_named_and_measured_again(tmp_path, capsys, damage, reason):
    run_dir = tmp_path / "run"
    config = _config(tmp_path)
    assert _run(tmp_path, config) == 0, capsys.readouterr().err
    capsys.readouterr()
    (raw,) = run_dir.glob("cells/split/*.jsonl")
    kept = damage(raw)

    # Not measuring (the report alone): named as damaged, and the run is not complete.
    assert ab_cli.main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert f"arm=split concurrency=1 repeat=1: damaged: its raw output {raw} {reason}" in err
    assert [c["status"] for c in _report(run_dir)["cells"]] == ["ok", "damaged"]
    assert _run(tmp_path, config, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "  arm=split concurrency=1 repeat=1 (damaged: measured again): " in out

    recorder = Recorder()
    assert _run(tmp_path, config, recorder=recorder) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    line = f"arm=split concurrency=1 repeat=1: finished but damaged, its raw output {raw} {reason}"
    assert line in err
    assert "Traceback" not in err and "free space" not in err, err
    assert len(recorder.calls) == 1 and recorder.bench_servers() == [5.0]
    aside = raw.with_name(raw.name + ".damaged")
    assert (aside.read_text() if aside.exists() else None) == kept
    assert json.loads(raw.read_text().splitlines()[-1])["completed"] == 2
    assert _report(run_dir)["passed"]


def test_a_record_that_is_no_object_is_one_line_naming_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = _config(tmp_path)
    assert _run(tmp_path, config) == 0, capsys.readouterr().err
    capsys.readouterr()
    (record,) = run_dir.glob("cells/split/*.cell.json")
    record.write_text("[1]\n")  # valid JSON, but no record
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    pids = (tmp_path / "pids").read_text()
    expected = (
        f"sglang-mixgraph ab: {record}: not a cell record (JSON list, not an object); move it "
        "away and its cell is measured again"
    )
    for extra in ([], ["--dry-run"]):
        recorder = Recorder()
        assert _run(tmp_path, config, *extra, recorder=recorder) == 2
        err = capsys.readouterr().err
        assert err == expected + "\n" and recorder.calls == []
        assert (tmp_path / "pids").read_text() == pids, "a server was started"
    assert ab_cli.main(["report", str(run_dir)]) == 2
    assert capsys.readouterr().err == expected + "\n"
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before  # nothing written, the report of the finished run kept


def test_a_full_disk_is_one_line_naming_the_run_directory_and_the_file(
    tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "run"
    real_write_text = Path.write_text

    def full(self, data, *args, **kwargs):
        if self.name.endswith(".cell.json.tmp"):  # a record fails as write() fails: no name
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    assert _run(tmp_path, _config(tmp_path)) == 2
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("sglang-mixgraph ab:")]
    assert "Traceback" not in err and len(ours) == 1, err
    (log,) = run_dir.glob("cells/base/*.log")  # the first cell's
    record = log.with_name(log.name.removesuffix(".log") + ".cell.json")
    assert ours[0] == (
        f"sglang-mixgraph ab: run directory {run_dir}: cannot write ({record}): No space left "
        "on device; finished cells are kept, free space and run the same command to resume"
    )
    assert not record.exists() and not list(run_dir.rglob("*.tmp"))
    # the autouse fixture checks that the server it had started is gone


# ---------------------------------------------------------------- the network


def test_dry_run_lists_every_download(tmp_path, capsys):
    config = _config(
        tmp_path,
        sweep=small_sweep("[1]").replace('"random-ids"', '"random"'),
        gsm8k="enabled = true",
        replace={"data_path = ": "# data_path = "},
    )
    assert _run(tmp_path, config, "--dry-run", "--model-path", "org/model") == 0
    needs = [line for line in capsys.readouterr().out.splitlines() if "needs network" in line]
    assert needs == [
        "needs network: the GSM8K test set from raw.githubusercontent.com (SGLang's eval "
        "downloads it) (to avoid it: [gsm8k] data_path or --gsm8k-data, a local test.jsonl)",
        "needs network: ShareGPT from the Hugging Face hub (bench_serving's dataset 'random' "
        "draws its prompts from it) (to avoid it: [sweep] dataset_path, a local ShareGPT JSON "
        'file, or dataset = "random-ids")',
        "needs network: the model 'org/model' from the Hugging Face hub (the server downloads "
        "its weights, bench_serving its tokenizer) (to avoid it: [server] model_path, a local "
        "directory)",
    ]
    # Given locally, nothing is fetched.
    assert _run(tmp_path, _config(tmp_path, gsm8k="enabled = true"), "--dry-run") == 0
    assert "needs network" not in capsys.readouterr().out


TRUNCATED = sharegpt_text(3)[:-1]  # the closing bracket lost, as a cut-off copy loses it
SHAREGPT_CASES = {
    "truncated": (
        TRUNCATED,
        f"does not parse as JSON (Expecting ',' delimiter: line 1 column {len(TRUNCATED) + 1} "
        f"(char {len(TRUNCATED)}); truncated?); bench_serving's dataset 'random' would download "
        "ShareGPT in its place",
    ),
    "nested too deep": (
        "[" * 100_000,
        "does not parse as JSON (nested too deeply; truncated?)",
    ),
    "not a list": ('{"conversations": []}', "a JSON dict; ShareGPT is a list of conversations"),
    "entry no object": (
        "[1]",
        "entry 0 is no conversation (an object whose 'conversations' list has turns with a "
        "'value' text); bench_serving would fail on it",
    ),
    "turn without value": (
        json.dumps([{"conversations": [{"from": "human"}, {"value": "x"}]}]),
        "entry 0 is no conversation",
    ),
    "too few": (
        sharegpt_text(1),
        "1 conversations of two turns or more to prompt from; a cell sends up to 2 prompts, one "
        "per conversation",
    ),
}


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("case", list(SHAREGPT_CASES))
def test_a_dataset_file_bench_serving_cannot_read_is_one_line(tmp_path, capsys, case, dry_run):
    text, expected = SHAREGPT_CASES[case]
    data = tmp_path / "sharegpt.json"
    data.write_text(text)
    sweep = small_sweep("[1]").replace('"random-ids"', '"random"')
    config = _config(tmp_path, sweep=f'{sweep}\ndataset_path = "{data}"')
    line = _refused(
        tmp_path, config, "--offline", *(["--dry-run"] if dry_run else []), capsys=capsys
    )
    assert line.startswith(f"sglang-mixgraph ab: [sweep] dataset_path '{data}': "), line
    assert expected in line, line
    assert not (tmp_path / "run").exists()


def test_a_dataset_file_that_passes_is_read_by_bench_serving_offline(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    # Offline with an empty cache: had bench_serving found the file unusable and fallen back to
    # downloading ShareGPT, its cells would fail.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    data = tmp_path / "sharegpt.json"
    data.write_text(sharegpt_text(2))  # as many conversations as a cell sends prompts
    sweep = small_sweep("[1]").replace('"random-ids"', '"random"')
    config = _config(tmp_path, sweep=f'{sweep}\ndataset_path = "{data}"')
    assert _run(tmp_path, config, "--offline") == 0, capsys.readouterr().err
    for log in (tmp_path / "run").glob("cells/*/*.log"):
        assert "treat as invalid file" not in log.read_text()  # upstream's note before a fetch
    assert _report(tmp_path / "run")["passed"]


def test_a_failed_download_names_the_setting_that_avoids_it(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    # bench_serving's `random` dataset downloads ShareGPT through huggingface_hub: offline and
    # with an empty cache, the download fails as on a cluster without internet access.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = _config(tmp_path, sweep=small_sweep("[1]").replace('"random-ids"', '"random"'))
    assert _run(tmp_path, config) == 1
    err = capsys.readouterr().err
    summary = err.splitlines()[-2:]  # the closing summary: one line per failed cell
    for arm, line in zip(("base", "split"), summary, strict=True):
        (log,) = (tmp_path / "run").glob(f"cells/{arm}/*.log")
        assert line == (
            f"sglang-mixgraph ab: arm={arm} concurrency=1 repeat=1: failed: needs network: "
            "ShareGPT from the Hugging Face hub (bench_serving's dataset 'random' draws its "
            "prompts from it) failed; set [sweep] dataset_path, a local ShareGPT JSON file, "
            f'or dataset = "random-ids" (log {log})'
        )
        assert "LocalEntryNotFoundError" in log.read_text()


def test_the_closing_summary_names_each_failed_cell_and_its_log(tmp_path, capsys):
    crash = f'command = ["{sys.executable}", "-c", "print(1234); raise SystemExit(7)"]'
    config = _config(tmp_path, replace={f'command = ["{sys.executable}", "{STANDIN}"]': crash})
    assert _run(tmp_path, config) == 1
    summary = capsys.readouterr().err.splitlines()[-2:]
    for arm, line in zip(("base", "split"), summary, strict=True):
        log = tmp_path / "run" / "servers" / f"{arm}_1.log"
        assert line == (
            f"sglang-mixgraph ab: arm={arm} concurrency=1 repeat=1: failed: no server: arm "
            f"{arm!r}: the server exited with code 7 during startup; log {log}"
        )
        assert "1234" in log.read_text()


@pytest.mark.parametrize(
    ("kind", "log", "avoid"),
    [
        (
            "gsm8k",
            "requests.exceptions.ConnectionError: HTTPSConnectionPool(host="
            "'raw.githubusercontent.com', port=443): Max retries exceeded",
            "[gsm8k] data_path or --gsm8k-data, a local test.jsonl",
        ),
        (
            "bench",
            '  File ".../sglang/benchmark/datasets/random.py", in sample_random_requests\n'
            "    repo_id=SHAREGPT_REPO_ID,\n"
            "huggingface_hub.errors.LocalEntryNotFoundError: An error happened",
            '[sweep] dataset_path, a local ShareGPT JSON file, or dataset = "random-ids"',
        ),
        (
            "bench",
            "OSError: We couldn't connect to 'https://huggingface.co' to load the files of "
            "org/model (its tokenizer)",
            "[server] model_path, a local directory",
        ),
        ("bench", "aiohttp.ClientConnectorError: Connection refused (127.0.0.1:30000)", None),
    ],
    ids=["gsm8k data", "sharegpt", "tokenizer", "local server"],
)
def test_which_download_failed_is_read_from_the_log(tmp_path, kind, log, avoid):
    from sglang_mixgraph.ab.config import parse_config, read_toml
    from sglang_mixgraph.ab.network import failed_fetch

    config_path = _config(
        tmp_path,
        sweep=small_sweep("[1]").replace('"random-ids"', '"random"'),
        gsm8k="enabled = true",
        replace={"data_path = ": "# data_path = "},
    )
    raw = read_toml(config_path)
    raw["server"]["model_path"] = "org/model"
    fetch = failed_fetch(parse_config(raw), kind, log)
    assert (fetch and fetch.avoid) == avoid


# ---------------------------------------------------------------- the tools' own parsers


def _sglang_launch(tmp_path: Path, arm_args: str, *, server_args: str = "[]", **kwargs) -> Path:
    """A configuration whose arms launch SGLang's launch_server (no [server] command)."""
    kwargs.setdefault(
        "arms", f'[[arm]]\nname = "base"\n\n[[arm]]\nname = "split"\nargs = {arm_args}'
    )
    text = _config(tmp_path, **kwargs).read_text()
    text = text.replace(f'command = ["{sys.executable}", "{STANDIN}"]\n', "")
    text, count = re.subn(r'^args = \["--gsm8k-data".*$', f"args = {server_args}", text, flags=re.M)
    assert count == 1
    path = tmp_path / "ab.toml"
    path.write_text(text)
    return path


PARSER_CASES = {
    "unknown server argument": (
        {"arm_args": '["--tpp", "8"]'},
        "arm 'split' server argument --tpp: SGLang's parser does not know it (did you mean "
        "--tp-size or --pp-size?)",
    ),
    "server argument value": (
        {"arm_args": '["--chunked-prefill-size", "abc"]'},
        "arm 'split' server argument --chunked-prefill-size: invalid int value: 'abc' "
        "(SGLang's parser)",
    ),
    "shared server argument": (
        {"arm_args": "[]", "server_args": '["--enable-mixed-chunks"]'},
        "[server] args --enable-mixed-chunks: SGLang's parser does not know it (did you mean "
        "--enable-mixed-chunk?)",
    ),
    "command ending in launch_server": (
        {
            "arm_args": '["--tpp", "8"]',
            "server": f'command = ["{sys.executable}", "-m", "sglang.launch_server"]',
        },
        "arm 'split' server argument --tpp: SGLang's parser does not know it",
    ),
    "misspelt dataset": (
        {"arm_args": "[]", "sweep": small_sweep("[1]").replace('"random-ids"', '"randon-ids"')},
        "[sweep] dataset 'randon-ids': bench_serving's parser does not know it (did you mean "
        "'random-ids'?)",
    ),
    "unknown load-generator flag": (
        {"arm_args": "[]", "sweep": small_sweep("[1]") + '\nextra_args = ["--num-promts", "3"]'},
        "[sweep] extra_args --num-promts: bench_serving's parser does not know it (did you mean "
        "--num-prompts?)",
    ),
    "load-generator flag without its value": (
        {"arm_args": "[]", "sweep": small_sweep("[1]") + '\nextra_args = ["--tokenizer"]'},
        "[sweep] extra_args --tokenizer: expected one argument (bench_serving's parser)",
    ),
}


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("case", list(PARSER_CASES))
def test_what_the_tools_parsers_refuse_is_one_line_naming_it(
    tmp_path, capsys, monkeypatch, case, dry_run
):
    from sglang_mixgraph.ab import server

    launched = []
    monkeypatch.setattr(server, "launch", lambda *a, **k: launched.append(a))
    changes, expected = PARSER_CASES[case]
    config = _sglang_launch(tmp_path, **changes)
    line = _refused(tmp_path, config, *(["--dry-run"] if dry_run else []), capsys=capsys)
    assert line.startswith(f"sglang-mixgraph ab: {expected}"), line
    assert launched == [] and not (tmp_path / "run").exists()


def test_what_the_tools_parsers_take_passes_and_another_commands_args_are_its_own(tmp_path, capsys):
    ok = {"arm_args": '["--tp-size", "1", "--chunked-prefill-size=4096"]'}
    flags = '\nextra_args = ["--tokenizer", "x", "--disable-stream"]'
    config = _sglang_launch(tmp_path, **ok, sweep=small_sweep("[1]") + flags)
    # --dry-run resolves each arm as `plan` does: from the model's config.json
    (tmp_path / "model" / "config.json").write_text(json.dumps(DENSE_LLAMA))
    assert _run(tmp_path, config, "--dry-run") == 0, capsys.readouterr().err
    assert "--chunked-prefill-size=4096" in capsys.readouterr().out
    # The stand-in's arguments (--tpot-ms) are not SGLang's: its command is not launch_server.
    assert _run(tmp_path, _config(tmp_path), "--dry-run") == 0, capsys.readouterr().err


def test_bench_serving_still_builds_its_parser_in_cli_main():
    """What `bench_parser` relies on in sglang.benchmark.serving: `cli_main` builds the parser
    and parses first; the parser it hands back knows the flags every cell passes."""
    from sglang.benchmark import serving

    from sglang_mixgraph.ab.tool_parsers import bench_parser

    before = serving.ArgumentParser
    parser = bench_parser()
    assert serving.ArgumentParser is before  # put back
    options = {o for action in parser._actions for o in action.option_strings}
    assert {"--dataset-name", "--max-concurrency", "--request-rate", "--goodput"} <= options
    assert "random-ids" in next(a.choices for a in parser._actions if a.dest == "dataset_name")
