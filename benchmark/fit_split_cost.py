#!/usr/bin/env python3
"""Fit the adaptive policy's cost model from in-server timings of the split.

Input: a results JSON of benchmark/mixed_split_inserver.py (upstream's ``forward`` with the patch
off and ``always``, per layer kind, context, decode rows D and prefill rows P), best run with
``--queue-ahead-ms`` so its times are GPU work only, as in a replayed step whose host launches run
ahead. Output: the per-ratio coefficients of ``sglang_mixgraph.core.split_cost_model`` fitted by
``split_cost_fit.fit_coefficients`` (non-negative, relative error), written as the package's
``data/split_cost_<arch>.json``, and each point's measured vs predicted times on stdout.

    python3 benchmark/fit_split_cost.py docs/results/mixed_split_inserver_fit_h200.json \\
        --arch sm90 --margin 0.03 --write python/sglang_mixgraph/data/split_cost_sm90.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path[:0] = [
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"),
    os.path.dirname(os.path.abspath(__file__)),
]

import split_cost_fit as fit  # noqa: E402

from sglang_mixgraph.core import split_cost_model as cm  # noqa: E402

RATIO_OF_LAYER = {"csa_c4_top1024": 4, "hca_c128": 128}


def samples_of(points):
    out = []
    for p in points:
        ratio = RATIO_OF_LAYER[p["layer"]]
        shape = cm.StepShape.uniform(ratio, p["context"], p["decode_rows"], p["prefill_rows"])
        out.append((shape, p["off_layer_ms"], p["always_layer_ms"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="mixed_split_inserver.py results JSON")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--margin", type=float, default=cm.KNOWN_ARCH_MARGIN)
    ap.add_argument("--write", metavar="PATH", help="where to write the coefficients JSON")
    args = ap.parse_args()
    with open(args.results) as f:
        data = json.load(f)
    env = data["environment"]
    samples = samples_of(data["points"])
    source = (
        f"benchmark/mixed_split_inserver.py on {env['gpu']}, {env['date']}, queue ahead "
        f"{env.get('queue_ahead_ms', 0)} ms, {len(samples)} points; fitted by "
        "benchmark/fit_split_cost.py"
    )
    coeffs = fit.fit_coefficients(samples, args.arch, margin=args.margin, source=source)
    print("ratio context D P | off ms (pred) | split ms (pred) | measured x | predicted x | splits")
    wrong = 0
    for p, (shape, off, split) in zip(data["points"], samples, strict=True):
        pu, ps = cm.predict(shape, coeffs)
        decided = cm.should_split(shape, coeffs)
        wrong += decided != (split < off)
        print(
            f"c{shape.ratio} {p['context']} {shape.num_decode} {shape.prefill_rows} | "
            f"{off:.3f} ({pu:.3f}) | {split:.3f} ({ps:.3f}) | {off / split:.2f} | "
            f"{pu / ps:.2f} | {'yes' if decided else 'no'}"
        )
    print(f"decisions that disagree with the measurement: {wrong} of {len(samples)}")
    if args.write:
        with open(args.write, "w") as f:
            json.dump(coeffs.to_json(), f, indent=1)
            f.write("\n")
        print("wrote", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
