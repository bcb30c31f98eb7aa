"""`sglang-mixgraph advise` as a user runs it, against a stand-in server (advise_standin.py):
the profile it asks for, the traces it reads and keeps, its text and JSON, the load, and one
line with a nonzero exit for everything that gives no answer (exit 2 for the command line)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from advise_standin import Standin, recorded_server_info

from sglang_mixgraph.advise import capture
from sglang_mixgraph.advise import server as server_mod
from sglang_mixgraph.cli import main
from sglang_mixgraph.resolution.presets import DSV4_MODEL_DIR

DSV4 = {
    "model_path": str(DSV4_MODEL_DIR),
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
}


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """The stand-in writes at once: settle and poll faster than a real server needs."""
    monkeypatch.setattr(capture, "SETTLE_S", 0.2)
    monkeypatch.setattr(capture, "POLL_S", 0.05)
    monkeypatch.setattr(capture, "STOP_GRACE_S", 1.0)


def serve(mode: str, scenario: str = "dsv4_eager_h200", **info) -> Standin:
    return Standin(scenario, mode, recorded_server_info() | info, DSV4)


def advise(standin: Standin, trace_dir, *args: str) -> int:
    return main(["advise", "--url", standin.url, "--trace-dir", str(trace_dir), *args])


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("sglang-mixgraph advise: ")
    return err


def test_it_profiles_reads_every_rank_and_says_what_to_switch_on_first(tmp_path, capsys):
    with serve("auto") as standin:
        assert advise(standin, tmp_path, "--steps", "12") == 0
    out = capsys.readouterr().out
    (start,) = [b for m, p, b in standin.requests if p == "/start_profile"]
    assert start["output_dir"] == str(tmp_path) and start["num_steps"] == 12
    assert start["activities"] == ["CPU", "GPU"] and start["detailed_annotations"] is True
    # stacks are off by default: with them SGLang took minutes to write a real server's trace
    assert start["with_stack"] is False and start["profile_id"].startswith("mixgraph-advise-")
    assert "/stop_profile" not in standin.paths()  # the profile stopped by itself
    # the raw traces stay where the user said, named as SGLang names them
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == [f"{start['profile_id']}-TP-{r}-DP-{r}-EP-{r}.trace.json.gz" for r in (0, 1)]
    lines = out.splitlines()
    assert lines[0] == f"sglang-mixgraph advise: {standin.url} (sglang 0.5.23)"
    assert lines[1] == "DeepseekV4ForCausalLM on NVIDIA H200 (sm90)"
    assert "profiled 16 steps on 2 of 2 ranks" in out
    first = lines.index("Switch on first:")
    assert lines[first + 1].startswith("  1. breakable prefill graph: -")
    assert "host-bound: 212 ms of launch over 140 ms of kernels" in lines[first + 2]
    assert "set: SGLANG_MIXGRAPH_PREFILL_BUCKETS=auto" in out
    assert "Does not pay here:" in out and "- mixed split" in out
    assert "Cannot act here:" in out and "- decode-tail graphs" in out
    table = lines[
        lines.index("Evidence (medians per step kind over every rank; times in ms):") + 1 :
    ]
    assert table[0].split() == [
        "kind", "graph", "steps", "host", "ms", "kernel", "ms", "launches", "decode", "rows",
        "longest", "ctx", "bucket", "padding", "attention", "dequant", "indexer", "gemm",
    ]  # fmt: skip
    assert table[1].split() == [
        "MIXED", "eager", "6", "212.0", "140.0", "6", "24", ">=4608", "-", "-",
        "30.0", "12.0", "8.0", "50.0",
    ]  # fmt: skip
    assert table[3].split()[:10] == [
        "DECODE", "replay", "8", "3.0", "20.0", "1", "24", ">=2060", ">=24", "0",
    ]  # fmt: skip


def test_json_has_a_schema_version_the_verdicts_and_the_evidence(tmp_path, capsys):
    with serve("auto", "dsv4_replay_h200", tp_size=1, attn_dp_size=1) as standin:
        info = standin.server_info
        info["cuda_graph_config"]["prefill"] |= {"backend": "breakable", "bs": [2560, 2816]}
        assert advise(standin, tmp_path, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == 1
    assert report["gpu"] == {"name": "NVIDIA H200", "arch": "sm90"}
    assert report["switch_on_first"] == ["mixed_split"]
    verdicts = {v["id"]: v for v in report["verdicts"]}
    # four replayed steps, three followed by another: too few for read-done's range
    assert verdicts["replay_read_done"]["outcome"] == "unknown"
    assert "only 3 replayed steps followed by another" in verdicts["replay_read_done"]["reason"]
    split = verdicts["mixed_split"]
    assert split["low_ms"] < split["delta_ms"] < split["high_ms"]  # a range, not a point
    assert verdicts["mixed_split"]["outcome"] == "pays" and verdicts["mixed_split"]["high_ms"] < 0
    assert verdicts["mixed_split"]["flags"] == ["SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN=1"]
    assert verdicts["prefill_graph"]["outcome"] == "already on"
    (row,) = report["steps"]
    assert row | {"mode": "MIXED", "graph": "replay", "bucket": 2816.0, "padding_rows": 0.0} == row
    assert row["bound"] == "GPU" and row["bucket_is_lower_bound"] is False
    assert report["profile"]["ranks_read"] == report["profile"]["ranks_expected"] == 1


def test_without_a_trace_dir_a_fresh_one_holds_the_traces(capsys):
    with serve("auto", "dsv4_replay_h200", tp_size=1) as standin:
        assert main(["advise", "--url", standin.url, "--json", "--stack"]) == 0
    (start,) = [b for m, p, b in standin.requests if p == "/start_profile"]
    report = json.loads(capsys.readouterr().out)
    assert start["with_stack"] is True
    assert report["profile"]["trace_dir"] == start["output_dir"]
    assert "mixgraph-advise-" in start["output_dir"]


def test_a_server_without_traffic_has_no_steps_to_profile(tmp_path, capsys):
    with serve("on_stop", "idle_h200") as standin:
        assert advise(standin, tmp_path, "--timeout", "0.5") == 1
    err = one_line(capsys.readouterr().err)
    assert "no steps to profile" in err and "--load" in err
    assert standin.paths("POST") == ["/start_profile", "/stop_profile"]


def test_the_stop_has_its_own_longer_bound(tmp_path, capsys, monkeypatch):
    # SGLang answers /stop_profile once the ranks wrote: 10 s on a real H100 without stacks,
    # more than the bound of every other call.
    monkeypatch.setattr(server_mod, "TIMEOUT_S", 0.3)
    monkeypatch.setattr(capture, "STOP_TIMEOUT_S", 5.0)
    with serve("on_stop", "dsv4_replay_h200", tp_size=1) as standin:
        standin.stop_delay_s = 1.0
        assert advise(standin, tmp_path, "--timeout", "0.3", "--json") == 0
    assert json.loads(capsys.readouterr().out)["profile"]["stopped_early"] is True


@pytest.mark.parametrize(
    "stack, hint",
    [([], "(profile fewer --steps)"), (["--stack"], "leave out --stack, or profile fewer")],
)
def test_a_stop_past_its_bound_is_one_line(tmp_path, capsys, monkeypatch, stack, hint):
    monkeypatch.setattr(capture, "STOP_TIMEOUT_S", 0.4)
    monkeypatch.setattr(capture, "STOP_TIMEOUT_STACK_S", 0.6)
    with serve("on_stop", "dsv4_replay_h200", tp_size=1) as standin:
        standin.stop_delay_s = 1.5
        assert advise(standin, tmp_path, "--timeout", "0.2", *stack) == 1
    err = one_line(capsys.readouterr().err)
    bound = "0.6" if stack else "0.4"
    assert f"did not answer /stop_profile within {bound} s: SGLang's profiler had not" in err
    assert hint in err


def test_traces_written_on_another_host_are_said_to_need_a_shared_directory(tmp_path, capsys):
    with serve("elsewhere") as standin:
        assert advise(standin, tmp_path, "--timeout", "0.3") == 1
    err = one_line(capsys.readouterr().err)
    assert f"no trace appeared in {tmp_path}" in err
    assert "the server writes its traces on its own host" in err


def test_an_unreadable_trace_is_one_line(tmp_path, capsys):
    with serve("broken") as standin:
        assert advise(standin, tmp_path) == 1
    err = one_line(capsys.readouterr().err)
    assert "cannot read the trace" in err and ".trace.json.gz" in err


@pytest.mark.parametrize(
    "mode, words",
    [
        ("missing", "no profiling endpoint at http://127.0.0.1:"),
        ("refuse", "refused the profile request: profile request rejected: bad output_dir"),
        ("busy", "could not start profiling (Internal Server Error)"),
    ],
)
def test_a_server_that_cannot_profile_is_one_line(tmp_path, capsys, mode, words):
    with serve(mode) as standin:
        assert advise(standin, tmp_path) == 1
    assert words in one_line(capsys.readouterr().err)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_url_that_does_not_answer_is_one_line_from_the_installed_command(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "sglang_mixgraph.cli", "advise", "--url", url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert f"cannot reach {url}" in one_line(result.stderr)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--url", "127.0.0.1:30000"], "give the scheme, e.g. http://127.0.0.1:30000"),
        (["--url", "http://h:1", "--steps", "0"], "--steps must be between 1 and 1000, not 0"),
        (["--url", "http://h:1", "--timeout", "nan"], "--timeout must be more than 0"),
        (["--url", "http://h:1", "--load-args", "--num-prompts 8"], "--load-args needs --load"),
        (["--url", "http://h:1", "--load", "--load-args", "'open"], "--load-args: No closing"),
        (["--url", "http://h:1", "--model-path", "/no/such/model"], "no config.json there"),
        (["--url", "http://h:1", "--steps", "many"], "invalid int value: 'many'"),
        (["--steps", "3"], "give --url (a server to profile) or --trace-dir (traces"),
        (["--trace-dir", "/no/such/dir"], "--trace-dir /no/such/dir is not a directory"),
        (["--trace-dir", "/tmp", "--load"], "--load needs --url"),
        (["--url", "http://h:1", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(capsys, args, words):
    try:
        code = main(["advise", *args])
    except SystemExit as e:  # argparse's own errors, through the one-line error hook
        code = e.code
    assert code == 2
    assert words in one_line(capsys.readouterr().err)


def test_a_trace_dir_that_is_a_file_is_a_bad_argument(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("")
    assert main(["advise", "--url", "http://h:1", "--trace-dir", str(target)]) == 2
    assert "is not a directory" in one_line(capsys.readouterr().err)


def _fake_load(monkeypatch, code: str) -> None:
    """The burst's client: a small script in place of sglang.benchmark.serving."""
    monkeypatch.setattr(
        capture.Load, "argv", lambda self, url: [sys.executable, "-c", code.replace("URL", url)]
    )


