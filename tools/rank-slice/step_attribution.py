"""Where a replayed MIXED step's GPU time goes against the same step run eagerly: the probe's
profiled-step traces of two arms (``run_slice_probe.py`` returns them as ``traces.tar``, one
``ARM/trace_<pid>_<k>.json.xz`` per arm and profiled step), paired kernel by kernel
(``sglang_mixgraph.core.step_attribution``). Runs anywhere (no GPU, no sglang):

    python3 tools/rank-slice/step_attribution.py traces.tar --eager upstream --replay bcg-auto \\
        --step 185 --json attribution.json
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import tarfile

from sglang_mixgraph.core.step_attribution import attribute


def trace_of(tar: tarfile.TarFile, arm: str, step: str) -> list:
    names = [
        n
        for n in tar.getnames()
        if n.startswith(f"{arm}/") and n.endswith(f"_{step}.json.xz") and "/trace_" in n
    ]
    if len(names) != 1:
        raise SystemExit(f"step_attribution: {len(names)} traces of step {step} for arm {arm!r}")
    with tar.extractfile(names[0]) as f:
        doc = json.loads(lzma.decompress(f.read()))
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _size(n: int | None) -> str:
    return f" {n / 1e9:.2f} GB" if n else ""


def lines(a: dict) -> list[str]:
    out = [
        f"kernels: eager {a['eager_ms']:.1f} ms, replayed {a['replay_ms']:.1f} ms, "
        f"difference {a['delta_ms']:+.1f} ms ({a['ops']['eager']} eager ops, "
        f"{a['ops']['replay']} replayed, {a['kinds']} kinds)",
        f"GPU busy (overlapping ops counted once): eager {a['busy_ms']['eager']:.1f} ms, "
        f"replayed {a['busy_ms']['replay']:.1f} ms, difference {a['busy_ms']['delta']:+.1f} ms",
        f"GPU idle inside the step: eager {a['idle_ms']['eager']:.1f} ms, replayed "
        f"{a['idle_ms']['replay']:.1f} ms (waiting for: "
        + ", ".join(f"{p} {ms:.1f}" for p, ms in a["idle_ms"]["replay_waiting_for"].items())
        + ")",
        "replayed ops by place: "
        + ", ".join(f"{p} {ms:.1f} ms" for p, ms in a["replay_by_place"].items()),
        "by class (eager -> replayed ms): "
        + ", ".join(
            f"{c} {r['eager_ms']:.1f}->{r['replay_ms']:.1f} ({r['delta_ms']:+.2f})"
            for c, r in a["by_class"].items()
        ),
        "largest differences by kind (eager count ms -> replayed count ms, where it ran):",
    ]
    for r in a["by_kind"]:
        e, p = r["eager"], r["replay"]
        out.append(
            f"  {r['delta_ms']:+8.3f}  x{e['count']:<4} {e['ms']:8.3f}{_size(e['bytes'])} -> "
            f"x{p['count']:<4} {p['ms']:8.3f}{_size(p['bytes'])} {p['places']}  "
            f"[{r['class']}] {r['kind'][:80]}"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", help="traces.tar from run_slice_probe.py")
    ap.add_argument("--eager", default="upstream", help="the arm whose step ran eagerly")
    ap.add_argument("--replay", default="bcg-auto", help="the arm whose step replayed")
    ap.add_argument("--step", default="185", help="the profiled MIXED step's ordinal")
    ap.add_argument("--json", help="write the whole attribution here")
    args = ap.parse_args()
    try:
        with tarfile.open(args.traces) as tar:
            eager = trace_of(tar, args.eager, args.step)
            replay = trace_of(tar, args.replay, args.step)
    except (OSError, tarfile.TarError, ValueError) as e:
        print(f"step_attribution: {args.traces}: {e}", file=sys.stderr)
        return 2
    a = attribute(eager, replay)
    print("\n".join(lines(a)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(a, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
