"""`sglang-mixgraph ab` end to end against the stand-in server, on a CPU.

The tool launches the stand-in (sglang_mixgraph/ab/standin.py) through its own launch path, and
SGLang's real `sglang.benchmark.serving` and GSM8K eval (`sglang.test.run_eval`) drive it. The checks:
the report's numbers are what the stand-in was set to produce, accuracy is the known fraction,
arms are interleaved A B B A, a second run skips every finished cell, a server that dies gives
a clear error and keeps what was measured, Ctrl-C and startup failures leave no process
behind, the accuracy-only CI mode exits 1 below its threshold, and a launch prefix (a wrapper
in front of the server, global or per arm) really runs and is stopped with its server.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from ab_kit import (
    FLAG,
    STANDIN,
    Recorder,
    expected_accuracy,
    free_port,
    pids_alive,
    small_sweep,
    standin_config,
    watching_invoker,
    write_gsm8k,
    write_model_dir,
    write_wrapper,
)

from sglang_mixgraph.ab import cli as ab_cli
from sglang_mixgraph.ab import runner
from sglang_mixgraph.ab import server as servers
from sglang_mixgraph.ab import versions as ab_versions
from sglang_mixgraph.ab.config import parse_config, read_toml
from sglang_mixgraph.ab.tools import GSM8K_MODULE
from sglang_mixgraph.resolution.serving_client import BENCH_MODULE

TTFT_MS = 30.0


TWO_ARMS = """
[[arm]]
name = "base"
args = ["--tpot-ms", "10"]

[[arm]]
name = "split"
env = { SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN = "1" }
args = ["--tpot-ms", "5"]
"""


@pytest.fixture(autouse=True)
def _offline_and_pids(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("STANDIN_PID_FILE", str(tmp_path / "pids"))
    monkeypatch.delenv("STANDIN_DIE_AFTER", raising=False)
    yield
    assert pids_alive(tmp_path / "pids") == [], "a server process outlived the run"


def _run(config: Path, run_dir: Path, invoker, *extra: str) -> int:
    return ab_cli.main(["run", str(config), "--run-dir", str(run_dir), *extra], invoker=invoker)


def _run_passes(config: Path, run_dir: Path, capsys) -> Recorder:
    """`_run` with a new Recorder, which must exit 0 (stderr is the failure message)."""
    recorder = Recorder()
    assert _run(config, run_dir, recorder) == 0, capsys.readouterr().err
    return recorder


def test_sweep_numbers_accuracy_order_and_resume(tmp_path, capsys):
    config = standin_config(
        tmp_path,
        arms=TWO_ARMS,
        sweep="""concurrencies = [2]
dataset = "random-ids"
input_len = 16
output_len = 8
min_prompts = 6
warmup_requests = 1
repeats = 2""",
        gsm8k="num_examples = 12\nnum_shots = 2\nparallel = 4\nthreshold = 0.5",
        extra="""[[gate]]
metric = "median_tpot_ms"
candidate = "split"
baseline = "base"
concurrency = 2
max_ratio = 0.75""",
    )
    run_dir = tmp_path / "run"
    recorder = _run_passes(config, run_dir, capsys)

    # Interleaved: base, split (repeat 1), then split, base (repeat 2); GSM8K on first visits.
    assert [m for m, _ in recorder.calls] == [GSM8K_MODULE, BENCH_MODULE] * 2 + [BENCH_MODULE] * 2
    assert recorder.bench_servers() == [10.0, 5.0, 5.0, 10.0]

    results = json.loads((run_dir / "results.json").read_text())
    assert results["passed"] and results["problems"] == []
    for arm, tpot in (("base", 10.0), ("split", 5.0)):
        s = results["summary"][arm]["2"]
        assert s["median_tpot_ms"]["n"] == 2
        assert s["median_tpot_ms"]["mean"] == pytest.approx(tpot, rel=0.3)
        assert s["median_ttft_ms"]["mean"] == pytest.approx(TTFT_MS, rel=0.6)
        assert s["median_itl_ms"]["mean"] == pytest.approx(tpot, rel=0.3)
        # Two requests at a time, each TTFT + 7 TPOT long; one GPU (the stand-in's tp_size).
        expected = 2 * 8 / ((TTFT_MS + 7 * tpot) / 1000)
        assert s["output_throughput_per_gpu"]["mean"] == pytest.approx(expected, rel=0.35)
        assert results["gsm8k"][arm]["score"] == pytest.approx(expected_accuracy(2, 12, 4))
        # bench_serving's end-to-end latency and request rate, tok/s per user from the TPOT
        e2e_ms = TTFT_MS + 7 * tpot
        assert s["median_e2e_latency_ms"]["mean"] == pytest.approx(e2e_ms, rel=0.35)
        assert s["request_throughput"]["mean"] == pytest.approx(2 / (e2e_ms / 1000), rel=0.35)
        assert s["output_tok_per_s_per_user"]["mean"] == pytest.approx(
            1000 / s["median_tpot_ms"]["mean"], rel=0.05
        )
    # split decodes faster and serves more per GPU: its point alone is on the joint frontier
    (rows,) = results["pareto"].values()  # one shape
    frontier = {r["arm"]: r for r in rows}
    assert frontier["split"]["joint_frontier"] and not frontier["base"]["joint_frontier"]
    assert frontier["base"]["arm_frontier"] and frontier["split"]["arm_frontier"]
    (diff,) = results["gsm8k_differences"]  # the same answers: no difference, 0 inside
    assert diff["difference"] == 0 and diff["low"] < 0 < diff["high"]
    assert results["schema_version"] == 1
    ratio = results["ratios_vs_baseline"]["split"]["2"]["median_tpot_ms"]
    assert ratio["mean"] == pytest.approx(0.5, rel=0.2) and ratio["n"] == 2
    assert results["gates"][0]["passed"] is True

    # The arm's environment reached its server, the baseline's did not set it.
    raw = {c["arm"]: c["raw"] for c in results["cells"] if c["kind"] == "bench"}
    for arm, value in (("base", None), ("split", "1")):
        line = json.loads((run_dir / raw[arm]).read_text().splitlines()[-1])
        assert line["server_info"]["standin"][FLAG] == value

    report = (run_dir / "report.md").read_text()
    assert "**Result: PASS**" in report and "| `split` / `base` |" in report

    # Resume: every cell is done, so nothing runs and no server starts.
    pids_before = (tmp_path / "pids").read_text()
    again = Recorder()
    assert _run(config, run_dir, again) == 0
    assert again.calls == []
    assert (tmp_path / "pids").read_text() == pids_before

    # One more concurrency: only its cells run, the others are kept.
    more = Recorder()
    assert _run(config, run_dir, more, "--concurrencies", "2,3") == 0
    conc = [argv[argv.index("--max-concurrency") + 1] for m, argv in more.calls]
    assert conc == ["3"] * 4


def test_dead_server_fails_its_cell_keeps_the_rest_and_resumes(tmp_path, monkeypatch, capsys):
    config = standin_config(
        tmp_path,
        arms=TWO_ARMS,
        sweep="""concurrencies = [1, 2]