POST = "import urllib.request as u; u.urlopen(u.Request('URL/generate', data=b'BODY'))"
WARM_UP = POST.replace("BODY", '{"warmup": true}')
MAIN_RUN = f"print({capture.MAIN_RUN_MARKER!r}, flush=True); import time; time.sleep(0.5)"


def test_the_profile_starts_after_the_loads_warm_up(tmp_path, capsys, monkeypatch):
    # As SGLang's client: a warm-up request, its line, a pause, then the burst.
    burst = POST.replace("BODY", "{}")
    _fake_load(monkeypatch, f"{WARM_UP}; {MAIN_RUN}; {burst}; print('sent')")
    with serve("on_traffic", "dsv4_replay_h200", tp_size=1) as standin:
        assert advise(standin, tmp_path, "--load", "--json") == 0
    calls = [(p, b) for m, p, b in standin.requests if m == "POST"]
    assert calls[:3] == [("/generate", {"warmup": True}), calls[1], ("/generate", {})]
    assert calls[1][0] == "/start_profile"  # after the warm-up, before the burst
    report = json.loads(capsys.readouterr().out)
    assert report["profile"]["load_log"] == str(tmp_path / capture.LOAD_LOG)
    assert (tmp_path / capture.LOAD_LOG).read_text().splitlines()[-1] == "sent"


