#!/usr/bin/env python3
"""One profiled step's GPU kernel time by class, from a torch profiler trace (chrome JSON).

    python3 tools/rank-slice/step_classes.py TRACE.json[.gz|.xz] [--json]

The classes and how a kernel is classed (by the Python frames that launched it, else by its
name) are the package's: ``sglang_mixgraph.core.kernel_classes``, which ``sglang-mixgraph
advise`` reads a server's traces with too. This script prints its table as markdown or JSON.
Reads nothing but the trace: no torch, no GPU.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys

from sglang_mixgraph.core.kernel_classes import CLASSES, class_table, load_trace


def markdown(table: dict) -> str:
    lines = ["| class | ms | share | kernels | largest |", "|---|---:|---:|---:|---|"]
    for c in CLASSES:
        r = table["classes"][c]
        big = r["largest"][0]["name"][:60] if r["largest"] else ""
        lines.append(f"| {c} | {r['ms']:.2f} | {100 * r['share']:.1f}% | {r['count']} | `{big}` |")
    lines.append(f"| all | {table['kernel_ms']:.2f} | 100% | {table['kernels']} | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="chrome-trace JSON of one step (.json, .json.gz, .json.xz)")
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    args = ap.parse_args(argv)
    try:
        events = load_trace(args.trace)
    except (OSError, ValueError, KeyError, EOFError, lzma.LZMAError) as e:
        print(f"step_classes: cannot read {args.trace}: {e}", file=sys.stderr)
        return 2
    table = class_table(events)
    print(json.dumps(table, indent=1) if args.json else markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