dataset = "random-ids"
input_len = 8
output_len = 4
min_prompts = 4
warmup_requests = 1
repeats = 1""",
    )
    run_dir = tmp_path / "run"
    # Concurrency 1 sends 1 warm-up + 6 (6 x 1) requests; the server dies inside concurrency 2.
    monkeypatch.setenv("STANDIN_DIE_AFTER", "10")
    assert _run(config, run_dir, Recorder()) == 1
    err = capsys.readouterr().err
    assert "arm 'base': the server exited with code 3 during arm=base concurrency=2" in err
    assert "arm 'split': the server exited with code 3 during arm=split concurrency=2" in err
    results = json.loads((run_dir / "results.json").read_text())
    status = {(c["arm"], c["concurrency"]): c["status"] for c in results["cells"]}
    assert status == {
        ("base", 1): "ok",
        ("base", 2): "failed",
        ("split", 1): "ok",
        ("split", 2): "failed",
    }
    assert "**Result: FAIL**" in (run_dir / "report.md").read_text()

    monkeypatch.delenv("STANDIN_DIE_AFTER")
    resumed = Recorder()
    assert _run(config, run_dir, resumed) == 0
    assert [argv[argv.index("--max-concurrency") + 1] for _, argv in resumed.calls] == ["2", "2"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_mid_run_stops_the_server(tmp_path, capsys, sig):
    """A cancelled job or a closed terminal (the demo's stand-in included): the server's whole
    group is stopped, exit 130 in one line and no traceback, finished cells kept."""
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=small_sweep("[1, 2]"))
    run_dir = tmp_path / "run"

    class Signalled(Recorder):
        def __call__(self, module, argv, log_path, timeout_s, watch):
            if len(self.calls) == 1:  # during the second cell, as a real signal arrives
                self.calls.append((module, argv))
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises here
            return super().__call__(module, argv, log_path, timeout_s, watch)

    assert _run(config, run_dir, Signalled()) == ab_cli.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "run the same command to resume" in err
    results = json.loads((run_dir / "results.json").read_text())
    assert [c["status"] for c in results["cells"]] == ["ok", "missing", "missing", "missing"]
    # the autouse fixture checks that the server and its child are gone


def test_ctrl_c_stops_the_server_and_keeps_finished_cells(tmp_path, capsys):
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=small_sweep("[1, 2]"))
    run_dir = tmp_path / "run"
    assert _run(config, run_dir, Recorder(interrupt_at=2)) == ab_cli.EXIT_INTERRUPTED
    assert "run the same command to resume" in capsys.readouterr().err
    results = json.loads((run_dir / "results.json").read_text())
    assert [c["status"] for c in results["cells"]] == ["ok", "missing", "missing", "missing"]
    # the autouse fixture checks that the server and its child are gone


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (
            [sys.executable, "-c", "import sys; print('no GPU here'); sys.exit(7)"],
            "the server exited with code 7 during startup",
        ),
        (
            [
                sys.executable,
                "-c",
                "import os, time; open(os.environ['STANDIN_PID_FILE'], 'a')"
                ".write(f'{os.getpid()} '); time.sleep(600)",
            ],
            "did not become healthy within 1 s",
        ),
    ],
)
def test_server_that_never_becomes_healthy(tmp_path, capsys, command, message):
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep="concurrencies = [1]\nrepeats = 1")
    text = config.read_text().replace(
        f'command = ["{sys.executable}", "{STANDIN}"]', f"command = {json.dumps(command)}"
    )
    config.write_text(text.replace("health_timeout_s = 60", "health_timeout_s = 1"))
    start = time.monotonic()
    assert _run(config, tmp_path / "run", Recorder()) == 1
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert message in err
    if "sys.exit(7)" in command[-1]:
        assert "no GPU here" in err  # the server log's tail is shown


# Slow tier (about 14 s); --accuracy-only's configuration is checked in test_ab_config.py.
@pytest.mark.slow
def test_accuracy_only_ci_mode_attached_exits_1_below_threshold(tmp_path):
    """The CI use: one arm, attached, `python -m` the real CLI and the real child processes."""
    port = free_port()
    model = write_model_dir(tmp_path / "model")
    data = write_gsm8k(tmp_path / "gsm8k.jsonl")
    server = subprocess.Popen(
        [sys.executable, str(STANDIN), "--model-path", str(model), "--port", str(port)]
        + ["--gsm8k-data", str(data), "--wrong-every", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the stand-in starts a child; both go with the group
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health_generate", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        config = tmp_path / "ci.toml"
        config.write_text(
            '[[arm]]\nname = "candidate"\n[gsm8k]\nnum_examples = 10\nnum_shots = 3\n'
            "parallel = 4\nthreshold = 0.9\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        result = subprocess.run(
            [sys.executable, "-m", "sglang_mixgraph.cli", "ab", "run", str(config)]
            + ["--accuracy-only", "--url", f"candidate={url}", "--gsm8k-data", str(data)]
            + ["--run-dir", str(tmp_path / "run")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    accuracy = expected_accuracy(3, 10, 2)
    assert accuracy < 0.9
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"accuracy {accuracy:.3f} is below the threshold 0.9" in result.stderr
    assert "Traceback" not in result.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["gsm8k"]["candidate"]["score"] == pytest.approx(accuracy)
    assert results["gsm8k"]["candidate"]["passed"] is False


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_launch_prefix_global_per_arm_and_none(tmp_path, monkeypatch, capsys):
    """Each arm's server goes through the wrapper it is given, and saw it (STANDIN_WRAPPER)."""
    monkeypatch.delenv("STANDIN_WRAPPER", raising=False)
    shared = write_wrapper(tmp_path / "wrap_shared.sh", "shared")  # run through bash
    own = write_wrapper(tmp_path / "wrap_own.sh", "own", executable=True)  # run directly
    config = standin_config(
        tmp_path,
        server=f'launch_prefix = ["bash", "{shared}"]',
        arms=f"""
[[arm]]
name = "base"

[[arm]]
name = "own"
launch_prefix = ["{own}"]

[[arm]]
name = "plain"
launch_prefix = []
""",
        sweep=small_sweep("[1]"),
    )
    run_dir = tmp_path / "run"
    _run_passes(config, run_dir, capsys)

    results = json.loads((run_dir / "results.json").read_text())
    raw = {c["arm"]: c["raw"] for c in results["cells"] if c["kind"] == "bench"}
    seen = {}
    for arm in ("base", "own", "plain"):
        line = json.loads((run_dir / raw[arm]).read_text().splitlines()[-1])
        seen[arm] = line["server_info"]["standin"].get("wrapper")
    assert seen == {"base": "shared", "own": "own", "plain": None}

    standin = f"{sys.executable} {STANDIN}"
    headers = {
        arm: (run_dir / "servers" / f"{arm}_1.log").read_text().splitlines()[1] for arm in seen
    }
    assert headers["base"].startswith(f"=== sglang-mixgraph ab: bash {shared} {standin} ")
    assert headers["own"].startswith(f"=== sglang-mixgraph ab: {own} {standin} ")
    assert headers["plain"].startswith(f"=== sglang-mixgraph ab: {standin} ")
    log = (run_dir / "servers" / "base_1.log").read_text()
    assert "stand-in serving on 127.0.0.1:" in log and "through wrapper shared" in log
    # Two wrappers (their pid each) and three stand-ins (pid and child each) started; the
    # autouse fixture checks every one of them is gone.
    assert len((tmp_path / "pids").read_text().split()) == 2 + 3 * 2


def test_stop_kills_the_wrapper_and_the_server_it_started(tmp_path, monkeypatch):
    """With a prefix the server is the wrapper's child: stopping signals the whole group."""
    monkeypatch.delenv("STANDIN_WRAPPER", raising=False)
    wrapper = write_wrapper(tmp_path / "wrap.sh", "shared")
    path = standin_config(
        tmp_path,
        server=f'launch_prefix = "bash {wrapper}"',  # a string is split like a shell
        arms=TWO_ARMS,
        sweep="concurrencies = [1]",
    )
    config = parse_config(read_toml(path))
    server = servers.launch(config, config.arm("base"), tmp_path / "server.log")
    try:
        wrapper_pid, standin_pid, child_pid = map(int, (tmp_path / "pids").read_text().split())
        assert wrapper_pid == server.proc.pid  # the wrapper leads the group ...
        assert _ppid(standin_pid) == wrapper_pid  # ... the server is its child, not exec'd
        assert _ppid(child_pid) == standin_pid  # ... and the server's own child a grandchild
    finally:
        left = server.stop()
    assert left == []
    assert pids_alive(tmp_path / "pids") == []


# ---------------------------------------------------------------- stopping cannot be interrupted


def _signal_once_sigterm_is_seen(logs: Path, sig: int) -> threading.Thread:
    """Deliver `sig` to this process once a trapping stand-in logged its SIGTERM: then the
    tool is inside Server.stop(), waiting out the grace."""

    def deliver():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any("got SIGTERM" in p.read_text() for p in logs.parent.glob(logs.name)):
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=deliver, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def sigterm_raises():
    """SIGTERM as `ab run` handles it (an interrupt), so a test process survives one."""
    previous = signal.signal(signal.SIGTERM, ab_cli._raise_interrupt)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_stop_still_kills_the_whole_group(
    tmp_path, monkeypatch, sigterm_raises, sig
):
    """The server ignores SIGTERM (a long shutdown); a signal during the 120 s grace must not
    abort the stop: the group is SIGKILLed at once, and the interrupt comes after."""
    monkeypatch.setenv("STANDIN_TRAP_SIGTERM", "1")
    path = standin_config(tmp_path, arms=TWO_ARMS, sweep="concurrencies = [1]")
    path.write_text(path.read_text().replace("stop_timeout_s = 10", "stop_timeout_s = 120"))
    config = parse_config(read_toml(path))
    log = tmp_path / "server.log"
    server = servers.launch(config, config.arm("base"), log)
    assert len(pids_alive(tmp_path / "pids")) == 2  # the stand-in and its child
    thread = _signal_once_sigterm_is_seen(log, sig)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        server.stop()
    assert time.monotonic() - started < 30  # not the 120 s grace
    thread.join(timeout=5)
    assert "got SIGTERM" in log.read_text()
    assert pids_alive(tmp_path / "pids") == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_second_signal_after_ctrl_c_leaves_no_server(tmp_path, monkeypatch, capsys, sig):
    """Ctrl-C mid-cell, then a second Ctrl-C (or SIGTERM) while the server shuts down."""
    monkeypatch.setenv("STANDIN_TRAP_SIGTERM", "1")
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=small_sweep("[1, 2]"))
    config.write_text(config.read_text().replace("stop_timeout_s = 10", "stop_timeout_s = 120"))
    run_dir = tmp_path / "run"

    class SecondSignal(Recorder):
        def __call__(self, module, argv, log_path, timeout_s, watch):
            if len(self.calls) == 1:  # the first Ctrl-C, during the second cell
                _signal_once_sigterm_is_seen(run_dir / "servers" / "base_*.log", sig)
            return super().__call__(module, argv, log_path, timeout_s, watch)

    started = time.monotonic()
    assert _run(config, run_dir, SecondSignal(interrupt_at=2)) == ab_cli.EXIT_INTERRUPTED
    assert time.monotonic() - started < 60
    assert "got SIGTERM" in (run_dir / "servers" / "base_1.log").read_text()
    assert pids_alive(tmp_path / "pids") == []
    assert "run the same command to resume" in capsys.readouterr().err


