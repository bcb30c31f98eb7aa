#!/usr/bin/env python3
"""Replay time of a GLM-5-shaped breakable CUDA graph, upstream vs ``drop_empty_segments``.

Issue 11, "Measure". Two captures, through upstream's ``BreakableCUDAGraphCapture``, of one stack
with the layer count of the embedded GLM-5 config: per layer RMSNorm + q_a projection, the DSA
indexer eager break, nothing (RoPE fused into attention: one empty segment), the bmm+attention
eager break, o_proj and one rank's expert GEMMs (gate/up + down) at ``--tokens`` rows. Upstream's
graph is captured and replayed by upstream's own code; the other is captured and replayed with
the patch installed through the plugin registry (``kits.install``), both captured by
``kits.bcg_capture`` as the GPU tests capture theirs. Replays alternate A B B A, each timed by
CUDA events from an idle GPU (the GPU waits for the host as in a server step).
Also: N back-to-back ``break_graph`` breaks (every segment empty), per-empty-segment launch cost.

    bash tools/gpu-upstream/device.sh python3 benchmark/empty_segments.py --out $OUT
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(_ROOT, "python", "sglang_mixgraph", "data", "glm5", "config.json")
DEV = "cuda"
# Written before any run (issue 11 asks for a prediction up front).
PREDICTION = (
    "an empty CUDA graph launch costs ~4 us of host time (torch replay + cudaGraphLaunch); "
    "78 of them are ~0.3 ms, ~0.8% of a ~35-40 ms step (20 TFLOP of GEMMs) if all on the critical path. With the GPU "
    "busy on GEMMs the host runs ahead, so expect less: 0-0.4% (ratio 0.996-1.000); the "
    "all-empty microbenchmark, host-bound, should show the full 3-6 us per empty segment."
)


class Glm5Stack:
    """The GLM-5-shaped layer stack; ``run`` is the forward the graphs capture."""

    def __init__(self, bcg, cfg: dict, layers: int, tokens: int):
        import torch

        hidden, q_lora, inter = cfg["hidden_size"], cfg["q_lora_rank"], cfg["moe_intermediate_size"]
        # Tensor parallel 8 (the preset's launch): o_proj reads 64/8 heads x v_head_dim = 2048
        # columns, q_lora_rank's width, so the stand-in attention maps q to o_proj's input.
        assert cfg["num_attention_heads"] // 8 * cfg["v_head_dim"] == q_lora, "not GLM-5's shape"
        g = torch.Generator(device=DEV).manual_seed(11)

        def w(n_in, n_out):  # 1/sqrt(fan-in): activations stay O(1) through 78 layers
            return torch.randn(n_in, n_out, device=DEV, dtype=torch.bfloat16, generator=g) / (
                n_in**0.5
            )

        self.hidden = hidden
        self.x = torch.zeros(tokens, hidden, device=DEV, dtype=torch.bfloat16)
        self.layers = [
            dict(
                q=w(hidden, q_lora),
                o=w(q_lora, hidden),
                gate_up=w(hidden, 2 * inter),
                down=w(inter, hidden),
            )
            for _ in range(layers)
        ]
        self.flops = 2 * tokens * layers * (2 * hidden * q_lora + 3 * hidden * inter)

        @bcg.eager_on_graph
        def indexer(q):
            return torch.topk(q.float(), 8, dim=-1).indices.to(torch.int32)

        @bcg.eager_on_graph
        def bmm_attention(q, topk):
            # Reads the indexer's output, as the sparse attention reads its top-k.
            picked = topk.float().mean(dim=-1, keepdim=True) / q.shape[-1]
            return (torch.softmax(q.float(), dim=-1) + picked).to(q.dtype)

        self.indexer, self.bmm_attention = indexer, bmm_attention

    def run(self):
        import torch.nn.functional as F

        h = self.x
        for p in self.layers:
            q = F.rms_norm(h, (self.hidden,)) @ p["q"]
            topk = self.indexer(q)
            # nothing here: the RoPE is fused into the attention kernel -> an empty segment
            h = h + self.bmm_attention(q, topk) @ p["o"]
            gate, up = (F.rms_norm(h, (self.hidden,)) @ p["gate_up"]).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ p["down"]
        return h


def time_arms(arms: dict, rounds: int, reps: int, warmup: int, deadline: float) -> dict:
    """Per arm, ``{"event_ms": [...], "host_ms": [...]}`` of single replays, arms alternating
    A B / B A per round; a round is not started past ``deadline`` (perf_counter seconds)."""
    import torch

    for replay in arms.values():
        for _ in range(warmup):
            replay()
    torch.cuda.synchronize()
    names = list(arms)
    out = {n: {"event_ms": [], "host_ms": []} for n in names}
    for r in range(rounds):
        if time.perf_counter() > deadline:
            break
        for name in names if r % 2 == 0 else names[::-1]:
            replay, samples = arms[name], out[name]
            for _ in range(reps):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                torch.cuda.synchronize()  # an idle GPU: the step waits for the host's launches
                t0 = time.perf_counter()
                start.record()
                replay()
                end.record()
                samples["host_ms"].append((time.perf_counter() - t0) * 1e3)
                end.synchronize()
                samples["event_ms"].append(start.elapsed_time(end))
    return out


def summary(samples: list) -> dict:
    return dict(
        median=statistics.median(samples), min=min(samples), max=max(samples), n=len(samples)
    )


def measure(args) -> dict:
    import torch
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
        breakable_cuda_graph as bcg,
    )

    from sglang_mixgraph import counters
    from sglang_mixgraph.kits.bcg_capture import capture
    from sglang_mixgraph.kits.install import installed
    from sglang_mixgraph.patches import drop_empty_segments as des

    deadline = time.perf_counter() + args.budget_s
    with open(CONFIG) as f:
        cfg = json.load(f)
    layers = args.layers or cfg["num_hidden_layers"]
    stack = Glm5Stack(bcg, cfg, layers, args.tokens)
    stack.x.copy_(
        torch.randn(stack.x.shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1))
    )

    def all_empty():
        for _ in range(layers):
            bcg.break_graph()

    # Upstream's replay as shipped: taken before the patch's hooks replace it on the class.
    upstream_replay = bcg.BreakableCUDAGraph.replay
    up_stack, up_out = capture(stack.run, None)
    up_empty, _ = capture(all_empty, None)
    counters.reset()
    with installed((des.PATCH,), {des.DROP_FLAG.name: "1"}) as (status,):
        assert status.enabled, status
        ours_stack, ours_out = capture(stack.run, None)
        ours_empty, _ = capture(all_empty, None)
        at_capture = counters.snapshot()["events"].get(des.PATCH_ID, {})
        upstream_replay(up_stack)
        ours_stack.replay()
        torch.cuda.synchronize()
        max_abs_diff = (up_out.float() - ours_out.float()).abs().max().item()
        micro = time_arms(
            {"upstream": lambda: upstream_replay(up_empty), "dropped": ours_empty.replay},
            args.rounds,
            args.micro_reps,
            args.warmup,
            deadline,
        )
        step = time_arms(
            {"upstream": lambda: upstream_replay(up_stack), "dropped": ours_stack.replay},
            args.rounds,
            args.reps,
            args.warmup,
            deadline,
        )
        after = counters.snapshot()
    return dict(
        layers=layers,
        tokens=args.tokens,
        segments=dict(
            stack=len(ours_stack._segments),
            stack_breaks=len(ours_stack._break_fns),
            all_empty=len(ours_empty._segments),
            all_empty_breaks=len(ours_empty._break_fns),
        ),
        tflop_per_step=stack.flops / 1e12,
        max_abs_diff=max_abs_diff,
        counters_at_capture=at_capture,
        counters=after["events"].get(des.PATCH_ID, {}),
        fallbacks=after["fallbacks"].get(des.PATCH_ID, {}),
        step=step,
        micro=micro,
    )


def environment(argv: list) -> dict:
    import sglang
    import torch
    import triton

    return dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton=triton.__version__,
        sglang=sglang.__version__,
        command=" ".join(["python3", *argv]),
    )


def report(res: dict) -> str:
    step, micro = res["step"], res["micro"]
    up, dr = (statistics.median(step[a]["event_ms"]) for a in ("upstream", "dropped"))
    m_up, m_dr = (statistics.median(micro[a]["event_ms"]) for a in ("upstream", "dropped"))
    h_up, h_dr = (statistics.median(micro[a]["host_ms"]) for a in ("upstream", "dropped"))
    empty_micro = res["segments"]["all_empty"]
    lines = [
        "# Empty breakable-graph segments on the H200: upstream vs `drop_empty_segments`",
        "",
        f"{res['env']['gpu']}, torch {res['env']['torch']}, triton {res['env']['triton']}, "
        f"sglang {res['env']['sglang']}, {res['env']['date']}. Command: `{res['env']['command']}`.",
        "",
        f"GLM-5-shaped stack: {res['layers']} layers x {res['tokens']} tokens, "
        f"{res['segments']['stack']} segments / {res['segments']['stack_breaks']} eager breaks, "
        f"{res['layers']} empty (one per layer), {res['tflop_per_step']:.1f} TFLOP of GEMMs per "
        f"step. Outputs of the two graphs: max abs diff {res['max_abs_diff']:.3g}.",
        "",
        "| measure | upstream | dropped | ratio (dropped / upstream) |",
        "|---|---|---|---|",
    ]
    for arm_name, key in (("replay, CUDA events", "event_ms"), ("replay, host enqueue", "host_ms")):
        a, b = summary(step["upstream"][key]), summary(step["dropped"][key])
        lines.append(
            f"| {arm_name} ms (median [min, max], n={a['n']}) | {a['median']:.3f} "
            f"[{a['min']:.3f}, {a['max']:.3f}] | {b['median']:.3f} [{b['min']:.3f}, {b['max']:.3f}] "
            f"| {b['median'] / a['median']:.4f} |"
        )
    lines += [
        "",
        "| per empty segment (upstream - dropped) / empty segments | us |",
        "|---|---|",
        f"| GLM-5-shaped stack, CUDA events ({res['layers']} empty) | "
        f"{(up - dr) * 1e3 / res['layers']:.2f} |",
        f"| all-empty ({empty_micro} empty, {res['segments']['all_empty_breaks']} "
        f"`break_graph`), CUDA events | {(m_up - m_dr) * 1e3 / empty_micro:.2f} |",
        f"| all-empty, host enqueue | {(h_up - h_dr) * 1e3 / empty_micro:.2f} |",
        "",
        "| `drop_empty_segments` counter | after the captures | after all replays |",
        "|---|---|---|",
        *(
            f"| {name} | {res['counters_at_capture'].get(name, 0)} | {n} |"
            for name, n in sorted(res["counters"].items())
        ),
        "",
        f"Fallbacks: {json.dumps(res['fallbacks']) if res['fallbacks'] else 'none'}.",
        "",
        f"Prediction (written before the run): {PREDICTION}",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for empty_segments_h200.{json,md}")
    parser.add_argument("--tokens", type=int, default=2048, help="rows per rank (default 2048)")
    parser.add_argument(
        "--layers", type=int, default=0, help="0: num_hidden_layers of the GLM-5 config"
    )
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (A B, then B A)")
    parser.add_argument("--reps", type=int, default=20, help="stack replays per arm per round")
    parser.add_argument(
        "--micro-reps", type=int, default=50, help="all-empty replays per arm per round"
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed replays per arm first")
    parser.add_argument("--budget-s", type=float, default=150.0, help="no new round after this")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("empty_segments: needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    res = measure(args)
    res["env"] = environment(sys.argv if argv is None else ["benchmark/empty_segments.py", *argv])
    res["env"]["seconds"] = round(time.perf_counter() - t0, 1)
    res["args"] = vars(args)
    res["prediction"] = PREDICTION
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "empty_segments_h200.json"), "w") as f:
        json.dump(res, f, indent=1)
    text = report(res)
    with open(os.path.join(args.out, "empty_segments_h200.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
