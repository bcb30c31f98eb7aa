"""The step mix of a served run, read from SGLang's own scheduler log lines.

SGLang logs one ``Prefill batch`` line per prefill forward and, with ``--decode-log-interval 1``,
one ``Decode batch`` line per decode forward (``scheduler_components.metrics_reporter``:
``report_prefill_stats`` and the decode report). With ``--enable-mixed-chunk`` a prefill forward
that starts while requests are decoding carries their decode rows: its line shows
``#running-req`` above zero, and it is counted as MIXED here; one with none running is EXTEND.
The graph flag at the end of each line (``cuda graph: True``) says whether the step replayed.

    python3 tools/rank-slice/step_mix.py RUN_DIR/logs/*.log      # one summary per log
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterable

_PREFILL = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<tokens>\d+),"
    r".*?#running-req: (?P<running>\d+),.*?(?P<graph>True|False), input throughput"
)
_DECODE = re.compile(r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+),")
_GRAPH = re.compile(r"(?:cuda|cpu|npu|musa) graph: (?P<graph>True|False)")


def step_mix(lines: Iterable[str]) -> dict[str, object]:
    """Counts per step kind (MIXED, EXTEND, DECODE) split by replayed or eager, the decode rows
    MIXED steps carried, and the prefill tokens per kind."""
    steps: Counter = Counter()
    mixed_rows = []
    tokens: Counter = Counter()
    for line in lines:
        m = _PREFILL.search(line)
        if m:
            kind = "MIXED" if int(m["running"]) > 0 else "EXTEND"
            steps[f"{kind}/{'graph' if m['graph'] == 'True' else 'eager'}"] += 1
            tokens[kind] += int(m["tokens"])
            if kind == "MIXED":
                mixed_rows.append(int(m["running"]))
            continue
        m = _DECODE.search(line)
        if m:
            g = _GRAPH.search(line)
            graph = "graph" if g and g["graph"] == "True" else "eager"
            steps[f"DECODE/{graph}"] += 1
    total = sum(steps.values())
    mixed = sum(n for k, n in steps.items() if k.startswith("MIXED"))
    return {
        "steps": dict(sorted(steps.items())),
        "total": total,
        "mixed_share": round(mixed / total, 3) if total else None,
        "prefill_tokens": dict(tokens),
        "mixed_decode_rows": {
            "median": sorted(mixed_rows)[len(mixed_rows) // 2] if mixed_rows else None,
            "max": max(mixed_rows, default=None),
        },
    }


def main(paths) -> int:
    if not paths:
        print("usage: step_mix.py LOG [LOG ...]", file=sys.stderr)
        return 2
    for path in paths:
        with open(path, errors="replace") as f:
            print(path, json.dumps(step_mix(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