def test_pids_that_outlive_sigkill_are_printed(monkeypatch, capsys):
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    monkeypatch.setattr(servers, "_running_members", lambda pgid: [4194000, 4194001])
    server = servers.Server(arm="base", url="http://x", proc=proc, stop_timeout_s=1.0)
    assert server.stop() == [4194000, 4194001]
    assert proc.poll() is not None  # the real one was killed and reaped
    err = capsys.readouterr().err
    assert f"arm 'base': server processes [4194000, 4194001] (process group {proc.pid})" in err
    assert "kill -9 4194000 4194001" in err


# ---------------------------------------------------------------- versions in every cell


def test_a_changed_version_measures_finished_cells_again(tmp_path, monkeypatch, capsys):
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=small_sweep("[1]"))
    run_dir = tmp_path / "run"
    env = {
        "sglang": "0.5.23",
        "sglang_mixgraph": "0.1.0",
        "torch": "2.9.1",
        "git_commit": "0123456789abcdef0123",
        "dirty": False,
        "gpus": {"count": 8, "names": ["NVIDIA H200"] * 8},
    }
    monkeypatch.setattr(ab_versions, "environment", lambda: dict(env))
    _run_passes(config, run_dir, capsys)
    results = json.loads((run_dir / "results.json").read_text())
    assert all(c["versions"] == env for c in results["cells"])
    report = (run_dir / "report.md").read_text()
    assert (
        "- measured with: sglang 0.5.23, sglang-mixgraph 0.1.0, torch 2.9.1, commit "
        "0123456789ab, GPUs: 8 x NVIDIA H200 (2 cells)"
    ) in report
    assert "- SGLang of `base`'s server (its /server_info): 0.0.0+standin" in report

    again = Recorder()  # same versions: nothing runs
    assert _run(config, run_dir, again) == 0 and again.calls == []
    env["dirty"] = True  # noted, not compared
    assert _run(config, run_dir, again) == 0 and again.calls == []
    capsys.readouterr()

    env["sglang"] = "0.5.24"  # an upgrade: every finished cell is measured again
    argv = ["run", str(config), "--run-dir", str(run_dir), "--dry-run"]
    assert ab_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "(0 done)" in out and "(1 done)" not in out
    assert "measured again for other versions: sglang 0.5.23 -> 0.5.24" in out
    assert ab_cli.main([*argv, "--reuse-cells"]) == 0
    assert "(0 done)" not in capsys.readouterr().out
    kept = Recorder()
    assert _run(config, run_dir, kept, "--reuse-cells") == 0 and kept.calls == []
    upgraded = Recorder()
    assert _run(config, run_dir, upgraded) == 0
    assert [m for m, _ in upgraded.calls] == [BENCH_MODULE, BENCH_MODULE]
    assert "2 finished cells were measured with other versions (sglang 0.5.23 -> 0.5.24)" in (
        capsys.readouterr().err
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert {c["versions"]["sglang"] for c in results["cells"]} == {"0.5.24"}

    # A record from before versions existed: measured again, kept with --reuse-cells.
    record = next((run_dir / "cells" / "split").glob("*.cell.json"))
    data = json.loads(record.read_text())
    del data["versions"]
    record.write_text(json.dumps(data))
    assert _run(config, run_dir, Recorder(), "--reuse-cells") == 0
    assert "versions not recorded" not in capsys.readouterr().err
    assert "- measured with: not recorded" in (run_dir / "report.md").read_text()
    old = Recorder()
    assert _run(config, run_dir, old) == 0
    assert len(old.calls) == 1
    assert "(versions not recorded)" in capsys.readouterr().err


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_an_unreadable_gpu_inventory_keeps_finished_cells(tmp_path, monkeypatch, capsys):
    """Measured while nvidia-smi named one H100, resumed while it fails: unknown is not
    another machine, so nothing is measured again and every cell and raw output is byte for
    byte what it was. GPUs that do differ (a name with a non-UTF-8 byte, no traceback) are
    measured again, the earlier raw output kept as `.superseded`."""
    from sglang_mixgraph.kits.fake_nvidia_smi import fake_nvidia_smi

    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=small_sweep("[1]"))
    run_dir = tmp_path / "run"

    def nvidia_smi(answer) -> None:  # NVML is not here: versions asks nvidia-smi
        monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", answer))
        ab_versions.environment.cache_clear()

    def no_nvml():
        raise ab_versions._NoNvml

    monkeypatch.setattr(ab_versions, "_nvml_gpus", no_nvml)
    try:
        nvidia_smi("NVIDIA H100 80GB HBM3, 570.124.06")
        _run_passes(config, run_dir, capsys)
        capsys.readouterr()
        before = _files(run_dir / "cells")
        (record,) = (run_dir / "cells" / "base").glob("*.cell.json")
        assert json.loads(record.read_text())["versions"]["gpus"] == {
            "count": 1,
            "names": ["NVIDIA H100 80GB HBM3"],
            "driver": "570.124.06",
        }

        nvidia_smi(None)  # exits 9: the driver cannot be reached
        unknown = Recorder()
        assert _run(config, run_dir, unknown) == 0 and unknown.calls == []
        err = capsys.readouterr().err
        assert (
            "this machine's GPUs are unknown (nvidia-smi exited 9): finished cells are kept "
            "(an unreadable GPU inventory is not another machine)"
        ) in err
        assert "other versions" not in err and "Traceback" not in err
        assert _files(run_dir / "cells") == before

        nvidia_smi(b"NVIDIA H\xff100, 570.124.06\n")
        other = Recorder()
        assert _run(config, run_dir, other) == 0 and len(other.calls) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert (
            "2 finished cells were measured with other versions (gpus 1 x NVIDIA H100 80GB "
            "HBM3, driver 570.124.06 -> 1 x NVIDIA H\ufffd100, driver 570.124.06): measuring "
            "them again, their raw outputs kept as *.superseded"
        ) in err
        for name, data in before.items():
            if name.endswith(".jsonl"):
                assert (run_dir / "cells" / f"{name}.superseded").read_bytes() == data
    finally:
        ab_versions.environment.cache_clear()


