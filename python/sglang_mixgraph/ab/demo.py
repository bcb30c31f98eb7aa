"""`sglang-mixgraph demo`'s run: the A/B tool end to end against a CPU stand-in server.

`run` writes a two-arm configuration whose server is the package's stand-in (standin.py: an
HTTP app with a latency model; no model, no GPU, no SGLang server) into a new or empty
directory with the stand-in's tokenizer, runs it through the real `ab run` code path (cli.py)
and prints the report, labelled as the stand-in's numbers. Inputs it could not write whole, or
a signal while writing them, leave the directory as it was; a run that stops after that says
how to resume it with `ab run`. The command's front is cli/demo.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import textwrap
from pathlib import Path

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as `ab` and a shell report it
STANDIN_MODULE = "sglang_mixgraph.ab.standin"
CONFIG_NAME = "demo.toml"
# The stand-in's latency model: the arms differ only in TPOT, so the report's ratio is known.
TTFT_MS = 40
TPOT_MS = {"baseline": 12, "candidate": 9}
TPOT_PER_RUNNING_MS = 0.25

NOT_MEASURED = "the numbers are a CPU stand-in's, not a measurement of SGLang or of a model"
LABEL = (
    f"{NOT_MEASURED}: every server is the plugin's stand-in ({STANDIN_MODULE}), an HTTP app "
    f"with a latency model (TTFT {TTFT_MS} ms; TPOT {TPOT_MS['baseline']} ms in `baseline`, "
    f"{TPOT_MS['candidate']} ms in `candidate`, + {TPOT_PER_RUNNING_MS:g} ms per request in "
    "flight), with no GPU, no model and no SGLang server. Real: the A/B tool (launch, health "
    "wait, cells, statistics, this report) and SGLang's own bench_serving driving the stand-in."
)


class DemoDirError(Exception):
    """A --dir the demo cannot use; the message is the whole line."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_config(model: Path, port: int) -> str:
    """The demo's `ab` configuration: two arms of the stand-in, one small cell each, three
    repeats (so the ratios have intervals) and one gate on the TPOT ratio."""
    command = [sys.executable, "-m", STANDIN_MODULE]
    arms = "\n".join(
        f'[[arm]]\nname = "{name}"\nargs = ["--tpot-ms", "{tpot}"]\n'
        for name, tpot in TPOT_MS.items()
    )
    # json.dumps writes strings (and lists of them) that are valid TOML basic strings.
    return f'''# Written by `sglang-mixgraph demo`: {NOT_MEASURED}.
note = """`sglang-mixgraph demo`: {LABEL}"""

[server]
model_path = {json.dumps(str(model))}
command = {json.dumps(command)}
args = ["--ttft-ms", "{TTFT_MS}", "--tpot-per-running-ms", "{TPOT_PER_RUNNING_MS:g}"]
port = {port}
health_timeout_s = 60
stop_timeout_s = 10

{arms}
[sweep]
concurrencies = [4]
dataset = "random-ids"
input_len = 32
output_len = 16
num_prompts = 8
warmup_requests = 2
repeats = 3

# The candidate's TPOT is 9 ms against 12: its median TPOT must be confirmed below 0.9x.
[[gate]]
metric = "median_tpot_ms"
candidate = "candidate"
baseline = "baseline"
concurrency = 4
max_ratio = 0.9
judge = "confirmed"

# SGLang's GSM8K eval would double the time; the stand-in answers it too (`--gsm8k-data`).
[gsm8k]
enabled = false
'''


def _demo_dir(given: str | None) -> tuple[Path, bool]:
    """The directory to write into: new or empty (created), or a fresh temporary one; and
    whether this demo created it (then a failed start removes it again)."""
    if given is None:
        try:
            return Path(tempfile.mkdtemp(prefix="sglang-mixgraph-demo-")), True
        except OSError as e:
            raise DemoDirError(f"cannot make a temporary directory ({e.strerror or e})") from None
    path = Path(given).resolve()
    try:
        if path.exists() and not path.is_dir():
            raise DemoDirError(f"--dir {path}: exists and is not a directory")
        if path.is_dir() and any(path.iterdir()):
            raise DemoDirError(
                f"--dir {path}: exists and is not empty; give a new or empty directory"
            )
        created = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DemoDirError(f"--dir {path}: cannot create or read it ({e.strerror or e})") from None
    return path, created


def _write_inputs(path: Path) -> Path:
    """demo.toml and the stand-in's tokenizer in `path`; the configuration's path. Each is
    written under a temporary name and renamed, so `path` holds whole inputs or none."""
    from sglang_mixgraph.ab import files
    from sglang_mixgraph.ab.standin import write_model_dir

    config, model = path / CONFIG_NAME, path / "model"
    partial = path / "model.partial"
    try:
        # The configuration first: an unwritable directory fails before transformers loads.
        files.write_text(config, demo_config(model, _free_port()))
        write_model_dir(partial)
        os.replace(partial, model)
    except OSError as e:
        raise DemoDirError(
            f"--dir {path}: cannot write there ({e.strerror or e}); nothing is left there, "
            "free space and run the same command again"
        ) from None
    return config


def _undo(path: Path, created: bool) -> None:
    """Leave the directory as it was: empty again, or gone when this demo created it."""
    for child in (path / CONFIG_NAME, path / "model", path / "model.partial"):
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if created:
        with contextlib.suppress(OSError):
            path.rmdir()


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM and SIGHUP leave the directory as Ctrl-C does


def run(directory: str | None, prog: str) -> int:
    """The demo in `directory` (None: a fresh temporary one), its lines naming `prog`; the
    exit status (`ab run`'s, 2 for a directory it cannot use, 130 when interrupted)."""
    try:
        path, created = _demo_dir(directory)
    except DemoDirError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_USAGE
    previous = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        config = _write_inputs(path)
    except (DemoDirError, KeyboardInterrupt) as e:
        _undo(path, created)
        said = f"interrupted; {path} is left as it was" if isinstance(e, KeyboardInterrupt) else e
        print(f"{prog}: {said}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, DemoDirError) else EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    from sglang_mixgraph.ab import cli as ab_cli

    run_dir = path / "run"
    print(textwrap.fill(f"{prog}: `ab run` with two arms; {LABEL}", width=100))
    print(f"directory (kept): {path}")
    print(f"configuration: {config}", flush=True)
    code = ab_cli.main(["run", str(config), "--run-dir", str(run_dir), "--offline"])
    again = f"sglang-mixgraph ab run {config} --run-dir {run_dir}"
    report = run_dir / "report.md"
    if report.is_file():
        print(f"\n==> {report} <==\n{report.read_text()}")
        print(
            f"run it again (finished cells are skipped): {again}\n"
            f"rebuild the report: sglang-mixgraph ab report {run_dir}"
        )
    elif code != 0:
        # `demo` itself refuses a directory that is not empty: the run resumes through `ab`.
        print(f"{prog}: to resume (finished cells are kept): {again}", file=sys.stderr)
    return code
