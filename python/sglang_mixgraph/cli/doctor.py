"""`sglang-mixgraph doctor`: what is installed, what the plugin would do, and why each patch exists.

By default one screen: the installed versions, the GPU, whether SGLang loads the plugin, the
flags set, a line per patch (its state, its switches, how many upstream targets check out; a
failing target named) and a line per upstream guard. `--verbose` adds every flag, each patch's
catalogue entry (why, how, the upstream PR it mirrors, what retires it; for mixed_split where
its cost model's coefficients come from) and every target's signature; `--json` has it all.
Exit status 1 when an enabled patch cannot apply, a patch the user switched on defers to
upstream, a flag is invalid or a guard fails. This front parses the arguments; the report is
`resolution.doctor_report`'s. sglang is imported inside the functions only.
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "doctor"
HELP = "versions, GPU, every flag and patch with its target checks"


def cmd_doctor(args: argparse.Namespace) -> int:
    from sglang_mixgraph.resolution.doctor_report import doctor_report, print_doctor
    from sglang_mixgraph.resolution.errors import environment_problem
    from sglang_mixgraph.resolution.plan_inputs import quiet_import_warnings

    try:
        with quiet_import_warnings():
            report = doctor_report()
    except OSError as e:
        problem = environment_problem(e)
        if problem is None:
            raise
        print(f"sglang-mixgraph doctor: {problem}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_doctor(report, args.verbose)
    return 0 if report["ok"] else 1


def add_parser(sub) -> None:
    parser = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Check this environment: the installed SGLang, torch and flash_mla, the GPU, whether "
            "SGLang loads the plugin, the flags set, each patch's state with its upstream "
            "targets, and the upstream behaviour the plugin relies on. Exits 1 when an enabled "
            "patch cannot apply, a patch switched on is deferred to upstream, a flag is invalid "
            "or a guard fails."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--json", action="store_true", help="print JSON (always complete)")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also list every flag, each patch's catalogue entry and every target's signature",
    )