# ---------------------------------------------------------------- goodput, rates, shapes, counts

SLO_ARMS = """
[[arm]]
name = "base"
args = ["--tpot-ms", "10", "--tpot-per-running-ms", "2"]

[[arm]]
name = "split"
args = ["--tpot-ms", "5", "--tpot-per-running-ms", "2"]
"""


def test_goodput_from_bench_serving_per_arm_and_concurrency_and_in_a_gate(tmp_path, capsys):
    """SLO TPOT 15 ms: at concurrency 1 both arms meet it (12 and 7 ms), at 4 only `split`
    (18 against 13 ms). Goodput is bench_serving's own number, and a gate can use it."""
    config = standin_config(
        tmp_path,
        arms=SLO_ARMS,
        sweep=small_sweep("[1, 4]")
        .replace("output_len = 2", "output_len = 6")
        .replace("num_prompts = 2", "num_prompts = 8"),
        extra="""[slo]
tpot_ms = 15
ttft_ms = 1000
attainment = 0.9

[[gate]]
metric = "request_goodput"
candidate = "split"
baseline = "base"
concurrency = 1
min_ratio = 1.0""",
    )
    run_dir = tmp_path / "run"
    recorder = _run_passes(config, run_dir, capsys)
    for _, argv in recorder.calls:
        assert argv[argv.index("--goodput") :][:3] == ["--goodput", "ttft:1000", "tpot:15"]
    results = json.loads((run_dir / "results.json").read_text())
    attainment = {
        (arm, conc): results["summary"][arm][conc]["slo_attainment"]["mean"]
        for arm in ("base", "split")
        for conc in ("1", "4")
    }
    assert attainment == {("base", "1"): 1.0, ("base", "4"): 0.0, ("split", "1"): 1.0,
                          ("split", "4"): 1.0}  # fmt: skip
    # Taken from bench_serving's result line, not recomputed.
    for cell in results["cells"]:
        line = json.loads((run_dir / cell["raw"]).read_text().splitlines()[-1])
        assert cell["metrics"]["request_goodput"] == line["request_goodput"]
        assert line["goodput_slos_ms"] == {"tpot": 15.0, "ttft": 1000.0}
    assert results["summary"]["base"]["4"]["request_goodput"]["mean"] == 0.0
    assert results["summary"]["split"]["4"]["request_goodput"]["mean"] > 0
    assert results["within_slo"] == {"base": {"in8_out6": 1}, "split": {"in8_out6": 4}}
    assert results["gates"][0]["passed"] is True
    assert results["gates"][0]["ratio"]["mean"] > 1.2  # split's requests are shorter
    report = (run_dir / "report.md").read_text()
    assert "- SLOs (bench_serving --goodput): TTFT <= 1000 ms, TPOT <= 15 ms;" in report
    assert "goodput req/s | within SLO |" in report
    assert "- `base`: 1\n- `split`: 4" in report
    # The same gate where the baseline has no goodput left: no ratio, a failure, said so.
    data = json.loads((run_dir / "run.json").read_text())
    data["config"]["gate"][0]["concurrency"] = 4
    (run_dir / "run.json").write_text(json.dumps(data))
    assert ab_cli.main(["report", str(run_dir)]) == 1
    assert "request_goodput split/base at concurrency 4 >= 1x: no measurement" in (
        capsys.readouterr().err
    )


