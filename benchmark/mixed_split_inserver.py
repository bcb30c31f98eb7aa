#!/usr/bin/env python3
"""In-server timing of the mixed split: one DSV4-Pro layer through upstream's own
``DeepseekV4AttnBackend.forward``, with the plugin's ``mixed_split`` hooks off and on.

Unlike benchmark/mixed_split_kernel.py (our re-assembly of the kernels, with a copy-in join),
this times the code the server runs: upstream's backend built by its real ``__init__``, its real
metadata builder, its sparse-prefill chunk cache and Triton dequant, FlashMLA, and, with the
patch on, the patch's hooks as installed by the plugin registry. Needs sglang 0.5.23 importable
(a full install, or tools/gpu-upstream/device.sh on a bare torch GPU machine) and a CUDA GPU.

Points: a CSA layer (c4, top-1024) and an HCA layer (c128), h_q 128, SWA 128; one prefill
request of P rows at context C plus D decode requests at context C (the kernel benchmark's
``uniform_step_lists``); P = 0 is a decode batch relabelled to a 1-token EXTEND (DP attention).
Per point: the layer's forward (chunk cache already built, as for every layer after the first;
the workspace's compressed part dequantized anew, as for a layer with its own cache),
CUDA-event time after an L2 flush (the GPU waits for the host too: launches are not queued
ahead), wall time with a synchronize, and host time of the call; medians over ``--reps`` calls
and ``--rounds`` rounds with the arms (off, always, adaptive) interleaved; ``adaptive`` decides
each step for DSV4-Pro's 61 layers, as a server does. Also the step set-up (metadata build, plus
the patch's plan and prefill-only chunk cache when on).

    bash tools/gpu-upstream/device.sh python3 benchmark/mixed_split_inserver.py --out $OUT
    python3 benchmark/mixed_split_inserver.py --out docs/results --report-only docs/results/mixed_split_inserver_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from sglang_mixgraph.core import split_cost_model as cm
from sglang_mixgraph.kits import dsv4_cpu, dsv4_gpu
from sglang_mixgraph.reference import v4_kv_layout as kvl
from sglang_mixgraph.upstream_attrs import BACKEND_SPLIT_LAYERS

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEV = "cuda"
PAGE = 256
HEADS = 128
TOPK = 1024
RATIOS = (4, 128)  # layer 0: CSA, layer 1: HCA
LAYER_NAMES = {4: "csa_c4_top1024", 128: "hca_c128"}
SEED_PAGES = 64  # pages encoded with random keys; the rest of each pool repeats them
SLEEP_CYCLES_PER_MS = 1.98e6  # torch.cuda._sleep spins clock cycles; H200 boost clock 1.98 GHz


def model_ratios() -> list:
    """DSV4-Pro's compress ratio per layer, from the config.json the package ships."""
    with open(
        os.path.join(_ROOT, "python", "sglang_mixgraph", "data", "dsv4_pro", "config.json")
    ) as f:
        cfg = json.load(f)
    return list(cfg["compress_ratios"][: cfg["num_hidden_layers"]])


def decide_for_model(dep, ratios) -> None:
    """Make ``adaptive`` decide for the layers of ``ratios`` (a served model's), not for the few
    the benchmark's pool holds: the plan counts its pool's layers once per pool
    (``mixed_split.plan.layer_mix``) and keeps the count on the backend."""
    setattr(dep.backend, BACKEND_SPLIT_LAYERS, (dep.backend.token_to_kv_pool, cm.layer_mix(ratios)))


