"""Reaching an arm's server: launch it (and always stop it) or attach to one already running.

Launch runs `python -m sglang.launch_server` (or `[server] command`, e.g. a container or
`srun` wrapper), after the arm's launch prefix if it has one (a wrapper that prepares the
machine and then runs "$@", e.g. `bash tools/gpu-upstream/device.sh`), with the shared and the
arm's environment and arguments, in a session of its own so that the whole process group
(SGLang's scheduler and detokenizer processes included; with a prefix, the wrapper leads the
group and the server is its child) can be signalled at once, with stdout and stderr appended
to a log file. Readiness is polled on `/health_generate` as SGLang's own test launcher does
(sglang.test.test_utils `_wait_for_server_health`): it answers 200 only once the server
generates. Stopping sends
SIGTERM to the group, waits, then SIGKILL to whatever is left of it and waits until every
member has exited, so no process (nor the GPU memory it holds) outlives a visit, a failure or
a Ctrl-C. Attach only checks the given URL answers the same probe.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_mixgraph.ab.config import LAUNCH_MODULE, Arm, Config, launch_command, launch_prefix

HEALTH_PATH = "/health_generate"
# Poll fast first (a stand-in or an attached server answers at once), then every few seconds.
POLL_FIRST_S = 0.2
POLL_MAX_S = 5.0


class ServerError(RuntimeError):
    """A server that could not be reached, started, or kept running; first line says which."""


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.splitlines()[-lines:]
    return "\n".join("    | " + line for line in tail) if tail else "    | (empty log)"


def healthy(url: str, timeout_s: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + HEALTH_PATH, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def launch_argv(config: Config, arm: Arm) -> list[str]:
    """prefix + command + launch arguments; without a prefix, python is this interpreter."""
    s = config.server
    prefix = launch_prefix(config, arm)
    command = launch_command(s, bool(prefix)) or (sys.executable, *LAUNCH_MODULE)
    return [
        *prefix,
        *command,
        "--model-path",
        str(s.model_path),
        "--host",
        s.host,
        "--port",
        str(s.port),
        *s.args,
        *arm.args,
    ]


def launch_line(config: Config, arm: Arm) -> str:
    """The arm's launch as one shell line: its environment (on top of ours), then the argv."""
    env = {**config.server.env, **arm.env}
    words = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
    return " ".join([*words, shlex.join(launch_argv(config, arm))])


def executable_problem(word: str, env: dict[str, str]) -> str | None:
    """Why `word` cannot be started as a command (None: it can), as Popen would look it up."""
    if "/" not in word:  # looked up on the server's PATH, as Popen will
        path = os.pathsep.join(os.get_exec_path({**os.environ, **env}))
        return None if shutil.which(word, path=path) else f"{word!r} is not an executable on PATH"
    path = Path(word)  # relative to the directory the tool runs in, as Popen will
    if not path.is_file():
        return f"{word!r}: no such file"
    if not os.access(path, os.X_OK):
        return f"{word!r} is not executable (chmod +x it, or run it through bash: 'bash {word}')"
    return None


def launch_problems(config: Config) -> list[str]:
    """One line per launch prefix (of an arm that launches) whose first word cannot run."""
    problems = []
    for arm in config.arms:
        prefix = launch_prefix(config, arm)
        if arm.url is not None or not prefix:
            continue
        where = (
            "[server] launch_prefix"
            if arm.launch_prefix is None
            else f"arm {arm.name!r} launch_prefix"
        )
        problem = executable_problem(prefix[0], {**config.server.env, **arm.env})
        line = f"{where}: {problem}" if problem else None
        if line and line not in problems:
            problems.append(line)
    return problems