def test_the_warm_up_line_is_the_one_sglangs_client_prints():
    import importlib.util

    source = Path(importlib.util.find_spec(capture.BENCH_MODULE).origin).read_text()
    assert "Starting warmup with" in source and capture.MAIN_RUN_MARKER in source


def test_a_load_client_that_fails_first_is_one_line(tmp_path, capsys, monkeypatch):
    _fake_load(monkeypatch, "raise SystemExit(3)")
    with serve("on_traffic") as standin:
        assert advise(standin, tmp_path, "--load", "--timeout", "30") == 1
    err = one_line(capsys.readouterr().err)
    assert "the load client (sglang.benchmark.serving) exited with 3 before its warm-up" in err
    assert standin.paths("POST") == []  # no profile was started, none is left running


def test_a_load_client_failing_after_its_warm_up_stops_the_profile(tmp_path, capsys, monkeypatch):
    _fake_load(monkeypatch, f"{MAIN_RUN}; raise SystemExit(4)")
    with serve("on_traffic") as standin:
        assert advise(standin, tmp_path, "--load", "--timeout", "30") == 1
    err = one_line(capsys.readouterr().err)
    assert "exited with 4 before any step was profiled" in err
    assert standin.paths("POST") == ["/start_profile", "/stop_profile"]  # not left running


