"""`sglang-mixgraph doctor | plan | ab | advise | demo`: the console script, a module each.

`doctor` (doctor.py) says what is installed and what each patch does and why; `plan` (plan.py)
resolves a deployment for a described GPU; `ab` (ab.py) hands its arguments to the A/B tool
(ab/); `advise` (advise.py) profiles a running server and says which patch pays there
(advise/); `demo` (demo.py) runs `ab` against a CPU stand-in server. Each command module names
itself, adds its parser and runs, importing no other command: what they share lives below
them in resolution/ (SGLang's resolution, plan inputs, presets, the plan's format). This
module only dispatches, as SGLang's own `sglang/cli/main.py` does. `plan` selects the described-GPU platform before
anything imports `sglang.srt`, so no module here imports sglang at import time. The entry point
is `main` (the `sglang-mixgraph` script, and `python -m sglang_mixgraph.cli`); `--version`
names the plugin's version and the installed SGLang's, read from package metadata. A report
whose reader closed the pipe (`doctor | head`, `advise ... | head -1`) ends quietly with
status 141, as Unix tools do.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from importlib import metadata

from sglang_mixgraph import __version__
from sglang_mixgraph.cli import ab, advise, demo, doctor, plan

COMMANDS = (doctor, plan, ab, advise, demo)


def version_line() -> str:
    """The plugin's version, and the SGLang it would patch (from metadata: no sglang import)."""
    try:
        sglang = f"sglang {metadata.version('sglang')}"
    except metadata.PackageNotFoundError:
        sglang = "sglang not installed"
    return f"sglang-mixgraph {__version__} ({sglang})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-mixgraph",
        description="Inspect the sglang-mixgraph plugin and plan SGLang deployments.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


# The exit status of a report whose reader closed the pipe (`plan | head`): 128 + SIGPIPE, what
# a shell reports for any Unix tool that a closed pipe stopped (`yes | head`), so `set -o
# pipefail` and PIPESTATUS read it as they do for them; 1 already means doctor found problems.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def _until_the_reader_leaves(command: Callable[[], int]) -> int:
    """Run a command that prints its report on stdout; stop quietly when the reader closed it.

    Python ignores SIGPIPE and raises BrokenPipeError instead; SIGPIPE's default action is not
    restored because it would also kill the process for any other pipe or socket. The recipe of
    Python's signal documentation ("Note on SIGPIPE"): flush inside the guard, then point stdout
    at devnull so that the interpreter's own flush at exit does not raise again."""
    try:
        code = command()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [ab.NAME]:  # its own parser: run / report
        return ab.run(argv[1:])
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == doctor.NAME:
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _until_the_reader_leaves(lambda: doctor.cmd_doctor(args))
    if args.command == advise.NAME:
        if rest:
            print(f"{advise.PROG}: unrecognized arguments: {' '.join(rest)}", file=sys.stderr)
            return 2
        return _until_the_reader_leaves(lambda: advise.cmd_advise(args))
    if args.command == demo.NAME:
        if rest:
            print(f"{demo.PROG}: unrecognized arguments: {' '.join(rest)}", file=sys.stderr)
            return 2
        return _until_the_reader_leaves(lambda: demo.cmd_demo(args))
    # the rest are SGLang server arguments
    return _until_the_reader_leaves(lambda: plan.cmd_plan(args, rest))