def test_slo_names_are_bench_servings():
    from sglang.benchmark.goodput import GOODPUT_SLO_METRICS

    from sglang_mixgraph.ab.config import SLO_KEYS

    assert tuple(SLO_KEYS.values()) == GOODPUT_SLO_METRICS


# Slow tier (about 12 s); request rates, shapes and counts are planned in test_ab_config.py.
@pytest.mark.slow
def test_request_rates_shapes_and_counts_in_multiples_of_concurrency(tmp_path, capsys):
    config = standin_config(
        tmp_path,
        arms=TWO_ARMS,
        sweep="""concurrencies = [2]
request_rates = [40]
dataset = "random-ids"
min_prompts = 1
rate_duration_s = 0.1
repeats = 1""",
        extra="""[[shape]]
name = "short"
input_len = 8
output_len = 2

[[shape]]
input_len = 16
output_len = 5

[[gate]]
metric = "median_tpot_ms"
candidate = "split"
baseline = "base"
shape = "in16_out5"
request_rate = 40
max_ratio = 0.75""",
    )
    run_dir = tmp_path / "run"
    recorder = _run_passes(config, run_dir, capsys)

    def flag(argv, name):
        return argv[argv.index(name) + 1] if name in argv else None

    seen = [
        (flag(a, "--random-input-len"), flag(a, "--random-output-len"),
         flag(a, "--max-concurrency"), flag(a, "--request-rate"),
         flag(a, "--num-prompts"), flag(a, "--warmup-requests"))
        for _, a in recorder.calls[:4]
    ]  # fmt: skip
    # Concurrency 2: 6 x 2 prompts after a 2 x 2 warm-up (the defaults); 40 req/s: what
    # arrives in 0.1 s after 2 x 40 warm-up requests.
    assert seen == [
        ("8", "2", "2", None, "12", "4"),
        ("8", "2", None, "40", "4", "80"),
        ("16", "5", "2", None, "12", "4"),
        ("16", "5", None, "40", "4", "80"),
    ]
    # run.json writes the default counts out: a later default cannot change what it measured.
    recorded = json.loads((run_dir / "run.json").read_text())["config"]["sweep"]
    assert (recorded["prompts_per_concurrency"], recorded["warmup_per_concurrency"]) == (6, 2)
    assert (recorded["min_prompts"], recorded["rate_duration_s"]) == (1, 0.1)
    results = json.loads((run_dir / "results.json").read_text())
    assert set(results["summary"]["base"]) == {"short/2", "short/rate=40", "in16_out5/2",
                                               "in16_out5/rate=40"}  # fmt: skip
    for cell in results["cells"]:
        line = json.loads((run_dir / cell["raw"]).read_text().splitlines()[-1])
        assert line["completed"] == (12 if cell["concurrency"] else 4)
        assert line["random_output_len"] == (2 if cell["shape"] == "short" else 5)
        assert ("_rate40_" in cell["raw"]) == (cell["concurrency"] is None)
        assert Path(cell["raw"]).name.startswith(cell["shape"] + "_")
    assert results["gates"][0]["passed"] is True
    report = (run_dir / "report.md").read_text()
    assert "### `short`: input 8 / output 2 tokens" in report
    assert "### `in16_out5`: input 16 / output 5 tokens" in report
    assert "| 40 req/s | `base` |" in report and "| c=2 | `split` |" in report
    assert "at request rate 40 of shape in16_out5 <= 0.75x" in report
    rows = list(csv.DictReader(io.StringIO((run_dir / "results.csv").read_text())))
    assert len(rows) == 2 * 4
    row = next(r for r in rows if r["arm"] == "split" and r["shape"] == "in16_out5"
               and r["request_rate"] == "40.0")  # fmt: skip
    ratio = results["ratios_vs_baseline"]["split"]["in16_out5/rate=40"]["median_tpot_ms"]
    assert float(row["median_tpot_ms_ratio"]) == pytest.approx(ratio["mean"])
    assert row["input_len"] == "16" and row["output_len"] == "5" and row["concurrency"] == ""


