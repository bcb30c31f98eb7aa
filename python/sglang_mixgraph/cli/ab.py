"""`sglang-mixgraph ab`: A/B sweeps of serving speed and GSM8K, with their own parser (ab/cli.py).

The top-level parser only lists the command: everything after ``ab`` goes to the ab tool's own
parser (run / report), so its options never meet doctor's or plan's (docs/ab.md).
"""

from __future__ import annotations

NAME = "ab"
HELP = "A/B sweeps of serving speed and GSM8K (docs/ab.md)"


def add_parser(sub) -> None:
    sub.add_parser(NAME, add_help=False, help=HELP)


def run(argv: list[str]) -> int:
    from sglang_mixgraph.ab.cli import main

    return main(argv)
