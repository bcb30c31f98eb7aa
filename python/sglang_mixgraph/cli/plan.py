"""`sglang-mixgraph plan`: what a deployment resolves to, for a described target GPU.

It runs SGLang's own argument parser and resolution (resolve.py) without starting anything, so
it works on a machine without a GPU: the described-GPU platform is selected before anything
imports `sglang.srt`, so this module imports sglang only inside the command. The target is
--target-gpu, else this machine's GPU, else the default (local_gpu.py); text and JSON say which.
Without --model-path it plans an embedded deployment (presets.py) with the user's arguments on
top. The text is the inputs, then what SGLang will do, the capture estimate of the list it
captures (the split cost model's sources with --verbose) and the advice (plan_format.py), then
each patch: an active one's note, and for one that is off what each of its switches would do
here ("with FLAG=value: ..."). This front parses the arguments; `resolution.plan_report` runs
the command.
"""

from __future__ import annotations

import argparse

from sglang_mixgraph.resolution.presets import DEFAULT_PRESET, PRESETS
from sglang_mixgraph.target_gpu import DEFAULT_GPU, GPUS

NAME = "plan"
HELP = "resolve SGLang server arguments as launch_server would, for a target GPU"


def cmd_plan(args: argparse.Namespace, server_argv: list[str]) -> int:
    from sglang_mixgraph.resolution.plan_report import run

    return run(args, server_argv)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Resolve SGLang server arguments exactly as `python -m sglang.launch_server` would "
            "(with this plugin loaded) without starting anything. Arguments not listed here are "
            "SGLang server arguments. Without --model-path they are applied on top of the "
            "embedded reference deployment (each option given replaces the reference's value)."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show where the split cost model's coefficients come from (JSON always has it)",
    )
    parser.add_argument(
        "--preset",
        choices=list(PRESETS),
        help=f"embedded deployment to plan when --model-path is not given (default {DEFAULT_PRESET})",
    )
    parser.add_argument(
        "--target-gpu",
        type=str.upper,
        choices=list(GPUS),
        help=(
            "GPU to describe to SGLang (default: this machine's GPU as nvidia-smi names it, "
            f"else {DEFAULT_GPU})"
        ),
    )
