"""`sglang-mixgraph demo`: the A/B tool end to end against a CPU stand-in server, in minutes.

Without a GPU there is no SGLang server to compare arms on, so nothing shows what `ab` does.
`demo` writes a two-arm configuration whose server is the package's stand-in (ab/standin.py:
an HTTP app with a latency model; no model, no GPU, no SGLang server), runs it through the
real `ab run` code path (launch, health wait, SGLang's own bench_serving, statistics, report)
and prints the report, labelled as the stand-in's numbers. Its directory (`--dir`, by default a
fresh temporary one) holds demo.toml, the stand-in's tokenizer (model/) and the run (run/), and
is kept, so `ab report` and `ab run` can be tried on it afterwards. A `--dir` that exists and
is not empty, or cannot be written, is one line and exit 2, before anything starts; inputs it
could not write whole (a full disk) or a signal while writing them (Ctrl-C, SIGTERM, SIGHUP)
leave the directory as it was, said in one line naming it. A run that stops after that (a
full disk, a signal: `ab` stops the stand-in) says how to resume it with `ab run`. This front
parses the arguments; ab/demo.py runs the demo.
"""

from __future__ import annotations

import argparse

NAME = "demo"
PROG = f"sglang-mixgraph {NAME}"
HELP = "run `ab` end to end against a CPU stand-in server (no GPU, no model), a few minutes"


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Run `sglang-mixgraph ab run` end to end, two arms, against a CPU stand-in server "
            "(no GPU, no model, no SGLang server): its numbers are the stand-in's, not a "
            "model's. Prints the report. See docs/ab.md, 'Try it'."
        ),
        allow_abbrev=False,
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="a new or empty directory for the configuration, the stand-in's tokenizer and the "
        "run (default: a fresh temporary directory); kept afterwards",
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from sglang_mixgraph.ab.demo import run

    return run(args.dir, PROG)