# ---------------------------------------------------------------- progress and INCOMPLETE


def test_progress_during_server_start_and_during_a_cell(tmp_path, capsys):
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=small_sweep("[1]"))
    config.write_text(
        config.read_text().replace('"--ttft-ms", "30"', '"--ttft-ms", "30", "--startup-s", "1.5"')
    )
    run_dir = tmp_path / "run"

    class SlowStart(Recorder):
        """Like a long cell: the tool's log has a line, and the invoker waits on watch()."""

        def __call__(self, module, argv, log_path, timeout_s, watch):
            with open(log_path, "a") as log:
                log.write("Starting warmup with 1 sequences...\n")
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                watch()
                time.sleep(0.05)
            return super().__call__(module, argv, log_path, timeout_s, watch)

    assert _run(config, run_dir, SlowStart(), "--progress-every", "0.4") == 0
    err = capsys.readouterr().err
    server_log = run_dir / "servers" / "base_1.log"
    starting = [line for line in err.splitlines() if "arm 'base': server starting, " in line]
    assert starting, err
    assert re.search(
        rf"\] arm 'base': server starting, 0m0\ds so far, log {re.escape(str(server_log))}: "
        r"stand-in: loading weights for 1\.5 s$",
        starting[0],
    ), starting
    running = [
        line for line in err.splitlines() if "arm=split concurrency=1 repeat=1: running" in line
    ]
    assert running, err
    cell_log = next((run_dir / "cells" / "split").glob("*.log"))
    assert running[0].endswith(f"so far, log {cell_log}: Starting warmup with 1 sequences..."), (
        running
    )
    # Nothing every 0.4 s where the default (30 s) applies.
    assert _run(config, tmp_path / "run2", Recorder()) == 0
    assert "so far" not in capsys.readouterr().err


