"""What each launched visit's server logged of its prefill steps, for the report.

Every visit `ab` launches writes its server's log to `servers/<arm>_<n>.log` (n: the repeat,
or `warm`). SGLang logs each prefill step, MIXED ones included, with whether it replayed a
prefill graph and the time since the previous one (core.prefill_log). Per visit: how many
prefill steps, how many replayed, how many MIXED, and the median time between back-to-back
MIXED steps, eager and replayed. So the report shows that an arm did what it claims (its
MIXED steps replayed) and where its time went, from the server itself and without a profiler.
The log holds the whole visit: the server's warm-up request and every cell it served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglang_mixgraph.core.prefill_log import read_tail, step_summary


def visit_steps(run_dir: Path, arm_names: list[str]) -> list[dict[str, Any]]:
    """One row per server log of the run, in the arms' order, then by visit (warm first)."""
    rows = []
    for path in sorted((run_dir / "servers").glob("*.log")):
        arm, _, visit = path.stem.rpartition("_")
        if arm not in arm_names:
            continue
        try:
            summary = step_summary(read_tail(path))
        except OSError:
            continue  # a log that went away: the visit's cells say what happened
        if summary["prefill_batches"]:  # a server that logs no SGLang prefill line: no row
            rows.append({"arm": arm, "visit": visit, "log": f"servers/{path.name}", **summary})

    def order(row: dict[str, Any]) -> tuple[int, int]:
        v = row["visit"]
        return arm_names.index(row["arm"]), -1 if v == "warm" else int(v) if v.isdigit() else 0

    return sorted(rows, key=order)
