"""One arm of the rank-slice probe, in its own process: start ``sglang.Engine``, run a burst.

    slice_arm.py <arm_dir>

``<arm_dir>/arm.json`` holds ``{"engine": {...Engine kwargs}, "workload": {"requests", "input_len",
"output_len", "seed", "vocab", "shared_prefix"}}``. All requests are sent at once (greedy, EOS
ignored) as token ids; the prompts are random ids from the seed, so every arm serves the same
prompts. Their first ``shared_prefix`` ids are common to all (the radix cache, when on, serves
them after the first request: long contexts at a short prompt's prefill cost); the rest miss. Writes ``<arm_dir>/result.json``: start-up seconds, burst seconds,
output tokens and the output ids per request (for token equality between arms).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback


def prompts(workload: dict) -> list:
    rng = random.Random(workload["seed"])
    vocab = workload["vocab"]
    shared = workload.get("shared_prefix", 0)
    prefix = [rng.randrange(100, vocab - 100) for _ in range(shared)]
    return [
        prefix + [rng.randrange(100, vocab - 100) for _ in range(workload["input_len"] - shared)]
        for _ in range(workload["requests"])
    ]


def run(arm: dict) -> dict:
    import sglang as sgl

    res: dict = {}
    t0 = time.time()
    engine = sgl.Engine(**arm["engine"])
    res["engine_start_s"] = round(time.time() - t0, 1)
    wl = arm["workload"]
    params = {"temperature": 0.0, "max_new_tokens": wl["output_len"], "ignore_eos": True}
    t1 = time.time()
    outs = engine.generate(input_ids=prompts(wl), sampling_params=params)
    res["burst_s"] = round(time.time() - t1, 2)
    res["outputs"] = [list(o["output_ids"]) for o in outs]
    res["output_tokens"] = sum(len(o) for o in res["outputs"])
    # The counters' last line comes one logging interval after the last count.
    time.sleep(3 * float(os.environ.get("SGLANG_MIXGRAPH_COUNTERS_LOG_INTERVAL") or 0))
    res["ok"] = True
    try:
        engine.shutdown()
    except Exception as e:  # noqa: BLE001 -- the tokens are in; report, do not fail
        res["shutdown_error"] = f"{type(e).__name__}: {e}"
    return res


def main() -> None:
    d = sys.argv[1]
    try:
        with open(os.path.join(d, "arm.json")) as f:
            res = run(json.load(f))
    except BaseException as e:  # noqa: BLE001 -- every failure is data for the driver
        res = {
            "ok": False,
            "error": f"{type(e).__name__}: {e}"[:3000],
            "traceback": traceback.format_exc()[-6000:],
        }
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # Engine threads and children must not keep the arm alive


if __name__ == "__main__":
    main()