def test_an_interrupted_run_is_incomplete_not_failed(tmp_path, capsys):
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=small_sweep("[1, 2]"))
    run_dir = tmp_path / "run"
    assert _run(config, run_dir, Recorder(interrupt_at=2)) == ab_cli.EXIT_INTERRUPTED
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "INCOMPLETE"
    report = (run_dir / "report.md").read_text()
    assert (
        "**Result: INCOMPLETE** (3 not measured yet, listed below; run the same command" in report
    )
    assert "FAIL" not in report
    assert (
        "## Not measured yet" in report
        and "- arm=split concurrency=2 repeat=1: missing: not run" in report
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "INCOMPLETE" and results["problems"] == []
    assert len(results["missing"]) == 3
    assert ab_cli.main(["report", str(run_dir)]) == 1  # not a pass either
    assert capsys.readouterr().out.splitlines()[-1] == "INCOMPLETE"
    # What is left, with the commands, and its time from what this directory measured.
    assert _run(config, run_dir, None, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "  arm=base concurrency=1 repeat=1 (done): " in out
    assert "  arm=split concurrency=1 repeat=1: " in out
    assert (
        "for 3 cells (1 as measured in this run directory; 2 modelled with TTFT 1000 ms assumed "
        "without [slo] ttft_ms and TPOT 50 ms assumed without [slo] tpot_ms or --assume-tpot-ms) "
        "and 2 server starts, 1 of them not measured yet and not counted"
    ) in out
    assert _run(config, run_dir, Recorder()) == 0  # resumed: the rest is measured
    assert json.loads((run_dir / "results.json").read_text())["status"] == "PASS"


def test_accept_length_tail_latencies_and_what_was_sent_reach_results_report_and_csv(
    tmp_path, capsys
):
    """A server with speculative decoding reports its accept length (the stand-in: 3.5 in
    `base`, 2.75 in `split`); bench_serving records it with its p90/p95 latencies, input and
    total tok/s, peak concurrency and token totals, and each reaches every output."""
    arms = TWO_ARMS.replace('"10"]', '"10", "--spec-accept-length", "3.5"]').replace(
        '"5"]', '"5", "--spec-accept-length", "2.75"]'
    )
    config = standin_config(
        tmp_path, arms=arms, sweep=small_sweep("[2]").replace("repeats = 1", "repeats = 2")
    )
    run_dir = tmp_path / "run"
    _run_passes(config, run_dir, capsys)
    assert "accept length 2.75" in capsys.readouterr().err  # the cell's summary line
    results = json.loads((run_dir / "results.json").read_text())
    summary = {arm: results["summary"][arm]["2"] for arm in ("base", "split")}
    assert summary["base"]["accept_length"]["mean"] == 3.5
    assert summary["split"]["accept_length"]["mean"] == 2.75
    assert results["ratios_vs_baseline"]["split"]["2"]["accept_length"]["mean"] == pytest.approx(
        2.75 / 3.5
    )
    for cell in results["cells"]:
        line = json.loads((run_dir / cell["raw"]).read_text().splitlines()[-1])
        for key in ("p90_tpot_ms", "p95_ttft_ms", "p95_e2e_latency_ms", "input_throughput",
                    "total_throughput", "max_concurrent_requests"):  # fmt: skip
            assert cell["metrics"][key] == line[key], key
        # 2 prompts of 8 random ids and 2 output tokens each: the lengths actually sent
        assert line["completed"] == 2 and line["total_input_tokens"] == 16
        assert cell["metrics"]["mean_input_len_sent"] == 8.0
        assert cell["metrics"]["mean_output_len_sent"] == 2.0
        assert 1 <= cell["metrics"]["max_concurrent_requests"] <= 2 * 2
    report = (run_dir / "report.md").read_text()
    assert "| req/s | accept length | TPOT p50 ms |" in report
    assert "| TPOT p90 ms | TPOT p95 ms | TTFT p90 ms | TTFT p95 ms |" in report
    assert (
        "| input len sent | output len sent | input tok/s | total tok/s | "
        "peak concurrent requests | repeats |"
    ) in report
    assert re.search(r"\| 2 \| `base` \| .* \| 3\.50 ± 0\.00 \| ", report)
    assert re.search(r"\| 2 \| `split` \| 8\.00 ± 0\.00 \| 2\.00 ± 0\.00 \| ", report)
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO((run_dir / "results.csv").read_text()))}
    assert float(rows["split"]["accept_length"]) == 2.75
    assert float(rows["split"]["accept_length_ratio"]) == pytest.approx(2.75 / 3.5)
    assert float(rows["base"]["mean_input_len_sent"]) == 8.0
    assert "p95_itl_ms_low" in rows["base"] and "max_concurrent_requests" in rows["base"]


