"""`sglang-mixgraph advise` against what is not a well-behaved SGLang server, and stopped as a
user stops it: one line on stderr, a nonzero exit, no traceback, nothing left running or
behind. Tiny socket servers in a thread of the test play a port that is not HTTP (an SSH
banner, a Redis error), a server that sends headers and then nothing, or trickles them; the
advise stand-in (advise_standin.py) plays fields of the wrong type, a server answering `{}`,
traces with NaN durations and a load client that runs until it is stopped.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import advise_standin
import pytest
from advise_standin import Standin, recorded_server_info
from test_advise_command import DSV4, one_line, serve

from sglang_mixgraph.advise import capture, server
from sglang_mixgraph.cli import main


@pytest.fixture(autouse=True)
def quick(monkeypatch, tmp_path):
    """Short waits, and temporary directories under this test's own (so none can hide)."""
    monkeypatch.setattr(capture, "SETTLE_S", 0.2)
    monkeypatch.setattr(capture, "POLL_S", 0.05)
    monkeypatch.setattr(capture, "STOP_GRACE_S", 0.5)
    monkeypatch.setattr(server, "TIMEOUT_S", 0.5)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def _leftovers(temp: Path) -> list[str]:
    return sorted(p.name for p in temp.iterdir())


class RawServer:
    """A TCP listener whose every connection gets `talk(conn)`; closed on exit."""

    def __init__(self, talk):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.talk, self.conns = talk, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn):
        try:
            self.talk(conn)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()
        for conn in self.conns:
            conn.close()


def _ssh(conn):
    conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n")
    conn.recv(4096)
    time.sleep(5)


def _redis(conn):
    conn.recv(4096)
    conn.sendall(b"-ERR unknown command 'GET', with args beginning with: '/server_info'\r\n")


def _headers_then_nothing(conn):
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99\r\n\r\n")
    time.sleep(5)


def _trickle(conn):
    """A header line every 0.1 s, forever: each read succeeds, the whole call never ends."""
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for i in range(50):
        conn.sendall(f"X-Slow-{i}: 1\r\n".encode())
        time.sleep(0.1)


@pytest.mark.parametrize(
    "talk, words",
    [
        (_redis, "does not speak HTTP (it answered \"-ERR unknown command 'GET'"),
        (_headers_then_nothing, "did not answer /server_info within 0.5 s"),
        (_trickle, "did not answer /server_info within 0.5 s"),
    ],
    ids=["redis", "headers then nothing", "trickled headers"],
)
def test_a_port_that_is_not_an_http_server_is_one_line_in_bounded_time(talk, words, capsys, quick):
    with RawServer(talk) as raw:
        started = time.monotonic()
        assert main(["advise", "--url", raw.url]) == 1
    assert time.monotonic() - started < 3  # was: past 90 s
    assert words in one_line(capsys.readouterr().err)
    assert _leftovers(quick) == []


def test_an_ssh_port_is_one_line_from_the_installed_command():
    with RawServer(_ssh) as raw:
        result = subprocess.run(
            [sys.executable, "-m", "sglang_mixgraph.cli", "advise", "--url", raw.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1 and result.stdout == ""
    line = one_line(result.stderr)
    assert f"{raw.url} does not speak HTTP (it answered 'SSH-2.0-OpenSSH_9.6p1" in line


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("tp_size", "two", "/server_info field tp_size is 'two', not an integer"),
        ("tp_size", [2], "/server_info field tp_size is [2], not an integer"),
        ("enable_mixed_chunk", "yes", "field enable_mixed_chunk is 'yes', not true or false"),
        ("cuda_graph_config", [], "/server_info field cuda_graph_config is [], not an object"),
    ],
)
def test_fields_of_the_wrong_type_are_one_line(field, value, words, capsys, quick):
    with serve("auto", **{field: value}) as standin:
        assert main(["advise", "--url", standin.url]) == 1
    assert words in one_line(capsys.readouterr().err)
    assert standin.paths("POST") == [] and _leftovers(quick) == []


