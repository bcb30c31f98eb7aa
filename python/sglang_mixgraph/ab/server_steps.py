"""What each launched visit's server logged of its prefill steps, for the report.

Every visit `ab` launches writes its server's log to `servers/<arm>_<n>.log` (n: the repeat,
or `warm`). SGLang logs each prefill step, MIXED ones included, with whether it replayed a
prefill graph and the time since the previous one (core.prefill_log). Per visit: how many
prefill steps, how many replayed, how many MIXED, and the median time between back-to-back
MIXED steps, eager and replayed. So the report shows that an arm did what it claims (its
MIXED steps replayed) and where its time went, from the server itself and without a profiler.
The log holds the whole visit: the server's warm-up request and every cell it served. Where the
server logged every decode step (`--decode-log-interval 1`), its largest burst is split into
the prefill phase and the decode tail after it (core.prefill_log.bursts): a faster prefill
step shortens that burst by about the prefill share times the step's change.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sglang_mixgraph.core.prefill_log import bursts, read_tail, step_summary

# SGLang prints its server arguments at start: `'decode_log_interval': N` (default 40).
_DECODE_INTERVAL = re.compile(r"'decode_log_interval': (\d+)")


def largest_burst(text: str) -> dict[str, Any] | None:
    """The burst with the most prefill tokens (the last of equals: a resumed run served its
    cell again), split into its phases; None unless the log says every decode step was logged
    (at a longer interval a decode line covers several)."""
    interval = _DECODE_INTERVAL.search(text)
    if interval is None or interval[1] != "1":
        return None
    found = max(reversed(bursts(text)), key=lambda b: b.prefill_tokens, default=None)
    if found is None or found.prefill_share is None:
        return None
    return {
        "prefill_tokens": found.prefill_tokens,
        "prefill_phase_s": found.prefill_phase_s,
        "decode_tail_s": found.tail_s,
        "prefill_share": found.prefill_share,
    }


def visit_steps(run_dir: Path, arm_names: list[str]) -> list[dict[str, Any]]:
    """One row per server log of the run, in the arms' order, then by visit (warm first)."""
    rows = []
    for path in sorted((run_dir / "servers").glob("*.log")):
        arm, _, visit = path.stem.rpartition("_")
        if arm not in arm_names:
            continue
        try:
            text = read_tail(path)
        except OSError:
            continue  # a log that went away: the visit's cells say what happened
        summary = step_summary(text) | {"largest_burst": largest_burst(text)}
        if summary["prefill_batches"]:  # a server that logs no SGLang prefill line: no row
            rows.append({"arm": arm, "visit": visit, "log": f"servers/{path.name}", **summary})

    def order(row: dict[str, Any]) -> tuple[int, int]:
        v = row["visit"]
        return arm_names.index(row["arm"]), -1 if v == "warm" else int(v) if v.isdigit() else 0

    return sorted(rows, key=order)
