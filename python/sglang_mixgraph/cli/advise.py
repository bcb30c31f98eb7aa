"""`sglang-mixgraph advise`: which of this plugin's patches pays on a running server.

With `--url` it attaches to the server (starts none), profiles `--steps` forward steps through
SGLang's own `/start_profile` (traces in `--trace-dir`, which the server writes on its own
host), optionally sends a burst with SGLang's benchmark client (`--load`, profiled once its
warm-up is over), reads every rank's trace and prints what to switch on first and the evidence
(`--json`: the same with a `schema_version`). Without `--url` it reads the traces SGLang's
profiler wrote earlier into `--trace-dir`. This front parses the arguments and hands them to
`sglang_mixgraph.advise.command` (docs/advise.md). Every failure is one line on stderr: exit 2
for the command line, 1 when the server, its traces or its steps give no answer.
"""

from __future__ import annotations

import argparse
import sys

NAME = "advise"
HELP = "profile a running SGLang server and say which of the plugin's patches pays there"
PROG = f"sglang-mixgraph {NAME}"


def _one_line_error(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(2)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Attach to a running SGLang server (starts none), profile a few forward steps with "
            "its /start_profile endpoint, and say which of this plugin's patches would shorten "
            "its MIXED steps, with the evidence; without --url, read the traces SGLang's "
            "profiler wrote earlier into --trace-dir. See docs/advise.md."
        ),
        allow_abbrev=False,
    )
    parser.error = _one_line_error  # one line, not argparse's usage block
    parser.add_argument(
        "--url",
        help="the server to profile, e.g. http://127.0.0.1:30000 (without it: read the traces "
        "recorded earlier in --trace-dir)",
    )
    parser.add_argument(
        "--trace-dir",
        help="with --url: where the server writes its traces (kept there); it writes on its own "
        "host, so this must be a directory both machines see (default: a fresh temporary "
        "directory). Without --url: the directory of traces SGLang's profiler wrote earlier",
    )
    parser.add_argument(
        "--steps", type=int, default=16, help="forward steps to profile (default 16)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the steps before stopping the profile, and with --load first "
        "for the client's warm-up to end and, with --server-log, after the profile for its "
        "burst to end (default 60 each)",
    )
    parser.add_argument(
        "--load",
        action="store_true",
        help="send a short burst with SGLang's benchmark client while profiling",
    )
    parser.add_argument(
        "--load-args",
        default="",
        metavar="'ARGS'",
        help="more arguments for the benchmark client, one quoted string (with --load)",
    )
    parser.add_argument(
        "--server-log",
        help="the server's log file as it writes it (its stdout and stderr), readable here: "
        "SGLang's prefill batch lines time the eager steps without the profiler, which slows "
        "their host; with --load the profile then starts after --steps MIXED batches of the "
        "burst, and the whole burst gives the prefill share of the served time. Without it "
        "the host is priced as profiled",
    )
    parser.add_argument(
        "--model-path",
        help="a local directory (or config.json) with the served model's config, when the "
        "server's model path is not readable here",
    )
    parser.add_argument(
        "--stack",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="profile with Python stacks: kernels classed by their frames and the plugin's "
        "patches seen, but SGLang takes much longer to write the traces, so its /stop_profile "
        "is given a longer bound (docs/advise.md); default off",
    )
    parser.add_argument("--api-key", help="the server's admin or API key (sent as a bearer token)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_advise(args: argparse.Namespace) -> int:
    from sglang_mixgraph.advise.command import run

    return run(args, PROG)