def test_a_server_answering_empty_json_everywhere_is_not_blamed_on_the_trace_dir(capsys, quick):
    with Standin("dsv4_eager_h200", "elsewhere", {}, {}) as standin:
        assert main(["advise", "--url", standin.url, "--timeout", "0.3"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "is not an SGLang 0.5.23 server: its /server_info has no version, model_path, " in line
    assert "--trace-dir" not in line and _leftovers(quick) == []


@pytest.mark.parametrize(
    "mode, words",
    [
        ("busy", "could not start profiling"),
        ("elsewhere", "no trace appeared in"),
        ("broken", "cannot read the trace"),
        ("on_stop", None),  # an idle server: no steps
    ],
)
def test_every_failure_removes_the_temporary_trace_directory(mode, words, capsys, quick):
    scenario = "idle_h200" if mode == "on_stop" else "dsv4_eager_h200"
    with Standin(scenario, mode, recorded_server_info(), DSV4) as standin:
        assert main(["advise", "--url", standin.url, "--timeout", "0.3"]) == 1
    line = one_line(capsys.readouterr().err)
    assert words is None or words in line
    assert _leftovers(quick) == []  # was: an empty mixgraph-advise-* each time


def test_nan_durations_in_a_trace_are_one_line_not_invalid_json(
    tmp_path, monkeypatch, capsys, quick
):
    traces = tmp_path / "traces" / "nan"
    traces.mkdir(parents=True)
    source = advise_standin.TRACES / "dsv4_replay_h200" / "TP-0.trace.json.gz"
    doc = json.loads(gzip.decompress(source.read_bytes()))
    for ev in doc["traceEvents"]:
        if "dur" in ev:
            ev["dur"] = float("nan")
    (traces / "TP-0.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    monkeypatch.setattr(advise_standin, "TRACES", traces.parent)
    with serve("auto", "nan", tp_size=1) as standin:
        assert main(["advise", "--url", standin.url, "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "NaN" not in out
    assert "cannot read the trace" in one_line(err) and "has dur nan" in err
    assert _leftovers(quick) == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


LOAD = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "60"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_load_stops_the_load_client_and_its_children(
    sig, tmp_path, monkeypatch, capsys, quick
):
    """Ctrl-C (or SIGTERM, SIGHUP) while the burst runs: the client's whole process group is
    stopped, one line, exit 130, and the temporary trace directory is gone."""
    pids = tmp_path / "load.pids"
    monkeypatch.setattr(
        capture.Load, "argv", lambda self, url: [sys.executable, "-c", LOAD, str(pids)]
    )

    def deliver():
        deadline = time.monotonic() + 20
        while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), sig)

    # Ctrl-C as a terminal's Python process meets it: the test worker's own SIGINT disposition
    # (a pytest-xdist worker's can differ) is not the command's.
    worker_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with serve("on_traffic") as standin:
            threading.Thread(target=deliver, daemon=True).start()
            code = main(["advise", "--url", standin.url, "--load", "--timeout", "30"])
    finally:
        signal.signal(signal.SIGINT, worker_sigint)
    assert {s: signal.getsignal(s) for s in before} == before  # handlers given back
    assert code == 130
    line = one_line(capsys.readouterr().err)
    assert "interrupted; nothing it started is left running" in line
    client, grandchild = map(int, pids.read_text().split())
    deadline = time.monotonic() + 5
    while (_alive(client) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(client) and not _alive(grandchild)
    assert _leftovers(quick) == []


# A fresh process that imports SGLang for the verdicts: slow; plan's test of the same handler
# (cli._until_the_reader_leaves) is in the fast tier.
@pytest.mark.slow
def test_a_closed_output_pipe_is_quiet_status_141(tmp_path):
    """`advise ... | head -0`: the reader is gone before the report is written."""
    with serve("auto") as standin:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_mixgraph.cli", "advise", "--url", standin.url,
             "--trace-dir", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        proc.stdout.close()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports it for `yes | head`
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
    assert b"Exception ignored" not in err