class Deployment:
    """A DSV4 KV pool holding 1 + max(D) requests at one context, and upstream's backend."""

    def __init__(self, context: int, max_decode: int, ratios=RATIOS, max_prefill: int = 0):
        from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend

        self.context = context
        self.num_reqs = 1 + max_decode
        # A prefill chunk longer than the context ends at its own length (uniform_step_lists).
        self.pages_per_req = -(-max(context, max_prefill) // PAGE)
        num_pages = self.num_reqs * self.pages_per_req + 1  # page 0 stays unused
        size = num_pages * PAGE
        self.pool = dsv4_cpu.kv_pool(max_reqs=self.num_reqs, size=size, ratios=ratios, device=DEV)
        g = torch.Generator(device=DEV).manual_seed(0)
        perm = torch.randperm(num_pages - 1, generator=g, device=DEV) + 1
        self.pages = perm[: self.num_reqs * self.pages_per_req].view(
            self.num_reqs, self.pages_per_req
        )
        pos = torch.arange(self.pages_per_req * PAGE, device=DEV)
        self.req_to_token = (self.pages[:, pos // PAGE] * PAGE + pos % PAGE).to(torch.int32)
        for layer, ratio in enumerate(ratios):
            self._fill(self.pool.get_swa_key_buffer_radix(layer), PAGE, g)
            if ratio:  # SWA-only layers have no compressed cache
                self._fill(
                    self.pool.get_extra_key_buffer(layer),
                    self.pool.get_extra_key_page_size(layer),
                    g,
                )
        runner = dsv4_gpu.model_runner(
            self.pool,
            self.req_to_token,
            num_reqs=self.num_reqs,
            context_len=self.pages_per_req * PAGE,
            topk=TOPK,
            heads=HEADS,
        )
        self.backend = DeepseekV4AttnBackend(runner)
        torch.cuda.synchronize()

    @staticmethod
    def _fill(buf, page_size: int, g) -> None:
        """Random keys in the first SEED_PAGES pages, repeated page by page over the pool."""
        n = min(SEED_PAGES, buf.shape[0])
        slots = torch.arange(n * page_size, device=DEV)
        keys = torch.randn(slots.numel(), 512, generator=g, device=DEV) * 0.5
        kvl.encode_tokens(buf.view(torch.uint8), page_size, slots, keys)
        for start in range(n, buf.shape[0], n):
            m = min(n, buf.shape[0] - start)
            buf[start : start + m].copy_(buf[:m])

    def compressed_slots(self, req: torch.Tensor, k: torch.Tensor, ratio: int) -> torch.Tensor:
        per_page = PAGE // ratio
        return self.pages[req, k // per_page] * per_page + k % per_page


def make_batch(dep: Deployment, d: int, p: int):
    """The step's ForwardBatch, the live rows' request ids and positions."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    from sglang_mixgraph.patches import mixed_split as ms

    seqs, exts = cm.uniform_step_lists(dep.context, d, p)
    reqs = list(range(len(seqs))) if p else list(range(1, d + 1))
    row_req = torch.cat(
        [torch.full((e,), r, dtype=torch.int64) for r, e in zip(reqs, exts, strict=False)]
    )
    positions = torch.cat([torch.arange(s - e, s) for s, e in zip(seqs, exts, strict=False)])
    row_req, positions = row_req.to(DEV), positions.to(DEV)
    ext = torch.tensor(exts, dtype=torch.int32, device=DEV)
    prefix = [s - e for s, e in zip(seqs, exts, strict=False)]
    mode = ForwardMode.MIXED if p else ForwardMode.EXTEND
    fb = ForwardBatch(
        forward_mode=mode,
        batch_size=len(seqs),
        input_ids=torch.zeros(positions.numel(), dtype=torch.int64, device=DEV),
        req_pool_indices=torch.tensor(reqs, dtype=torch.int32, device=DEV),
        seq_lens=torch.tensor(seqs, dtype=torch.int32, device=DEV),
        seq_lens_cpu=torch.tensor(seqs, dtype=torch.int32),
        out_cache_loc=dep.req_to_token[row_req, positions].to(torch.int64),
        seq_lens_sum=sum(seqs),
        positions=positions,
        extend_seq_lens=ext,
        extend_seq_lens_cpu=list(exts),
        extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32, device=DEV),
        extend_prefix_lens_cpu=prefix,
        extend_start_loc=torch.cumsum(ext, 0, dtype=torch.int32) - ext,
        extend_num_tokens=positions.numel(),
    )
    if not p:
        fb._original_forward_mode = ForwardMode.DECODE
    # What the plugin's AFTER hook on ForwardBatch.init_new records for a scheduler batch.
    sched_reqs = [object() for _ in seqs]
    decoding = sched_reqs[1:] if p else None
    ms.after_forward_batch_init_new(
        fb,
        ForwardBatch,
        SimpleNamespace(forward_mode=mode, reqs=sched_reqs, decoding_reqs=decoding),
        None,
    )
    return fb, row_req, positions


def write_c4_topk(dep: Deployment, core, row_req, positions) -> None:
    """The indexer's per-layer write (a stand-in: random distinct visible entries per row)."""
    visible = (positions + 1) // 4
    width = int(visible.max())
    g = torch.Generator(device=DEV).manual_seed(1)
    rows = positions.numel()
    k = min(TOPK, core.c4_sparse_page_indices.shape[1], width)
    raw = torch.empty(rows, k, dtype=torch.int64, device=DEV)
    for start in range(0, rows, 256):  # bounded memory: 256 rows x width scores at a time
        sl = slice(start, min(rows, start + 256))
        scores = torch.rand(sl.stop - sl.start, width, generator=g, device=DEV)
        scores[torch.arange(width, device=DEV)[None, :] >= visible[sl, None]] = -1.0
        raw[sl] = scores.topk(k, dim=1).indices
    valid = raw < visible[:, None]
    page = torch.where(valid, dep.compressed_slots(row_req[:, None], raw, 4), -1)
    raw = torch.where(valid, raw, -1)
    core.c4_sparse_page_indices[:rows].fill_(-1)
    core.c4_sparse_page_indices[:rows, :k].copy_(page)
    if core.c4_sparse_raw_indices is not None:
        core.c4_sparse_raw_indices[:rows].fill_(-1)
        core.c4_sparse_raw_indices[:rows, :k].copy_(raw)


def queue_ahead(ms: float) -> None:
    """Keep the GPU busy for about ``ms`` so the host's launches of the next call run ahead of
    it, as behind a replayed graph segment: the events around the call then time GPU work only."""
    if ms > 0:
        torch.cuda._sleep(int(ms * SLEEP_CYCLES_PER_MS))


def time_point(
    dep: Deployment,
    layer: int,
    d: int,
    p: int,
    reps: int,
    flush: torch.Tensor,
    ahead_ms: float = 0.0,
):
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from sglang_mixgraph.patches import mixed_split as ms

    backend = dep.backend
    ratio = RATIOS[layer]
    g = torch.Generator(device=DEV).manual_seed(2)
    setup_ms = []
    with (
        torch.no_grad(),
        forward_context(ForwardContext(attn_backend=backend)),
        envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(True),
    ):
        for _ in range(3):
            fb, row_req, positions = make_batch(dep, d, p)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            backend.init_forward_metadata(fb)
            torch.cuda.synchronize()
            setup_ms.append((time.perf_counter() - t0) * 1e3)
        core = backend.forward_metadata.core_attn_metadata
        write_c4_topk(dep, core, row_req, positions)
        q = (torch.randn(positions.numel(), HEADS, 512, generator=g, device=DEV) * 0.5).to(
            torch.bfloat16
        )
        sink = torch.randn(HEADS, generator=g, device=DEV)
        lo = SimpleNamespace(layer_id=layer, v_head_dim=512, tp_q_head_num=HEADS)

        def call():
            return backend.forward(
                q=q,
                k=q,
                v=q,
                layer=lo,
                forward_batch=fb,
                compress_ratio=ratio,
                save_kv_cache=False,
                attn_sink=sink,
            )

        out = call()  # the first layer of a step builds the chunk cache lazily (unsplit)
        # With tail graphs the step's first call made the split schedule eagerly; the second
        # captures the layer's graph. Both untimed: the reps time replays, as a step's later
        # layers run them.
        call()
        plan = ms.get_plan(backend)
        gpu, wall, host = [], [], []
        for _ in range(reps):
            # Each layer of a real step reads its own cache: forget the compressed dequant the
            # previous call left in the shared workspace (upstream reuses it for layers that
            # share a kv source, which DSV4-Pro's do not).
            backend.sparse_prefill_kv_buffer.forget_head()
            flush.zero_()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            queue_ahead(ahead_ms)
            t0 = time.perf_counter()
            a.record()
            call()
            t1 = time.perf_counter()
            b.record()
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)
            host.append((t1 - t0) * 1e3)
            gpu.append(a.elapsed_time(b))
    return dict(
        layer_ms=statistics.median(gpu),
        layer_wall_ms=statistics.median(wall),
        layer_host_ms=statistics.median(host),
        setup_ms=statistics.median(setup_ms),
        split=plan is not None,  # a plan splits every layer of its step
        decode_calls=dict(plan.decode_calls) if plan else {},
        out=out,
    )


TAIL_GRAPHS = "+tg"  # an arm suffix: the policy with SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1


def time_arm(dep, layer, d, p, reps, flush, arm, kit, ahead_ms=0.0):
    """One arm: upstream alone (``off``), or with the patch installed through the plugin
    registry and SGLang's HookRegistry for the given policy (removed again afterwards);
    ``always+tg`` / ``adaptive+tg``: that policy with the decode tail replayed from its CUDA
    graphs (the schedule made at the point's first untimed call, the graph captured at its
    second)."""
    if arm == "off":
        return time_point(dep, layer, d, p, reps, flush, ahead_ms)
    policy = arm.removesuffix(TAIL_GRAPHS)
    with kit.patch_installed(flag_on=True, policy=policy, tail_graphs=arm.endswith(TAIL_GRAPHS)):
        return time_point(dep, layer, d, p, reps, flush, ahead_ms)


def environment(**fields) -> dict:
    """The run's date, GPU, torch, sglang and Triton (where importable), ``fields``, command."""
    env = dict(
        date=datetime.date.today().isoformat(),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
    )
    try:
        import sglang
        import triton

        env.update(sglang=sglang.__version__, triton=triton.__version__)
    except Exception:  # noqa: BLE001
        pass
    return dict(env, **fields, command=" ".join(sys.argv))


def kernel_prediction(path: str):
    try:
        with open(path) as f:
            return {
                (x["layer"], x["context"], x["decode_rows"], x["prefill_rows"]): x
                for x in json.load(f)
            }
    except OSError:
        return {}


def arms_of(points) -> list:
    """The arms a results file holds, in run order (``off`` first)."""
    return [k.removesuffix("_layer_ms") for k in points[0] if k.endswith("_layer_ms")]


def summary_lines(points) -> list:
    """Figures the page states in words, computed from the points (only for the arms run)."""
    arms = arms_of(points)
    out = []
    for c in sorted({r["context"] for r in points}):
        key = next(
            (
                r
                for r in points
                if (r["layer"], r["context"], r["decode_rows"], r["prefill_rows"])
                == ("csa_c4_top1024", c, 256, 1792)
            ),
            None,
        )
        if key and key.get("kernel_split_ms") and "always" in arms:
            line = (
                f"- CSA {c // 1024}k / D 256 / P 1792: in-server `always` "
                f"{key['off_layer_ms'] / key['always_layer_ms']:.2f}x (off "
                f"{key['off_layer_ms']:.3f} ms, split {key['always_layer_ms']:.3f} ms)"
            )
            if "adaptive" in arms:
                line += f", `adaptive` {key['off_layer_ms'] / key['adaptive_layer_ms']:.2f}x"
            out.append(
                f"{line}; the kernel benchmark predicted "
                f"{key['kernel_unsplit_ms'] / key['kernel_split_ms']:.2f}x."
            )
    if "always" in arms:
        host_off = statistics.median(r["off_layer_host_ms"] for r in points)
        host_on = statistics.median(r["always_layer_host_ms"] for r in points)
        out.append(
            f"- Host time per layer call, median over the points: upstream {host_off:.3f} ms, with "
            f"the split (`always`) {host_on:.3f} ms. Where the GPU work of a layer is shorter than "
            "this, the layer is host-bound in an eager step and a GPU saving does not show."
        )
    tg = "always" + TAIL_GRAPHS
    if tg in arms and "always" in arms:
        extra = statistics.median(
            r["always_layer_host_ms"] - r["off_layer_host_ms"] for r in points
        )
        extra_tg = statistics.median(
            r[f"{tg}_layer_host_ms"] - r["off_layer_host_ms"] for r in points
        )
        out.append(
            f"- Host added per split layer call, median of the per-point differences from `off`: "
            f"`always` {extra:+.3f} ms, `{tg}` (decode tail from its CUDA graphs) {extra_tg:+.3f} ms."
        )
        # A P 0 point runs no prefill body when split (less host than upstream's): by P apart.
        for p in sorted({r["prefill_rows"] for r in points}):
            at = [r for r in points if r["prefill_rows"] == p]
            a = [r["always_layer_host_ms"] - r["off_layer_host_ms"] for r in at]
            t = [r[f"{tg}_layer_host_ms"] - r["off_layer_host_ms"] for r in at]
            out.append(
                f"- The same at {p} prefill rows ({len(at)} points): `always` "
                f"{statistics.median(a):+.3f} ms ({min(a):+.3f} to {max(a):+.3f}), `{tg}` "
                f"{statistics.median(t):+.3f} ms ({min(t):+.3f} to {max(t):+.3f})."
            )
        for d in sorted({r["decode_rows"] for r in points}):
            gpu = [
                r[f"{tg}_layer_ms"] - r["always_layer_ms"] for r in points if r["decode_rows"] == d
            ]
            out.append(
                f"- GPU time per layer, `{tg}` minus `always`, at {d} decode rows: "
                f"{min(gpu):+.3f} to {max(gpu):+.3f} ms (median {statistics.median(gpu):+.3f}, "
                f"{len(gpu)} points)."
            )
    same = [
        abs(r["adaptive_layer_ms"] / r["off_layer_ms"] - 1)
        for r in points
        if "adaptive_split" in r and not r["adaptive_split"]
    ]
    if same:
        out.append(
            f"- Noise: where `adaptive` keeps the layer unsplit it runs upstream's code, yet differs "
            f"from `off` by up to {100 * max(same):.0f}% (median {100 * statistics.median(same):.0f}%):"
            " differences below that are not resolved by this run."
        )
    patched = [a for a in arms if a != "off"]
    if patched:
        setup = ", ".join(
            f"`{a}` {statistics.median(r[f'{a}_setup_ms'] - r['off_setup_ms'] for r in points):.2f} ms"
            for a in patched
        )
        out.append(
            f"- Step set-up added by the patch, median: {setup} per step (once for all layers)."
        )
    return out


def write_report(data: dict, path: str) -> None:
    """The results page: per point, upstream (off), each patched arm the run had and the kernel
    benchmark's figures for the same point."""
    env, points = data["environment"], data["points"]
    arms = arms_of(points)
    patched = [a for a in arms if a != "off"]
    lines = [
        f"# Mixed split in-server timing ({env['gpu']})",
        "",
        f"Date {env['date']}, {env['gpu']}, torch {env['torch']}, Triton {env.get('triton', '?')}, sglang "
        f"{env.get('sglang', '?')} (its pins ask for torch 2.14.1: this stack is older, run through "
        "tools/gpu-upstream). Command: `bash tools/gpu-upstream/device.sh python3 "
        f"{env['command']}`; {env['reps']} calls x {env['rounds']} rounds per arm, arms interleaved.",
        "",
        "One layer through upstream's `DeepseekV4AttnBackend.forward` (h_q 128): `off` is upstream, "
        f"{', '.join(f'`{a}`' for a in patched)} the patch installed by the plugin registry "
        f"(`+tg`: decode tails from their CUDA graphs). ms = median CUDA-event time of one layer "
        "call after an L2 flush; the GPU also waits for the host here unless GPU work was queued "
        f"ahead ({env.get('queue_ahead_ms', 0)} ms), so `host` (time until the call returns) is "
        "given beside it. `kernel` = benchmark/mixed_split_kernel.py for the same point "
        "(docs/results/mixed_split_h200.json): kernels only, copy-in join, no host work. "
        "x = off / arm.",
        "",
        "| layer | context | D | P | off ms (host) | "
        + " | ".join(f"{a} ms (host) | {a} x" for a in patched)
        + " | kernel unsplit / split ms | kernel x |",
        "|---|---|---|---|---|" + "---|---|" * len(patched) + "---|---|",
    ]
    for r in points:
        kx = (
            r["kernel_unsplit_ms"] / r["kernel_split_ms"]
            if r.get("kernel_split_ms")
            else float("nan")
        )
        cells = []
        for a in patched:
            splits = (
                "" if f"{a}_split" not in r else f" ({'split' if r[f'{a}_split'] else 'unsplit'})"
            )
            cells.append(
                f"{r[f'{a}_layer_ms']:.3f} ({r[f'{a}_layer_host_ms']:.3f}){splits} | "
                f"{r['off_layer_ms'] / r[f'{a}_layer_ms']:.2f}"
            )
        lines.append(
            f"| {r['layer']} | {r['context']} | {r['decode_rows']} | {r['prefill_rows']} | "
            f"{r['off_layer_ms']:.3f} ({r['off_layer_host_ms']:.3f}) | "
            + " | ".join(cells)
            + f" | {r.get('kernel_unsplit_ms', float('nan')):.3f} / "
            f"{r.get('kernel_split_ms', float('nan')):.3f} | {kx:.2f} |"
        )
    lines += ["", "## Reading", ""] + summary_lines(points)
    lines += [
        "",
        "Step set-up (metadata build; with the patch also its plan and the prefill-only chunk cache), "
        "median ms, once per step for all layers:",
        "",
        "| layer | context | D | P | " + " | ".join(arms) + " |",
        "|---|---|---|---|" + "---|" * len(arms),
    ]
    for r in points:
        lines.append(
            f"| {r['layer']} | {r['context']} | {r['decode_rows']} | {r['prefill_rows']} | "
            + " | ".join(f"{r[f'{a}_setup_ms']:.2f}" for a in arms)
            + " |"
        )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--report-only", metavar="JSON", help="rewrite the .md page from a results JSON"
    )
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--decode", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--prefill", type=int, nargs="+", default=[0, 512, 1792])
    ap.add_argument("--reps", type=int, default=15, help="timed calls per arm per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", nargs="+", default=["off", "always", "adaptive"])
    ap.add_argument(
        "--queue-ahead-ms",
        type=float,
        default=0.0,
        help="GPU busy time queued before each timed call (0: the GPU also waits for the host)",
    )
    ap.add_argument("--name", default="mixed_split_inserver_h200", help="output file stem")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    md = os.path.join(args.out, f"{args.name}.md")
    if args.report_only:
        with open(args.report_only) as f:
            write_report(json.load(f), md)
        return

    from sglang_mixgraph.kits import dsv4_cpu as kit

    kernel = kernel_prediction(os.path.join(_ROOT, "docs", "results", "mixed_split_h200.json"))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    arms = args.arms
    results = []
    with kit.sglang_context(device=DEV):
        for c in args.contexts:
            dep = Deployment(c, max(args.decode), max_prefill=max(args.prefill))
            decide_for_model(dep, model_ratios())
            for layer, ratio in enumerate(RATIOS):
                for d in args.decode:
                    for p in args.prefill:
                        rec = dict(
                            layer=LAYER_NAMES[ratio], context=c, decode_rows=d, prefill_rows=p
                        )
                        samples, outs = {}, {}
                        # arms interleaved, the order reversed every round, so drift hits all arms
                        for rnd in range(args.rounds):
                            for arm in arms if rnd % 2 == 0 else arms[::-1]:
                                r = time_arm(
                                    dep,
                                    layer,
                                    d,
                                    p,
                                    args.reps,
                                    flush,
                                    arm,
                                    kit,
                                    args.queue_ahead_ms,
                                )
                                outs[arm] = r.pop("out")
                                for k, v in r.items():
                                    samples.setdefault(f"{arm}_{k}", []).append(v)
                        for k, v in samples.items():
                            rec[k] = statistics.median(v) if isinstance(v[0], float) else v[-1]
                        for arm in arms[1:]:
                            rec[f"{arm}_max_abs_diff_vs_off"] = float(
                                (outs[arm].float() - outs["off"].float()).abs().max()
                            )
                        kp = kernel.get((rec["layer"], c, d, p))
                        if kp:
                            rec["kernel_unsplit_ms"], rec["kernel_split_ms"] = (
                                kp["unsplit_ms"],
                                kp["split_ms"],
                            )
                        results.append(rec)
                        print(json.dumps(rec), flush=True)
            del dep
            torch.cuda.empty_cache()
    env = environment(reps=args.reps, rounds=args.rounds, queue_ahead_ms=args.queue_ahead_ms)
    data = dict(environment=env, points=results)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    write_report(data, md)
    print("wrote", os.path.join(args.out, f"{args.name}.{{json,md}}"))


if __name__ == "__main__":
    main()
