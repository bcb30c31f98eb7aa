"""Profiling a running server through SGLang's own endpoints, and collecting every rank's trace.

`POST /start_profile` (sglang.srt.entrypoints.http_server) takes a `ProfileReq`
(sglang.srt.managers.io_struct): `output_dir`, `num_steps` (the profile then stops by itself
after that many forward steps, `SchedulerProfilerManager._profile_batch_predicate`),
`activities` CPU and GPU, `with_stack`, `record_shapes`, `profile_id` and
`detailed_annotations` (request counts in every step's span name). Each scheduler process
writes `<profile_id>-TP-<rank>[-DP-..][-PP-..][-EP-..].trace.json.gz` into `output_dir` on its
own host (`SchedulerProfilerManager._stop_profile`). Without traffic no step runs and nothing is
written until `POST /stop_profile`. `--load` runs SGLang's client (`sglang.benchmark.serving`)
for a short burst meanwhile; a trace counts once its size has stopped changing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_mixgraph.ab.tools import BENCH_MODULE
from sglang_mixgraph.advise.server import AdviseError, Server

POLL_S = 0.25
SETTLE_S = 1.0  # a trace's size unchanged this long: its rank finished writing it
RANK_GRACE_S = 15.0  # after the first trace, how long the other ranks' may take
STOP_GRACE_S = 60.0  # after /stop_profile, how long the ranks may take to write
LOAD_STOP_S = 10.0
LOAD_LOG = "advise-load.log"


@dataclass(frozen=True)
class Load:
    """The burst `--load` sends: random token ids (no dataset download), SGLang's client."""

    prompts: int = 64
    input_len: int = 2048
    output_len: int = 64
    concurrency: int = 64
    extra: tuple[str, ...] = ()  # more client arguments; a repeated option wins (argparse)

    def argv(self, url: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            BENCH_MODULE,
            "--backend",
            "sglang",
            "--base-url",
            url,
            "--dataset-name",
            "random-ids",
            "--num-prompts",
            str(self.prompts),
            "--random-input-len",
            str(self.input_len),
            "--random-output-len",
            str(self.output_len),
            "--max-concurrency",
            str(self.concurrency),
            "--disable-tqdm",
            *self.extra,
        ]


def new_profile_id() -> str:
    return f"mixgraph-advise-{int(time.time())}-{os.getpid()}"


def profile_request(trace_dir: Path, steps: int, with_stack: bool, profile_id: str) -> dict:
    return {
        "output_dir": str(trace_dir),
        "num_steps": steps,
        "activities": ["CPU", "GPU"],
        "with_stack": with_stack,
        "record_shapes": False,  # shapes are not read, and they add to the profiler's cost
        "profile_id": profile_id,
        "detailed_annotations": True,
    }


def start_profile(server: Server, body: dict) -> None:
    reply = server.call("POST", "/start_profile", body)
    where = f"{server.url} (POST /start_profile: HTTP {reply.status})"
    if reply.status == 200:
        return
    if reply.status in (404, 405):
        raise AdviseError(f"no profiling endpoint at {where}: advise needs SGLang's /start_profile")
    if reply.status in (401, 403):
        raise AdviseError(f"{where} refused the request: give its admin or API key with --api-key")
    if 400 <= reply.status < 500:
        raise AdviseError(f"{where} refused the profile request: {reply.first_line()}")
    raise AdviseError(
        f"{where} could not start profiling ({reply.first_line() or 'no message'}); the "
        "server's log says why, often a profile already running"
    )


def trace_files(trace_dir: Path, profile_id: str) -> list[Path]:
    return sorted(trace_dir.glob(f"{profile_id}-*.trace.json*"))


@dataclass
class Capture:
    traces: list[Path]
    stopped: bool  # advise called /stop_profile (fewer steps ran than asked for)


def _not_shared(trace_dir: Path, waited_s: float) -> AdviseError:
    return AdviseError(
        f"no trace appeared in {trace_dir} within {waited_s:.0f} s: the server writes its traces "
        "on its own host, so --trace-dir must name a directory it shares with this machine (the "
        "same host, or a shared filesystem)"
    )


def collect(
    server: Server,
    trace_dir: Path,
    profile_id: str,
    expected: int,
    timeout_s: float,
    load: subprocess.Popen | None = None,
    load_log: Path | None = None,
    *,
    keep_log: bool = True,
) -> Capture:
    """Wait for the ranks' traces of `profile_id`: all `expected` of them, or those written
    within RANK_GRACE_S of the first; after `timeout_s` stop the profile and wait STOP_GRACE_S
    more. One line (AdviseError) when none comes or the load client failed first."""
    began = time.monotonic()
    deadline, stopped = began + timeout_s, False
    sizes: dict[Path, tuple[int, float]] = {}
    first_ready = None
    while True:
        now = time.monotonic()
        ready = []
        for path in trace_files(trace_dir, profile_id):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            seen = sizes.get(path)
            if seen is None or seen[0] != size:
                sizes[path] = (size, now)
            elif size and now - seen[1] >= SETTLE_S:
                ready.append(path)
        if len(ready) >= expected:
            return Capture(ready, stopped)
        if ready:
            first_ready = first_ready or now
            if now - first_ready >= RANK_GRACE_S:
                return Capture(ready, stopped)
        if load is not None and not sizes and load.poll() not in (None, 0):
            server.call("POST", "/stop_profile")
            # A temporary trace directory goes with the failure: its last line is all that stays.
            where = f"its output: {load_log}" if keep_log else f"it said: {_last_line(load_log)}"
            raise AdviseError(
                f"the load client ({BENCH_MODULE}) exited with {load.returncode} before any "
                f"step was profiled; {where}"
            )
        if now >= deadline:
            if not stopped:
                # Fewer steps than asked for ran (or none): end the profile so the ranks write.
                server.call("POST", "/stop_profile")
                stopped, deadline = True, now + STOP_GRACE_S
            elif ready or sizes:
                return Capture(ready or sorted(sizes), stopped)
            else:
                raise _not_shared(trace_dir, now - began)
        time.sleep(POLL_S)


def _last_line(log: Path | None) -> str:
    try:
        lines = log.read_bytes()[-4096:].decode(errors="replace").strip().splitlines()
    except (OSError, AttributeError):
        return "no output"
    return lines[-1][:200] if lines else "no output"


def start_load(url: str, load: Load, trace_dir: Path) -> tuple[subprocess.Popen, Path]:
    """The client in its own process group: a terminal's Ctrl-C reaches advise alone, which
    then stops the whole group (the client and anything it started)."""
    log = trace_dir / LOAD_LOG
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            load.argv(url),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def stop_load(proc: subprocess.Popen) -> None:
    """The burst's job ends with the profile: stop the client's process group if it runs.
    Signals that arrive meanwhile wait: the stop is finished before they are raised."""
    with _signals_held():
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=LOAD_STOP_S)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc, signal.SIGKILL)  # what outlived the TERM: the client's own children
        proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # start_new_session: the client's pid is the group id


@contextlib.contextmanager
def _signals_held():
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
