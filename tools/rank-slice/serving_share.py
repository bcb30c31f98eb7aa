"""How much of a served burst a prefill-step speedup can shorten, read from an `ab` run's logs.

A replay shortens the prefill (MIXED) steps; the decode-only steps after the last prefill are
graph replays in every arm and stay. In each visit's server log (SGLang's prefill batch lines,
core.prefill_log, and its decode batch lines at `--decode-log-interval 1`) a burst is the
stretch from a prefill batch that starts from idle to the next one (core.prefill_log.bursts):
its prefill phase, and the decode-only steps after its last prefill batch. Then, per baseline
visit and block:
  predicted change of the time per output token = share x step change,
share = prefill phase / (prefill phase + decode tail), step change = the other arm's median
back-to-back MIXED gap over this visit's, minus 1; measured = the visit's output tok/s over the
other arm's mean in the block, minus 1. Usage:
  python3 tools/rank-slice/serving_share.py RUN_DIR --baseline upstream --arm bcg-auto-lean
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean, median

from sglang_mixgraph.core import prefill_log


def visit(log: Path, replayed: bool, min_tokens: int) -> dict:
    """The last burst of a visit's log with a load cell's prefill tokens (a resumed run's log
    holds the superseded cell's burst before it): its phases and step median."""
    loads = [b for b in prefill_log.bursts(log.read_text()) if b.prefill_tokens >= min_tokens]
    if not loads:
        raise SystemExit(f"{log}: no burst of {min_tokens} prefill tokens")
    burst = loads[-1]
    gaps = prefill_log.back_to_back_gaps(burst.prefills, replayed=replayed)
    return {
        "prefill_s": burst.prefill_phase_s,
        "tail_s": burst.tail_s,
        "share": burst.prefill_share,
        "step_ms": median(gaps),
        "mixed": sum(b.mixed for b in burst.prefills),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--baseline", default="upstream")
    ap.add_argument("--arm", required=True, help="the arm whose prefill steps are faster")
    ap.add_argument("--min-tokens", type=int, default=100_000, help="a load cell's prefill tokens")
    args = ap.parse_args()
    results = json.loads((args.run_dir / "results.json").read_text())
    rows = []
    for cell in results["cells"]:
        # The token check's cells (kind "tokens") share the visit but time nothing.
        if cell.get("kind", "bench") != "bench" or cell["status"] != "ok":
            continue
        if cell["arm"] not in (args.baseline, args.arm):
            continue
        log = args.run_dir / "servers" / f"{cell['arm']}_{cell['repeat'] + 1}.log"
        row = visit(log, cell["arm"] != args.baseline, args.min_tokens)
        row.update(
            arm=cell["arm"],
            repeat=cell["repeat"],
            block=cell["block"],
            tok_s=cell["metrics"]["output_throughput"],
        )
        rows.append(row)
    for r in rows:
        print(
            f"{r['arm']:>16} visit {r['repeat'] + 1} block {r['block'] + 1}: {r['tok_s']:.1f} "
            f"tok/s; prefill phase {r['prefill_s']:.2f} s ({r['mixed']} MIXED), decode tail "
            f"{r['tail_s']:.2f} s, share {r['share']:.3f}; MIXED {r['step_ms']:.1f} ms apart"
        )
    for block in sorted({r["block"] for r in rows}):
        other = [r for r in rows if r["block"] == block and r["arm"] == args.arm]
        for base in (r for r in rows if r["block"] == block and r["arm"] == args.baseline):
            if not other:
                continue
            step = mean(r["step_ms"] for r in other) / base["step_ms"] - 1
            predicted = base["share"] * step
            measured = base["tok_s"] / mean(r["tok_s"] for r in other) - 1
            print(
                f"block {block + 1}, {args.baseline} visit {base['repeat'] + 1}: step "
                f"{step:+.1%} x share {base['share']:.3f} = {predicted:+.1%} of the time per "
                f"output token; measured {measured:+.1%} ({(predicted - measured) * 100:+.1f} points)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
