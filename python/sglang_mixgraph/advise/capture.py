"""Profiling a running server through SGLang's own endpoints, and collecting every rank's trace.

`POST /start_profile` (sglang.srt.entrypoints.http_server) takes a `ProfileReq`
(sglang.srt.managers.io_struct): `output_dir`, `num_steps` (the profile then stops by itself
after that many forward steps, `SchedulerProfilerManager._profile_batch_predicate`),
`activities` CPU and GPU, `with_stack`, `record_shapes`, `profile_id` and
`detailed_annotations` (request counts in every step's span name). Each scheduler process
writes `<profile_id>-TP-<rank>[-DP-..][-PP-..][-EP-..].trace.json.gz` into `output_dir` on its
own host (`SchedulerProfilerManager._stop_profile`). Without traffic no step runs and nothing is
written until `POST /stop_profile`, which SGLang answers only once the ranks have written
(`_stop_profile` exports the trace inside the scheduler): it has a bound of its own, longer with
Python stacks. `--load` runs SGLang's client (`sglang.benchmark.serving`) and the profile starts
once the client says its warm-up is over, so the profiled steps are the burst's; a trace counts
once its size has stopped changing.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_mixgraph.advise.server import AdviseError, Server
from sglang_mixgraph.resolution.serving_client import BENCH_MODULE

POLL_S = 0.25
SETTLE_S = 1.0  # a trace's size unchanged this long: its rank finished writing it
RANK_GRACE_S = 15.0  # after the first trace, how long the other ranks' may take
STOP_GRACE_S = 60.0  # after /stop_profile answered, how long the traces may take to show here
# How long SGLang may take to answer /stop_profile (it writes the traces first). Measured on one
# H100 (16 steps of a 4-layer DeepSeek-V4, no stacks): 10 s for a 7 MB trace; with stacks it
# had not finished after 87 s. A real model's trace is larger, hence the margins.
STOP_TIMEOUT_S = 120.0
STOP_TIMEOUT_STACK_S = 600.0
LOAD_STOP_S = 10.0
LOAD_LOG = "advise-load.log"
# What `sglang.benchmark.serving` (`benchmark`) prints once its warm-up requests are done; the
# main run starts a second later.
MAIN_RUN_MARKER = "Starting main benchmark run"


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


def stop_profile(server: Server, with_stack: bool) -> None:
    """End a profile; the answer comes once the ranks wrote (an error status when it had
    stopped by itself already: the traces are written then too)."""
    bound = STOP_TIMEOUT_STACK_S if with_stack else STOP_TIMEOUT_S
    try:
        server.call("POST", "/stop_profile", timeout_s=bound)
    except AdviseError as e:
        hint = "profile fewer --steps"
        if with_stack:
            hint = "Python stacks make it slow: leave out --stack, or " + hint
        raise AdviseError(f"{e}: SGLang's profiler had not written its traces ({hint})") from None


def wait_for_main_run(load: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Until the load client's warm-up is over (its log says so), so that the profile holds
    the burst's own steps; one line when the client exits first or never gets there."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            if MAIN_RUN_MARKER.encode() in log.read_bytes():
                return
        if load.poll() is not None:
            raise AdviseError(
                f"the load client ({BENCH_MODULE}) exited with {load.returncode} before its "
                f"warm-up was over; it said: {_last_line(log)}"
            )
        if time.monotonic() >= deadline:
            raise AdviseError(
                f"the load client ({BENCH_MODULE}) did not finish its warm-up within "
                f"{timeout_s:g} s (no {MAIN_RUN_MARKER!r} in {log.name}); raise --timeout"
            )
        time.sleep(POLL_S)


def wait_for_batches(
    load: subprocess.Popen, server_log: Path, offset: int, need: int, timeout_s: float
) -> None:
    """Until the server's log shows `need` MIXED batches of the burst past `offset` (unprofiled
    steps to price the eager host with), the client exits or `timeout_s` passes; how many there
    were is read again with the profile's window (server_log.host_scale)."""
    from sglang_mixgraph.core.prefill_log import batches, read_tail

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            seen = sum(b.mixed for b in batches(read_tail(server_log, offset)))
        except OSError as e:
            raise AdviseError(f"cannot read --server-log {server_log}: {e.strerror or e}") from None
        if seen >= need or load.poll() is not None or time.monotonic() >= deadline:
            return
        time.sleep(POLL_S)


# What the client prints when its burst is over (`sglang.benchmark.serving`, its results).
_DURATION = re.compile(rb"Benchmark duration \(s\):\s+([0-9.]+)")


def wait_for_load_end(load: subprocess.Popen, log: Path, timeout_s: float) -> float | None:
    """Until the load client has finished its burst, at most `timeout_s`: the benchmark
    duration it printed (s), or None where it printed none in time."""
    deadline = time.monotonic() + timeout_s
    while load.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    with contextlib.suppress(OSError):
        if m := _DURATION.search(log.read_bytes()):
            return float(m[1])
    return None


def trace_files(trace_dir: Path, profile_id: str) -> list[Path]:
    return sorted(trace_dir.glob(f"{profile_id}-*.trace.json*"))


def recorded_profiles(trace_dir: Path) -> list[tuple[str, list[Path]]]:
    """The profiles SGLang wrote into a directory earlier, newest first: (profile id, its
    ranks' traces), the id being the names' part before `-TP-<rank>`."""
    profiles: dict[str, list[Path]] = {}
    for path in sorted(trace_dir.glob("*-TP-*.trace.json*")):
        if path.is_file():
            profiles.setdefault(path.name.split("-TP-")[0], []).append(path)

    def newest(item: tuple[str, list[Path]]) -> float:
        return max(p.stat().st_mtime for p in item[1])

    return sorted(profiles.items(), key=newest, reverse=True)


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
    with_stack: bool = False,
) -> Capture:
    """Wait for the ranks' traces of `profile_id`: all `expected` of them, or those written
    within RANK_GRACE_S of the first; after `timeout_s` stop the profile (its answer waits for
    the ranks' writing) and wait STOP_GRACE_S more. One line (AdviseError) when none comes or
    the load client failed first."""
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
            with contextlib.suppress(AdviseError):  # the client's failure is the line to show
                stop_profile(server, with_stack)
            # A temporary trace directory goes with the failure: its last line is all that stays.
            where = f"its output: {load_log}" if keep_log else f"it said: {_last_line(load_log)}"
            raise AdviseError(
                f"the load client ({BENCH_MODULE}) exited with {load.returncode} before any "
                f"step was profiled; {where}"
            )
        if now >= deadline:
            if not stopped:
                # Fewer steps than asked for ran (or none), or the ranks are still writing:
                # the stop's answer comes once they have written.
                stop_profile(server, with_stack)
                stopped, deadline = True, time.monotonic() + STOP_GRACE_S
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
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its warm-up line, when printed
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