def test_a_long_cell_says_how_many_requests_are_done(tmp_path):
    """bench_serving's own progress bar, read from the cell's log while it runs: counts that
    grow to the cell's prompts, none before the measured requests start."""
    sweep = small_sweep("[1]").replace("num_prompts = 2", "num_prompts = 6")
    config_path = standin_config(
        tmp_path, arms=TWO_ARMS, sweep=sweep.replace("output_len = 2", "output_len = 20")
    )
    config = parse_config(read_toml(config_path))
    visits = [v for v in runner.plan(config) if v.arm.name == "base"]
    lines: list[str] = []
    outcome = runner.run(
        config,
        tmp_path / "run",
        visits,
        invoker=watching_invoker,
        out=lines.append,
        progress_every_s=0.15,
    )
    assert outcome.errors == [] and not outcome.interrupted, lines
    running = [line for line in lines if "arm=base concurrency=1 repeat=1: running" in line]
    counts = [
        tuple(map(int, found.groups()))
        for line in running
        if (found := re.search(r"so far, (\d+)/(\d+) requests done, log ", line))
    ]
    assert counts, running
    assert {total for _, total in counts} == {6}
    done = [d for d, _ in counts]
    assert done == sorted(done) and max(done) <= 6 and len(set(done)) >= 2, counts
    # Before the bar (loading, warm-up): the time and the log, no count.
    assert "requests done" not in running[0], running


def test_shared_prefix_workload_sends_its_own_counts_and_lengths(tmp_path, capsys):
    """[sweep] shared_prefix: bench_serving's --gsp-* flags, its request count (groups x
    questions, not num_prompts), and the lengths it actually sent, which are not the
    nominal ones (range ratio 0.5 draws each length between half and all of its target)."""
    sweep = """concurrencies = [2]
warmup_requests = 1
repeats = 1

[sweep.shared_prefix]
num_groups = 2
prompts_per_group = 3
system_prompt_len = 24
question_len = 8
output_len = 4
range_ratio = 0.5"""
    config = standin_config(tmp_path, arms=TWO_ARMS, sweep=sweep)
    run_dir = tmp_path / "run"
    recorder = _run_passes(config, run_dir, capsys)
    _, argv = recorder.calls[0]
    assert argv[argv.index("--dataset-name") + 1] == "generated-shared-prefix"
    flags = dict(zip(argv[::1], argv[1::1], strict=False))
    assert (flags["--gsp-num-groups"], flags["--gsp-prompts-per-group"]) == ("2", "3")
    assert (flags["--gsp-system-prompt-len"], flags["--gsp-output-len"]) == ("24", "4")
    assert "--random-input-len" not in argv
    results = json.loads((run_dir / "results.json").read_text())
    assert results["dataset"] == "generated-shared-prefix"
    assert results["shared_prefix"]["num_groups"] == 2
    for cell in results["cells"]:
        line = json.loads((run_dir / cell["raw"]).read_text().splitlines()[-1])
        assert line["completed"] == 2 * 3
        sent_in = cell["metrics"]["mean_input_len_sent"]
        assert sent_in == line["total_input_tokens"] / 6
        assert sent_in < 24 + 8  # below the nominal first-turn length
        assert cell["metrics"]["mean_output_len_sent"] == line["total_output_tokens"] / 6 < 4
    report = (run_dir / "report.md").read_text()
    assert (
        "2 shared system prompts of 24 tokens, each with 3 questions of 8 tokens, one turn "
        "each, output 4 tokens (range ratio 0.5), 6 requests per cell"
    ) in report
    assert "| input len sent | output len sent |" in report