@dataclass
class Server:
    """One arm's server for one visit; `proc` is None when attached."""

    arm: str
    url: str
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    stop_timeout_s: float = 60.0

    def check_process(self, during: str) -> None:
        """Cheap, while a tool runs: has the launched server exited? (Attached: unknowable.)"""
        if self.proc is not None:
            self.check_alive(during)

    def check_alive(self, during: str) -> None:
        if self.proc is None:
            if not healthy(self.url):
                raise ServerError(
                    f"arm {self.arm!r}: the attached server at {self.url} stopped answering "
                    f"{HEALTH_PATH} during {during}"
                )
            return
        code = self.proc.poll()
        if code is not None:
            raise ServerError(
                f"arm {self.arm!r}: the server exited with code {code} during {during}; "
                f"log {self.log_path}, last lines:\n{log_tail(self.log_path)}"
            )

    def stop(self) -> list[int]:
        """Stop the whole process group; returns the pids still running after SIGKILL.

        Uninterruptible: while it runs, SIGINT, SIGTERM and SIGHUP (a second Ctrl-C, a
        cancelled CI job, a closed terminal) only hurry it, SIGTERM's grace is cut short and the group is SIGKILLed at once,
        and the interrupt is raised (KeyboardInterrupt) once the group is gone. Pids that
        outlive SIGKILL are printed on stderr.
        """
        if self.proc is None:
            return []
        with _Hurry() as hurry:
            left = self._stop(hurry)
        if left:
            print(
                f"sglang-mixgraph ab: arm {self.arm!r}: server processes {left} (process group "
                f"{self.proc.pid}) are still running after SIGKILL; kill them before the next "
                f"run: kill -9 {' '.join(map(str, left))}",
                file=sys.stderr,
                flush=True,
            )
        if hurry.signals:
            raise KeyboardInterrupt
        return left

    def _stop(self, hurry: _Hurry) -> list[int]:
        assert self.proc is not None
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        if self.proc.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            # A signal ends SIGTERM's grace at once.
            _wait_until(lambda: self.proc.poll() is not None, self.stop_timeout_s, hurry, 0.0)
        # The leader may be gone while its children (SGLang's scheduler processes, holding GPU
        # memory) still run: the group dies with it, and the next server starts only once
        # every member has exited.
        _signal_group(pgid, signal.SIGKILL)
        # Reaped at once unless it is stuck in the kernel (D state); then it is listed below.
        _wait_until(
            lambda: self.proc.poll() is not None, self.stop_timeout_s, hurry, HURRIED_WAIT_S
        )
        left: list[int] = []

        def gone() -> bool:
            left[:] = _running_members(pgid)
            return not left

        _wait_until(gone, self.stop_timeout_s, hurry, HURRIED_WAIT_S)
        return left


# After a signal during stop(): how long to wait for SIGKILLed processes to be gone.
HURRIED_WAIT_S = 3.0


class _Hurry:
    """SIGINT and SIGTERM, while stopping a server, are counted instead of raised.

    Only the main thread can set signal handlers; elsewhere nothing changes (the signal then
    reaches the main thread's own handlers, and this stop runs on undisturbed).
    """

    def __init__(self) -> None:
        self.signals = 0
        self.since: float | None = None
        self._previous: dict[int, object] = {}

    def _handler(self, signum: int, frame: object) -> None:
        self.signals += 1
        if self.since is None:
            self.since = time.monotonic()

    def __enter__(self) -> _Hurry:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _wait_until(done: Callable[[], bool], timeout_s: float, hurry: _Hurry, after: float) -> bool:
    """Poll `done` until it holds or `timeout_s` passes; after a signal, at most `after` more."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if hurry.since is not None:
            deadline = min(deadline, hurry.since + after)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _running_members(pgid: int) -> list[int]:
    """Pids of the group that have not exited (a zombie has exited). By group, not by the
    leader's children: a child whose leader died is re-parented and would be missed."""
    import psutil

    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue  # gone, or not ours to inspect
    return members


def _wait_healthy(
    url: str, timeout_s: float, check: Callable[[], None], on_wait: Callable[[], None]
) -> bool:
    deadline = time.monotonic() + timeout_s
    pause = POLL_FIRST_S
    while not healthy(url):
        check()
        on_wait()
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, POLL_MAX_S)
    return True


def launch(
    config: Config, arm: Arm, log_path: Path, on_wait: Callable[[], None] = lambda: None
) -> Server:
    """Start the arm's server and wait until it generates; `on_wait` runs at every poll."""
    s = config.server
    url = f"http://{s.host}:{s.port}"
    if healthy(url, timeout_s=2.0):
        # Another server on the port would be measured in place of this arm's.
        raise ServerError(
            f"arm {arm.name!r}: something already answers on {url}; stop it or change [server] port"
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = launch_argv(config, arm)
    with open(log_path, "ab") as log:
        log.write(f"\n=== sglang-mixgraph ab: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                env={**os.environ, **s.env, **arm.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise ServerError(
                f"arm {arm.name!r}: cannot start {argv[0]!r} ({e.strerror})"
            ) from None
    server = Server(
        arm=arm.name, url=url, proc=proc, log_path=log_path, stop_timeout_s=s.stop_timeout_s
    )
    try:
        if not _wait_healthy(
            url, s.health_timeout_s, lambda: server.check_alive("startup"), on_wait
        ):
            raise ServerError(
                f"arm {arm.name!r}: the server did not become healthy within "
                f"{s.health_timeout_s:g} s ([server] health_timeout_s); log {log_path}, "
                f"last lines:\n{log_tail(log_path)}"
            )
    except BaseException:
        server.stop()
        raise
    return server


def attach(arm: Arm, timeout_s: float = 60.0) -> Server:
    assert arm.url is not None
    if not _wait_healthy(arm.url, timeout_s, lambda: None, lambda: None):
        raise ServerError(
            f"arm {arm.name!r}: no healthy server at {arm.url} ({HEALTH_PATH} did not answer "
            f"200 within {timeout_s:g} s)"
        )
    return Server(arm=arm.name, url=arm.url.rstrip("/"))
