#!/usr/bin/env python3
"""One replayed mixed step of DeepSeek-V4-Pro's attention stack, upstream vs the mixed split.

The reference per-rank steady state: 256 decode requests at a context of 8k (or 32k) plus one
2560-token prefill chunk, 2816 rows in a 2816-token breakable prefill graph bucket. The graph is
captured with upstream's ``BreakableCUDAGraph`` and replayed through upstream's backend
(``prepare_forward_metadata_for_breakable_cuda_graph_replay``, then the model's
``bcg_deepseek_v4_attention_with_output`` as the eager break of each layer), for the 61 layers
of DSV4-Pro in the model's order (compress ratios from its config.json: 2 SWA-only, 30 c4, 29
c128), h_q 128. Between two breaks a captured GEMM stands in for the layer's other work so that,
as in the server, the host launches each break ahead of the GPU. Arms: ``off`` (upstream),
``adaptive`` and ``always`` (the patch installed by the plugin registry), interleaved.
Whole step = prepare (the runner's metadata refresh, with the patch its plan and chunk cache)
plus replay, per step, the same work in every arm (upstream builds its chunk cache inside the
replay, the patch at prepare); each arm's first steps after it is entered are untimed. The host
time of the plan's parts (decision, decode-tail inputs, chunk cache) inside each step's prepare
and replay is recorded beside it (``kits.host_timers`` around the server's own functions), per
step and as medians: ``benchmark/fit_split_cost.py --step`` fits the cost model's step terms
(chunk-cache build, the plan, the decision) from them.
Attention time = step replay minus the replay of the same graph without the breaks (the per-layer
q copy is in both graphs). KV caches:
``--physical-layers N`` (the model's first N layers; 8 at 8k, 6 fit at 32k); layer i >= N reuses
the one of its ratio N - 2 layers back, so no layer finds its neighbour's cache in L2.

    bash tools/gpu-upstream/device.sh python3 benchmark/mixed_steady_state.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from types import SimpleNamespace

import mixed_split_inserver as ins  # the DSV4 deployment and batches (benchmark/, beside this)
import torch

from sglang_mixgraph.kits import dsv4_gpu  # the breakable-graph replay contexts of the GPU tests
from sglang_mixgraph.kits.host_timers import (
    SPLIT_PLAN_PARTS,
    call_timers,
    part_medians,
    split_plan_targets,
)

DEV = "cuda"
DECODE, PREFILL, BUCKET = 256, 2560, 2816
WARMUP = 2  # untimed steps each time an arm is entered (its patch just installed)
FILLER = (7168, 8192)  # the stand-in GEMM per layer: (BUCKET x 7168) @ (7168 x 8192), bf16


def physical_layer(i: int, physical: int) -> int:
    # The pattern alternates c4, c128 from layer 2 on; an even period keeps each layer's ratio.
    return i if i < physical else 2 + (i - 2) % (physical - 2)


class Step:
    """The captured bucket: a static EXTEND batch of BUCKET tokens and the layer stack."""

    def __init__(self, dep, ratios, with_breaks: bool, physical: int):
        self.dep, self.ratios, self.with_breaks = dep, ratios, with_breaks
        self.physical = physical
        g = torch.Generator(device=DEV).manual_seed(3)
        self.q = torch.zeros(BUCKET, ins.HEADS, 512, dtype=torch.bfloat16, device=DEV)
        self.sink = torch.randn(ins.HEADS, generator=g, device=DEV)
        self.x = torch.randn(BUCKET, FILLER[0], generator=g, device=DEV).to(torch.bfloat16)
        self.w = (torch.randn(FILLER[0], FILLER[1], generator=g, device=DEV) * 0.01).to(
            torch.bfloat16
        )
        self.layer_objs = [
            SimpleNamespace(layer_id=i, v_head_dim=512, tp_q_head_num=ins.HEADS)
            for i in range(physical)
        ]
        self.out = None
        self.graph = None
        self.metadata = None

    def contexts(self, static_fb):
        return dsv4_gpu.bcg_replay_contexts(self.dep.backend, static_fb, self.layer_objs)

    def body(self):
        from sglang.srt.models.deepseek_v4 import bcg_deepseek_v4_attention_with_output

        o = torch.empty_like(self.q)
        for i, ratio in enumerate(self.ratios):
            torch.mm(self.x, self.w)  # the layer's other work, captured
            # A fresh q per layer, in the filler graph too: the copy is not attention.
            q = self.q * 1.0
            if self.with_breaks:
                bcg_deepseek_v4_attention_with_output(
                    q, q, o, physical_layer(i, self.physical), ratio, self.sink, False
                )
        self.out = o + 0.0

    def capture(self, live, static_fb):
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
            BreakableCUDAGraph,
            BreakableCUDAGraphCapture,
        )

        backend = self.dep.backend
        with self.contexts(static_fb):
            self.metadata = backend.init_forward_metadata_for_breakable_cuda_graph_capture(
                static_fb
            )
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.body()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = BreakableCUDAGraph()
            with BreakableCUDAGraphCapture(
                self.graph, pool=torch.cuda.graph_pool_handle(), stream=stream
            ):
                self.body()
        torch.cuda.synchronize()

    def replay(self, live, static_fb, row_req, positions, q_live):
        """(prepare ms, replay ms, parts): prepare = the runner's metadata refresh (and the
        patch's plan and chunk caches), host wall time with a sync; replay = CUDA events around
        the graph; parts = the host ms of the server's functions named in ``SPLIT_PLAN_PARTS``
        within the prepare and within the replay (upstream builds its chunk cache in the first
        break)."""
        backend = self.dep.backend
        with self.contexts(static_fb):
            torch.cuda.synchronize()
            with call_timers(split_plan_targets(backend)) as in_prepare:
                t0 = time.perf_counter()
                backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(
                    self.metadata, live, static_forward_batch=static_fb
                )
                torch.cuda.synchronize()
                prep = (time.perf_counter() - t0) * 1e3
            ins.write_c4_topk(self.dep, self.metadata.core_attn_metadata, row_req, positions)
            self.q[: q_live.shape[0]].copy_(q_live)
            self.q[q_live.shape[0] :].zero_()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with call_timers(split_plan_targets(backend)) as in_replay:
                a.record()
                self.graph.replay()
                b.record()
                torch.cuda.synchronize()
        return prep, a.elapsed_time(b), {"prepare": dict(in_prepare), "replay": dict(in_replay)}


def static_batch(live, context):
    from sglang_mixgraph.kits import dsv4_cpu as kit

    static = kit.replay_static_batch(live, BUCKET)
    static.max_seq_len_override = context  # the capture's context width (the pool's)
    return static


def run_context(context, ratios, arms, reps, rounds, kit, physical):
    from sglang_mixgraph.core import split_cost_model as cm

    dep = ins.Deployment(context, DECODE, ratios=ratios[:physical])
    # The pool holds `physical` layers that the 61 layer calls reuse.
    ins.decide_for_model(dep, ratios)
    live, row_req, positions = ins.make_batch(dep, DECODE, PREFILL)
    static_fb = static_batch(live, dep.pages_per_req * ins.PAGE)
    g = torch.Generator(device=DEV).manual_seed(4)
    q_live = (torch.randn(positions.numel(), ins.HEADS, 512, generator=g, device=DEV) * 0.5).to(
        torch.bfloat16
    )
    steps = {}
    for with_breaks in (True, False):
        steps[with_breaks] = Step(dep, ratios, with_breaks, physical)
        steps[with_breaks].capture(live, static_fb)
    filler = []
    samples = {arm: {"prepare": [], "replay": [], "parts": []} for arm in arms}
    outs = {}
    for rnd in range(rounds):
        for arm in arms if rnd % 2 == 0 else arms[::-1]:
            with kit.patch_installed(flag_on=arm != "off", policy=None if arm == "off" else arm):
                for i in range(WARMUP + reps):  # each arm's first steps untimed
                    live, row_req, positions = ins.make_batch(dep, DECODE, PREFILL)
                    static_fb = static_batch(live, dep.pages_per_req * ins.PAGE)
                    prep, rep, parts = steps[True].replay(
                        live, static_fb, row_req, positions, q_live
                    )
                    if i >= WARMUP:
                        samples[arm]["prepare"].append(prep)
                        samples[arm]["replay"].append(rep)
                        samples[arm]["parts"].append(parts)
                outs[arm] = steps[True].out[: positions.numel()].float().clone()
        for _ in range(reps):
            live, row_req, positions = ins.make_batch(dep, DECODE, PREFILL)
            filler.append(
                steps[False].replay(
                    live,
                    static_batch(live, dep.pages_per_req * ins.PAGE),
                    row_req,
                    positions,
                    q_live,
                )[1]
            )
    filler_ms = statistics.median(filler)
    seqs, exts = cm.uniform_step_lists(context, DECODE, PREFILL)
    coeffs = cm.load_coefficients("sm90")
    # What adaptive decides: the whole step (every layer split, or none), as the plan asks it.
    step_split = cm.decide_step(
        cm.StepCounts.from_lists(seqs, exts, DECODE), cm.layer_mix(ratios), coeffs
    )
    # Each layer kind alone, for reference (the per-layer answer of the in-server sweeps).
    decisions = {
        r: cm.should_split(cm.StepShape.from_lists(r, seqs, exts, DECODE), coeffs)
        for r in (0, 4, 128)
    }
    rec = dict(
        context=context,
        physical_kv_layers=physical,
        decode_rows=DECODE,
        prefill_rows=PREFILL,
        bucket=BUCKET,
        filler_replay_ms=filler_ms,
        adaptive_splits=decisions,
        adaptive_splits_step=step_split,
    )
    for arm in arms:
        rep = statistics.median(samples[arm]["replay"])
        # The whole step: upstream builds its chunk cache inside the replay (the first layer's
        # break), the patch at prepare; only their sum is the same work in every arm.
        steps_ms = [
            a + b for a, b in zip(samples[arm]["prepare"], samples[arm]["replay"], strict=True)
        ]
        rec[arm] = dict(
            replay_ms=rep,
            attention_ms=rep - filler_ms,
            prepare_ms=statistics.median(samples[arm]["prepare"]),
            host_parts_ms=part_medians(samples[arm]["parts"]),
            # Every step's parts: benchmark/fit_split_cost.py --step fits the cost model's step
            # terms from these (kits.cost_fit.fit_step_terms), per step rather than per median.
            host_parts_samples=[
                {ph: {k: round(v, 4) for k, v in d.items()} for ph, d in parts.items()}
                for parts in samples[arm]["parts"]
            ],
            step_ms=statistics.median(steps_ms),
            replay_samples=samples[arm]["replay"],
            prepare_samples=samples[arm]["prepare"],
        )
        if arm != "off":
            rec[arm]["max_abs_diff_vs_off"] = float((outs[arm] - outs["off"]).abs().max())
    del steps, dep
    torch.cuda.empty_cache()
    return rec


def write_report(data, path):
    env = data["environment"]
    lines = [
        "# Mixed steady state under a breakable prefill graph (H200)",
        "",
        f"Date {env['date']}, {env['gpu']}, torch {env['torch']}, sglang {env.get('sglang')}, "
        f"Triton {env.get('triton')}. Command: `{env['command']}`.",
        "",
        "| context | arm | whole step ms (prepare + replay) | vs off | prepare ms | "
        "replay ms | attention ms | vs off | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["points"]:
        off = r["off"]
        for arm in env["arms"]:
            a = r[arm]
            lines.append(
                f"| {r['context']} | {arm} | {a['step_ms']:.2f} | "
                f"{off['step_ms'] / a['step_ms']:.3f}x | {a['prepare_ms']:.2f} | "
                f"{a['replay_ms']:.2f} | {a['attention_ms']:.2f} | "
                f"{off['attention_ms'] / a['attention_ms']:.3f}x | "
                f"{a.get('max_abs_diff_vs_off', 0.0):.3g} |"
            )
    lines += [
        "",
        "Host ms per step in the server's own functions (medians; no sync inside, so GPU work a "
        "part launches is not in it; `plan` includes the three after it when the patch builds "
        "them at prepare; upstream builds its chunk cache in the replay's first break):",
        "",
        "| context | arm | "
        + " | ".join(f"prepare: {p}" for p in SPLIT_PLAN_PARTS)
        + " | replay: chunk_cache |",
        "|---|---|" + "---|" * (len(SPLIT_PLAN_PARTS) + 1),
    ]
    for r in data["points"]:
        for arm in env["arms"]:
            parts = r[arm].get("host_parts_ms")
            if parts:
                cells = [f"{parts['prepare'][p]:.3f}" for p in SPLIT_PLAN_PARTS]
                cells.append(f"{parts['replay']['chunk_cache']:.3f}")
                lines.append(f"| {r['context']} | {arm} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Filler-only replay (the captured GEMMs, no attention): "
        + ", ".join(f"{r['context']}: {r['filler_replay_ms']:.2f} ms" for r in data["points"]),
        "",
        "Adaptive's decision of the step from the cost model (per layer kind alone in "
        "brackets): "
        + "; ".join(
            f"{r['context']}: {r.get('adaptive_splits_step', '-')} ({r['adaptive_splits']})"
            for r in data["points"]
        ),
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(data, path) -> bool:
    """Whole-step ms per arm and context (bars); False when matplotlib is missing."""
    try:
        # The Figure API, not pyplot: pyplot's first figure probes IPython, a stub on the GPU kit.
        from matplotlib.figure import Figure
    except ImportError:
        return False
    arms = data["environment"]["arms"]
    points = data["points"]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        xs = [i + k * width for i in range(len(points))]
        ys = [p[arm]["step_ms"] for p in points]
        ax.bar(xs, ys, width, label=arm)
        for x, y, p in zip(xs, ys, points, strict=True):
            ax.text(x, y, f"{p['off']['step_ms'] / y:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + width * (len(arms) - 1) / 2 for i in range(len(points))])
    ax.set_xticklabels(
        [f"{p['context'] // 1024}k, {p['physical_kv_layers']} KV layers" for p in points]
    )
    ax.set_ylabel("ms per whole step: prepare + replay (61 layers)")
    ax.set_title("DSV4-Pro mixed step, 256 decode + 2560 prefill rows, H200")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--arms", nargs="+", default=["off", "adaptive", "always"])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="mixed_steady_state_h200")
    ap.add_argument(
        "--physical-layers",
        type=int,
        default=8,
        help="KV layers allocated (even, >= 4); the model's layers cycle through them",
    )
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="only write one page from runs")
    args = ap.parse_args()
    if args.merge:
        runs = [json.load(open(p)) for p in args.merge]
        data = dict(
            environment=runs[0]["environment"], points=[x for r in runs for x in r["points"]]
        )
        data["environment"]["command"] = " ; ".join(r["environment"]["command"] for r in runs)
        with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
            json.dump(data, f, indent=1)
        write_report(data, os.path.join(args.out, f"{args.name}.md"))
        write_plot(data, os.path.join(args.out, f"{args.name}.png"))
        return
    from sglang_mixgraph.kits import dsv4_cpu as kit

    ratios = ins.model_ratios()
    points = []
    with kit.sglang_context(device=DEV):
        for c in args.contexts:
            rec = run_context(
                c, ratios, args.arms, args.reps, args.rounds, kit, args.physical_layers
            )
            print(json.dumps({k: v for k, v in rec.items()}, default=str)[:2000], flush=True)
            points.append(rec)
    env = ins.environment(
        arms=args.arms,
        reps=args.reps,
        rounds=args.rounds,
        layers={r: ratios.count(r) for r in sorted(set(ratios))},
    )
    data = dict(environment=env, points=points)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    write_report(data, os.path.join(args.out, f"{args.name}.md"))
    write_plot(data, os.path.join(args.out, f"{args.name}.png"))
    print("wrote", os.path.join(args.out, args.name + ".{json,md}"))


if __name__ == "__main__":
    main()
