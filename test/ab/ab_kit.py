"""Shared pieces of the `sglang-mixgraph ab` tests: the stand-in's model and data, a config
that launches the stand-in through the tool's own launch path, launch-prefix wrappers, and an
in-process invoker.

The in-process invoker runs the same modules the tool runs as children
(`sglang.benchmark.serving`, `sglang_mixgraph.ab.gsm8k_eval`) with `runpy`, as
`python -m module` would, so SGLang's real client and eval run against the stand-in while
their heavy imports are paid once per test session instead of once per cell; `Recorder` wraps
it and records which tool ran against which server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import runpy
import socket
import sys
import threading
import traceback
import warnings
from pathlib import Path

from sglang_mixgraph.ab import standin
from sglang_mixgraph.ab.standin import write_model_dir
from sglang_mixgraph.resolution.serving_client import BENCH_MODULE

STANDIN = Path(standin.__file__).resolve()
FLAG = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def small_sweep(concurrencies: str) -> str:
    """One repeat of 2-prompt cells (one warm-up request) of 8 random ids in, 2 out."""
    return f"""concurrencies = {concurrencies}
dataset = "random-ids"
input_len = 8
output_len = 2
num_prompts = 2
warmup_requests = 1
repeats = 1"""


def write_gsm8k(path: Path, n: int = 40) -> Path:
    """GSM8K-shaped lines (question, answer ending in `#### <number>`)."""
    with open(path, "w") as f:
        for i in range(n):
            line = {
                "question": f"Q{i}: what is {i} plus {i}?",
                "answer": f"{i}+{i}={2 * i}\n#### {2 * i}",
            }
            f.write(json.dumps(line) + "\n")
    return path


def sharegpt_text(n: int) -> str:
    """A ShareGPT file of `n` two-turn conversations, the shape bench_serving's loader reads."""
    turns = [{"from": "human", "value": "w1 w2 w3"}, {"from": "gpt", "value": "w4 w5"}]
    return json.dumps([{"id": str(i), "conversations": turns} for i in range(n)])


def write_wrapper(path: Path, mark: str, *, executable: bool = False) -> Path:
    """A launch prefix like tools/gpu-upstream/device.sh: prepares, then runs "$@" as its child.

    It appends its own pid to STANDIN_PID_FILE (so the tests see it stopped too) and exports
    STANDIN_WRAPPER=mark, which the stand-in reports: the server shows it went through it.
    Not `exec "$@"`: the server is the wrapper's child, the wrapper leads the process group.
    """
    path.write_text(
        "#!/bin/sh\n"
        'if [ -n "$STANDIN_PID_FILE" ]; then echo "$$" >> "$STANDIN_PID_FILE"; fi\n'
        f"export STANDIN_WRAPPER={mark}\n"
        '"$@"\n'
        "rc=$?\n"
        "exit $rc\n"
    )
    if executable:
        os.chmod(path, 0o755)
    return path


def expected_accuracy(num_shots: int, num_examples: int, wrong_every: int) -> float:
    # sglang's GSM8KEval asks the lines after the few-shot examples; the stand-in answers line
    # i wrongly when i is a multiple of wrong_every.
    asked = range(num_shots, num_shots + num_examples)
    return sum(i % wrong_every != 0 for i in asked) / num_examples


def standin_config(
    tmp: Path,
    *,
    port: int | None = None,
    arms: str,
    sweep: str,
    gsm8k: str = "enabled = false",
    extra: str = "",
    server: str = "",
) -> Path:
    """An `ab` config that launches the stand-in, on a free port unless `port` is given."""
    model = tmp / "model"
    if not model.exists():
        write_model_dir(model)
    data = tmp / "gsm8k.jsonl"
    if not data.exists():
        write_gsm8k(data)
    if port is None:
        port = free_port()
    path = tmp / "ab.toml"
    path.write_text(
        f"""
[server]
model_path = "{model}"
command = ["{sys.executable}", "{STANDIN}"]
args = ["--gsm8k-data", "{data}", "--ttft-ms", "30"]
port = {port}
health_timeout_s = 60
stop_timeout_s = 10
{server}

{arms}

[sweep]
{sweep}

[gsm8k]
data_path = "{data}"
{gsm8k}

{extra}
"""
    )
    return path


# SGLang's client pauses 1 s between its warm-up and its main run (`await asyncio.sleep(1.0)` in
# `sglang.benchmark.serving.benchmark`): against the stand-in that pause is most of a cell and
# measures nothing, so the tests' in-process runs of the client skip exactly that sleep.
CLIENT_PAUSE_S = 1.0


@contextlib.contextmanager
def _client_pause_skipped(module: str):
    if module != BENCH_MODULE:
        yield
        return
    real_sleep = asyncio.sleep

    async def sleep(delay, result=None):
        return await real_sleep(0 if delay == CLIENT_PAUSE_S else delay, result)

    asyncio.sleep = sleep
    try:
        yield
    finally:
        asyncio.sleep = real_sleep


def inprocess_invoker(module, argv, log_path, timeout_s, watch):
    """Run `python -m module *argv` in this process, output to log_path (the client's 1 s pause
    after its warm-up skipped)."""
    saved_argv = sys.argv
    sys.argv = [module, *argv]
    try:
        with (
            open(log_path, "a") as log,
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
            _client_pause_skipped(module),
        ):
            try:
                with warnings.catch_warnings():
                    # runpy notes the module is already imported (by the previous cell): fine,
                    # it runs the module's code again as __main__, like a fresh `python -m`.
                    warnings.simplefilter("ignore", RuntimeWarning)
                    runpy.run_module(module, run_name="__main__", alter_sys=False)
            except SystemExit as e:
                return e.code if isinstance(e.code, int) else 1
            except Exception:
                traceback.print_exc()
                return 1
        return 0
    finally:
        sys.argv = saved_argv


def watching_invoker(module, argv, log_path, timeout_s, watch):
    """`inprocess_invoker` in a thread while this one calls `watch` as the tool's own invoker
    does, so the runner's progress lines are printed while the load generator runs. The tool's
    output must not go to sys.stderr then (the thread redirects it into the log)."""
    code: list[int] = []
    worker = threading.Thread(
        target=lambda: code.append(inprocess_invoker(module, argv, log_path, timeout_s, watch))
    )
    worker.start()
    while worker.is_alive():
        watch()
        worker.join(0.05)
    return code[0]


class Recorder:
    """The in-process invoker, recording which tool ran for which server."""

    def __init__(self, interrupt_at: int | None = None):
        self.calls: list[tuple[str, list[str]]] = []
        self.interrupt_at = interrupt_at

    def __call__(self, module, argv, log_path, timeout_s, watch):
        self.calls.append((module, argv))
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        return inprocess_invoker(module, argv, log_path, timeout_s, watch)

    def bench_servers(self) -> list[str]:
        return [
            json.loads(Path(argv[argv.index("--output-file") + 1]).read_text())["server_info"][
                "standin"
            ]["tpot_ms"]
            for module, argv in self.calls
            if module == BENCH_MODULE
        ]


def pids_alive(pid_file: Path) -> list[int]:
    if not pid_file.exists():
        return []
    alive = []
    for pid in map(int, pid_file.read_text().split()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        # A zombie has exited and waits for its (re)parent to reap it: not running.
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            alive.append(pid)
    return alive
