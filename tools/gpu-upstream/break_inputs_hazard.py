"""Break-input lifetime on the GPU: every scenario of kits.break_input_hazard under each mode,
several seeds, each case in its own process; a table on stdout and the cases as JSON.

    bash tools/gpu-upstream/device.sh python3 tools/gpu-upstream/break_inputs_hazard.py \\
        --seeds 3 --out $OUT/break_inputs.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sglang_mixgraph.kits.break_input_hazard import MODES, SCENARIOS, run_isolated


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    cases = []
    print(
        f"{'scenario':10} {'mode':5} {'seed':>4} {'replays':>7} {'wrong':>5} {'worst':>10} "
        f"{'pool MiB':>9} {'held':>5}  fault"
    )
    for scenario in a.scenarios:
        for mode in a.modes:
            for seed in range(a.seeds):
                t0 = time.time()
                c = run_isolated(scenario, mode, a.rounds, seed)
                c["seconds"] = round(time.time() - t0, 1)
                cases.append(c)
                worst = c.get("worst_abs_err", c.get("worst_rel_l2", float("nan")))
                held = c.get("patch_counters", {}).get("inputs_held", 0)
                print(
                    f"{scenario:10} {mode:5} {seed:>4} {c.get('replays', 0):>7} "
                    f"{c.get('wrong', '-'):>5} {worst:>10.3g} "
                    f"{c.get('capture_reserved_mib', float('nan')):>9.1f} {held:>5}  "
                    f"{c.get('fault', '')}",
                    flush=True,
                )
    with open(a.out, "w") as f:
        json.dump({"cases": cases}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