def test_a_load_client_stuck_in_its_warm_up_is_one_line(tmp_path, capsys, monkeypatch):
    _fake_load(monkeypatch, "import time; time.sleep(30)")
    with serve("on_traffic") as standin:
        assert advise(standin, tmp_path, "--load", "--timeout", "0.5") == 1
    err = one_line(capsys.readouterr().err)
    assert "did not finish its warm-up within 0.5 s" in err and "--timeout" in err
    assert standin.paths("POST") == []


def test_the_load_is_sglangs_own_client_on_random_ids():
    argv = capture.Load(extra=("--num-prompts", "8")).argv("http://h:1")
    assert argv[1:3] == ["-m", "sglang.benchmark.serving"]
    assert argv[argv.index("--base-url") + 1] == "http://h:1"
    assert argv[argv.index("--dataset-name") + 1] == "random-ids"  # downloads nothing
    assert argv[-2:] == ["--num-prompts", "8"]  # the user's come last: they win


def test_the_model_config_comes_from_the_servers_path_or_model_path(tmp_path, capsys):
    hub = DSV4 | {"model_path": "deepseek-ai/DeepSeek-V4-Pro"}  # not a directory here
    replay = {"tp_size": 1, "attn_dp_size": 1}
    with Standin("dsv4_replay_h200", "auto", recorded_server_info() | replay, hub) as standin:
        assert advise(standin, tmp_path / "a", "--json") == 0
        split = json.loads(capsys.readouterr().out)["verdicts"][0]
        assert split["id"] == "mixed_split" and split["outcome"] == "unknown"
        assert "deepseek-ai/DeepSeek-V4-Pro" in split["reason"]
        assert "--model-path" in split["reason"]
        args = ("--json", "--model-path", str(DSV4_MODEL_DIR))
        assert advise(standin, tmp_path / "b", *args) == 0
        split = json.loads(capsys.readouterr().out)["verdicts"][0]
        assert split["outcome"] == "pays" and str(DSV4_MODEL_DIR) in split["basis"]


def test_ranks_that_never_write_here_leave_the_ones_that_did(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(capture, "RANK_GRACE_S", 0.3)
    with serve("auto", "dsv4_replay_h200") as standin:  # two ranks expected, one writes here
        assert advise(standin, tmp_path, "--json") == 0
    profile = json.loads(capsys.readouterr().out)["profile"]
    assert (profile["ranks_read"], profile["ranks_expected"]) == (1, 2)
    assert profile["stopped_early"] is False


def _advise_on_a_logged_burst(tmp_path, monkeypatch, then: str = "", *more: str) -> int:
    """`advise --load --steps 5 --server-log LOG` against the stand-in: the burst's client
    writes 6 MIXED batches 280 ms apart into the log (after one of the traffic before it),
    sleeps 2 s while the profile runs (the stand-in logs 8 batches 400 ms apart in it), then
    runs `then`."""
    from advise_standin import batch_line

    log = tmp_path / "server.log"
    log.write_text(batch_line(999.0) + "\n")  # before the burst: not the burst's
    lines = "\\n".join([batch_line(280.0)] * 6)
    write = f"open({str(log)!r}, 'a').write('{lines}\\n')"
    _fake_load(monkeypatch, f"{MAIN_RUN}; {write}; import time; time.sleep(2); {then or 'pass'}")
    with serve("auto", tp_size=1, dp_size=1, attn_dp_size=1) as standin:
        standin.log = log
        return advise(standin, tmp_path, "--load", "--steps", "5", "--server-log", str(log), *more)


def test_with_the_servers_log_the_burst_runs_unprofiled_first_and_prices_the_host(
    tmp_path, capsys, monkeypatch
):
    """The profile waits for --steps MIXED batches of the burst in the server's log; their gaps
    (280 ms) against the profiled ones (400 ms) scale the eager host."""
    from advise_standin import batch_line

    assert _advise_on_a_logged_burst(tmp_path, monkeypatch, "", "--json") == 0
    log = tmp_path / "server.log"
    report = json.loads(capsys.readouterr().out)
    u = report["profile"]["unprofiled"]
    # the burst's first line has no predecessor in the window: 5 gaps, then 7 profiled
    assert (u["unprofiled_batches"], u["profiled_batches"]) == (5, 7)
    assert u["factor"] == pytest.approx(280 / 400, abs=1e-3)
    text = log.read_text()
    assert text.index(batch_line(280.0)) < text.index("Profiling starts")  # unprofiled first
    graph = next(v for v in report["verdicts"] if v["id"] == "prefill_graph")
    assert graph["detail"]["host_factor"] == pytest.approx(0.7, abs=1e-3)


def test_without_a_usable_log_the_host_is_priced_as_profiled_and_the_report_says_why(
    tmp_path, capsys
):
    log = tmp_path / "server.log"
    log.write_text("nothing of SGLang's here\n")
    single = {"tp_size": 1, "dp_size": 1, "attn_dp_size": 1}
    with serve("auto", **single) as standin:
        assert advise(standin, tmp_path, "--server-log", str(log), "--json") == 0
    problem = json.loads(capsys.readouterr().out)["profile"]["unprofiled"]["problem"]
    assert problem.startswith("the log does not show profile mixgraph-advise-")
    with serve("auto", tp_size=1) as standin:  # the recorded server: attention DP
        assert advise(standin, tmp_path, "--server-log", str(log)) == 0
    assert "eager host as profiled: under data parallelism the log" in capsys.readouterr().out
    with serve("auto", **single) as standin:
        assert advise(standin, tmp_path) == 0
    assert "eager host as profiled (the profiler slows it; --server-log" in capsys.readouterr().out


def test_a_server_log_that_is_not_a_file_is_a_bad_argument(tmp_path, capsys):
    with serve("auto") as standin:
        assert advise(standin, tmp_path, "--server-log", str(tmp_path)) == 2
    assert "--server-log " in one_line(capsys.readouterr().err)
    assert standin.requests == []


def test_without_load_the_log_before_the_profile_prices_the_host(tmp_path, capsys):
    """A server with traffic of its own: the batches it logged before advise came (180 ms
    apart) against the profiled ones (400 ms)."""
    from advise_standin import batch_line

    log = tmp_path / "server.log"
    log.write_text("\n".join([batch_line(180.0)] * 6) + "\n")
    with serve("auto", tp_size=1, dp_size=1, attn_dp_size=1) as standin:
        standin.log = log
        assert advise(standin, tmp_path, "--json", "--server-log", str(log)) == 0
    u = json.loads(capsys.readouterr().out)["profile"]["unprofiled"]
    assert u["unprofiled_batches"] == 5 and u["factor"] == pytest.approx(180 / 400, abs=1e-3)


def test_the_loads_whole_burst_gives_the_prefill_share_of_the_served_time(
    tmp_path, capsys, monkeypatch
):
    """With --server-log the burst runs to its end: its prefill batches (the profiled ones
    priced by the host factor) against the rest of the client's benchmark duration."""
    done = "print('Benchmark duration (s):'.ljust(40), '5.60', flush=True)"
    assert _advise_on_a_logged_burst(tmp_path, monkeypatch, done, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    served = report["profile"]["served"]
    # 5 unprofiled gaps (the burst's first is the idle before it), 8 profiled at 400 ms x 0.7
    prefill = 5 * 0.28 + 8 * 0.4 * 0.7
    tail = 5.60 - (5 * 0.28 + 8 * 0.4)
    assert served["prefill_batches"] == 13
    assert served["prefill_s"] == pytest.approx(prefill, abs=2e-3)
    assert served["decode_tail_s"] == pytest.approx(tail, abs=2e-3)
    assert served["prefill_share"] == pytest.approx(prefill / (prefill + tail), abs=1e-3)
    graph = next(v for v in report["verdicts"] if v["id"] == "prefill_graph")
    change = served["prefill_share"] * graph["delta_ms"] / graph["wall_ms"]
    assert graph["detail"]["time_per_token_change"] == pytest.approx(change)
    assert f"about {change:+.0%} of the time per output token" in graph["reason"]


def test_the_text_names_what_the_rest_of_the_burst_holds(tmp_path, capsys, monkeypatch):
    """The time outside the prefill phase is not all decode: the requests' wait before the
    first batch is in the client's duration too."""
    done = "print('Benchmark duration (s):'.ljust(40), '5.60', flush=True)"
    assert _advise_on_a_logged_burst(tmp_path, monkeypatch, done) == 0
    text = " ".join(capsys.readouterr().out.split())
    rest = 5.60 - (5 * 0.28 + 8 * 0.4)
    assert (
        f"the rest {rest:.1f} s (decode after the last prefill batch, and any wait before the "
        "first): prefill share" in text
    )


def test_a_load_that_prints_no_duration_gives_no_share_and_says_why(tmp_path, capsys, monkeypatch):
    assert _advise_on_a_logged_burst(tmp_path, monkeypatch) == 0
    out = capsys.readouterr().out
    assert "no prefill share of the load's burst: the load client printed no benchmark" in out
    assert "time per output token" not in out


def test_the_duration_line_is_the_one_sglangs_client_prints(tmp_path):
    import importlib.util
    import subprocess

    source = Path(importlib.util.find_spec(capture.BENCH_MODULE).origin).read_text()
    assert '"Benchmark duration (s):", benchmark_duration' in source
    log = tmp_path / "load.log"
    log.write_text("{:<40} {:<10.2f}\n".format("Benchmark duration (s):", 42.317))
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    assert capture.wait_for_load_end(done, log, 5) == pytest.approx(42.32)
    log.write_text("Starting main benchmark run\n")
    assert capture.wait_for_load_end(done, log, 5) is None
