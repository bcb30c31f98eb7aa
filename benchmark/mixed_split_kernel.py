#!/usr/bin/env python3
"""Kernel-level A/B of one DSV4 mixed step's attention: unsplit vs split vs adaptive.

One layer of each kind at DSV4-Pro shapes (h_q 128, dim 512, SWA 128): a CSA layer (c4, top-1024)
and an HCA layer (c128). Per sweep point (context, decode rows D, prefill rows P):

* unsplit: our Triton dequant of every request's SWA window + whole compressed history into a bf16
  workspace, then ``flash_mla_sparse_fwd`` (legacy, as sglang calls it) over all b0 + D rows;
* split: the same over the prefill request only, the D decode rows through FlashMLA's fp8
  ``flash_mla_with_kvcache`` (legacy V4) via ``core.decode_tail``, outputs joined in row order;
* adaptive: ``core.split_cost_model.should_split`` picks one of the two, with coefficients fitted
  in phase A of this same run on the calibration contexts (1k, 4k, 16k) only.

Timing: CUDA events around each call, an L2 flush (256 MiB memset, outside the events) before
each timed call, medians after warm-up. Caches are pools of 0.6-2.6 GB (several times the 60 MB
L2) with each point's indices spread over them at random. Workspaces are preallocated (upstream
reuses one buffer), the decode scheduling metadata is one object per layer kind bound on the
first call and reused (upstream: once per ratio per step, amortized over the layers).

Outputs (``--out DIR``): ``mixed_split_h200.json`` (the points),
``mixed_split_h200_extra.json`` (fit, predictions, decisions, component breakdown, repeat
timings, allocation counts, environment), ``split_cost_<arch>.json`` (fitted coefficients),
``mixed_split_h200.png``.

Run on the GPU machine: ``PYTHONPATH=python python3 benchmark/mixed_split_kernel.py --out $OUT``
(``PYTHONPATH=python:.whl/site`` with FlashMLA's wheel unpacked there, docs/mixed-split-kernels.md).
CPU dry run (reference kernels, tiny shapes; checks the script, times nothing meaningful):
``PYTHONPATH=python python benchmark/mixed_split_kernel.py --dry-run-cpu --out /tmp/x``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

from sglang_mixgraph.core import split_cost_model as cm
from sglang_mixgraph.core.mixed_boundary import assemble_rows
from sglang_mixgraph.kits import cost_fit as fit
from sglang_mixgraph.kits.decode_tail_call import DecodeTail
from sglang_mixgraph.kits.synthetic_step import (
    StepSpec,
    build_step,
    fill_random,
    fill_workspace,
    plan_split_prefill,
    plan_workspace,
    softmax_scale,
    split_attention,
    unsplit_attention,
)
from sglang_mixgraph.reference import v4_kv_layout as kvl
from sglang_mixgraph.reference.v4_dequant import dequantize_v4

LAYERS = [("csa_c4_top1024", 4), ("hca_c128", 128)]
CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768]
DECODE_ROWS = [32, 128, 256, 512]
PREFILL_ROWS = [0, 512, 1792, 4096]
CALIB_CONTEXTS = [1024, 4096, 16384]
FIELDS = (
    "layer",
    "context",
    "decode_rows",
    "prefill_rows",
    "unsplit_ms",
    "split_ms",
    "adaptive_ms",
    "unsplit_workspace_bytes",
    "split_workspace_bytes",
    "decode_floor_ms",
)


def log(*a):
    print(*a, flush=True)


class Timer:
    def __init__(self, device, flush_bytes=256 << 20):
        self.cuda = device.type == "cuda"
        self.flush = torch.empty(flush_bytes if self.cuda else 1, dtype=torch.uint8, device=device)
        self.sleep_cycles = 2_000_000  # ~1 ms at 1.98 GHz

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def once(self, fn):
        self.flush.zero_()
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # keep the GPU busy while the host enqueues fn's launches, so the events time the
            # GPU work and not Python launch overhead (seen in the smoke run: tiny decode-only
            # points were host-bound and jittered 5x)
            torch.cuda._sleep(self.sleep_cycles)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def median(self, fn, warmup=2, min_reps=5, max_reps=25, budget_ms=150.0):
        for _ in range(warmup):
            fn()
        self.sync()
        first = self.once(fn)
        reps = int(max(min_reps, min(max_reps, budget_ms / max(first, 1e-3))))
        times = [first] + [self.once(fn) for _ in range(reps - 1)]
        return statistics.median(times), times


def copy_bandwidth(device, nbytes=2 << 30):
    if device.type != "cuda":
        return float("nan")
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    a.random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    med = statistics.median(ts)
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / (med * 1e-3)  # bytes read + written per second


def kernels(dry: bool):
    if dry:
        from sglang_mixgraph.reference.sparse_mla import (
            ReferenceSchedMeta,
            flash_mla_sparse_fwd_reference,
            flash_mla_with_kvcache_reference,
        )

        def sparse_fwd(q, kv, idx, scale, d_v, sink, lens):
            return flash_mla_sparse_fwd_reference(
                q, kv, idx, scale, d_v, sink, lens, return_log2_lse=True
            )

        return sparse_fwd, flash_mla_with_kvcache_reference, ReferenceSchedMeta

    import flash_mla

    def sparse_fwd(q, kv, idx, scale, d_v, sink, lens):
        # as sglang 0.5.23 calls it: kernels/ops/attention/flash_mla_interface.py:161-184
        return flash_mla.flash_mla_sparse_fwd(
            q, kv, idx, scale, d_v, sink, lens, use_legacy=True, return_log2_lse=True
        )

    return sparse_fwd, flash_mla.flash_mla_with_kvcache, None


class Bench:
    def __init__(self, args):
        self.args = args
        self.dry = args.dry_run_cpu
        self.device = torch.device("cpu" if self.dry else "cuda")
        self.timer = Timer(self.device)
        self.sparse_fwd, self.decode_kernel, self.meta_factory = kernels(self.dry)
        self.h_q = 8 if self.dry else 128
        self.topk = 64 if self.dry else 1024
        self.pools = {}

    # ---- pools ----
    def pools_for(self, ratio):
        if ratio in self.pools:
            return self.pools[ratio]
        self.pools.clear()
        torch.cuda.empty_cache() if not self.dry else None
        gen = torch.Generator(device=self.device).manual_seed(1234 + ratio)
        scale = 1 if not self.dry else 0
        swa_ps = 256 if not self.dry else 64
        swa_tokens = (1 << 20) if scale else 4096
        swa = kvl.allocate_cache(-(-swa_tokens // swa_ps), swa_ps, self.device)
        fill_random(swa, swa_ps, gen)
        extra_ps = max(256 // ratio, 1) if not self.dry else max(64 // ratio, 1)
        max_ctx, max_d = max(self.contexts), max(self.decode_rows)
        max_p = max(self.prefill_rows)
        need = (max_d + 1) * (-(-max(max_ctx, max_p) // ratio // extra_ps) + 1) * extra_ps
        extra_tokens = max(need, (1 << 20) if scale else 0)
        extra = kvl.allocate_cache(-(-extra_tokens // extra_ps), extra_ps, self.device)
        fill_random(extra, extra_ps, gen)
        self.pools[ratio] = (swa, extra, swa_ps, extra_ps)
        log(
            f"pools for c{ratio}: swa {swa.numel() / 2**20:.0f} MiB ({swa_ps}-token pages), "
            f"extra {extra.numel() / 2**20:.0f} MiB ({extra_ps}-token pages)"
        )
        return self.pools[ratio]

    # ---- one point ----
    def make(self, ratio, ctx, d, p, seed):
        swa, extra, swa_ps, extra_ps = self.pools_for(ratio)
        seqs, exts = cm.uniform_step_lists(ctx, d, p)
        spec = StepSpec(
            ratio=ratio,
            seq_lens=seqs,
            extend_lens=exts,
            num_decode=d,
            topk=self.topk,
            h_q=self.h_q,
            swa_page_size=swa_ps,
            full_page_size=extra_ps * ratio,
            seed=seed,
        )
        step = build_step(spec, device=self.device, q_scale=2.0, swa_cache=swa, extra_cache=extra)
        b = step.boundary
        plan_all = plan_workspace(step, len(seqs), b.decode_end)
        plan_pre = plan_split_prefill(step, "copy")
        ws_all = torch.empty(plan_all.num_tokens, 1, 512, dtype=torch.bfloat16, device=self.device)
        ws_pre = (
            torch.empty(plan_pre.num_tokens, 1, 512, dtype=torch.bfloat16, device=self.device)
            if plan_pre is not None
            else None
        )
        tail = DecodeTail(kernel=self.decode_kernel, meta_factory=self.meta_factory)
        shape = cm.StepShape.uniform(ratio, ctx, d, p, topk=self.topk)
        return step, plan_all, plan_pre, ws_all, ws_pre, tail, shape

    def fns(self, step, plan_all, plan_pre, ws_all, ws_pre, tail):
        def unsplit():
            return unsplit_attention(step, plan_all, dequantize_v4, self.sparse_fwd, ws=ws_all)

        def split():
            return split_attention(step, plan_pre, dequantize_v4, self.sparse_fwd, tail, ws=ws_pre)

        return unsplit, split

    def measure_point(self, layer, ratio, ctx, d, p, coeffs=None, seed=0, check=False):
        step, plan_all, plan_pre, ws_all, ws_pre, tail, shape = self.make(ratio, ctx, d, p, seed)
        unsplit, split = self.fns(step, plan_all, plan_pre, ws_all, ws_pre, tail)
        rec = dict(layer=layer, context=ctx, decode_rows=d, prefill_rows=p)
        rec["unsplit_ms"], t_u = self.timer.median(unsplit)
        rec["split_ms"], t_s = self.timer.median(split)
        extra = dict(unsplit_times=t_u, split_times=t_s)
        if coeffs is not None:
            decision = cm.should_split(shape, coeffs)

            def adaptive():
                # the host-side decision is part of the measured call, as in serving
                return split() if cm.should_split(shape, coeffs) else unsplit()

            rec["adaptive_ms"], t_a = self.timer.median(adaptive)
            pu, ps = cm.predict(shape, coeffs)
            extra.update(
                adaptive_times=t_a, decision_split=decision, pred_unsplit_ms=pu, pred_split_ms=ps
            )
        if check:
            u, s = unsplit(), split()
            extra["split_vs_unsplit_rel_l2"] = float(
                (s.float() - u.float()).norm() / u.float().norm().clamp_min(1e-30)
            )
            extra["nan"] = bool(torch.isnan(s).any() or torch.isnan(u).any())
        rec["unsplit_workspace_bytes"] = plan_all.nbytes
        rec["split_workspace_bytes"] = plan_pre.nbytes if plan_pre is not None else 0
        rec = {k: rec[k] for k in FIELDS if k in rec}
        rec["decode_floor_ms"] = (
            shape.keys_dec * kvl.BYTES_PER_TOKEN / self.bw * 1e3 if self.bw == self.bw else None
        )
        extra["shape"] = {
            k: getattr(shape, k) for k in ("ws_all", "ws_pre", "keys_all", "keys_pre", "keys_dec")
        }
        return rec, extra, shape

    def breakdown(self, layer, ratio, ctx, d, p, seed=0):
        step, plan_all, plan_pre, ws_all, ws_pre, tail, shape = self.make(ratio, ctx, d, p, seed)
        b = step.boundary
        out = {}
        out["dequant_all_ms"] = self.timer.median(
            lambda: fill_workspace(step, plan_all, dequantize_v4, ws_all)
        )[0]
        fill_workspace(step, plan_all, dequantize_v4, ws_all)
        out["sparse_fwd_all_rows_ms"] = self.timer.median(
            lambda: self.sparse_fwd(
                step.q[: plan_all.num_rows],
                ws_all,
                plan_all.indices.unsqueeze(1),
                softmax_scale(),
                512,
                step.attn_sink,
                plan_all.lengths,
            )
        )[0]
        if plan_pre is not None:
            out["dequant_prefill_ms"] = self.timer.median(
                lambda: fill_workspace(step, plan_pre, dequantize_v4, ws_pre)
            )[0]
            fill_workspace(step, plan_pre, dequantize_v4, ws_pre)
            out["sparse_fwd_prefill_rows_ms"] = self.timer.median(
                lambda: self.sparse_fwd(
                    step.q[: b.b0],
                    ws_pre,
                    plan_pre.indices[: b.b0].unsqueeze(1),
                    softmax_scale(),
                    512,
                    step.attn_sink,
                    plan_pre.lengths[: b.b0],
                )
            )[0]
            out["sparse_fwd_prefill_plus_empty_rows_ms"] = self.timer.median(
                lambda: self.sparse_fwd(
                    step.q[: plan_pre.num_rows],
                    ws_pre,
                    plan_pre.indices.unsqueeze(1),
                    softmax_scale(),
                    512,
                    step.attn_sink,
                    plan_pre.lengths,
                )
            )[0]
            plan_cat = plan_split_prefill(step, "cat")
            out["split_cat_join_ms"] = self.timer.median(
                lambda: split_attention(
                    step, plan_cat, dequantize_v4, self.sparse_fwd, tail, ws=ws_pre
                )
            )[0]
            out["split_copy_join_ms"] = self.timer.median(
                lambda: split_attention(
                    step, plan_pre, dequantize_v4, self.sparse_fwd, tail, ws=ws_pre
                )
            )[0]
        rows = b.decode_rows

        def dec():
            return tail.forward(
                ratio,
                step.q[rows],
                step.swa_view,
                step.swa_indices[rows],
                step.swa_lengths[rows],
                step.attn_sink,
                extra_k_cache=step.extra_view,
                extra_indices=step.extra_indices[rows],
                extra_lengths=step.extra_lengths[rows],
                softmax_scale=softmax_scale(),
            )

        out["decode_tail_ms"] = self.timer.median(dec)[0]
        # the decode rows alone through the unsplit machinery (their share of the sparse prefill)
        o_dec = dec()
        if b.b0:
            o_pre = torch.empty(
                b.b0, step.q.shape[1], 512, dtype=torch.bfloat16, device=self.device
            )
            out["cat_join_ms"] = self.timer.median(lambda: assemble_rows(b, o_pre, o_dec))[0]
            o_all = torch.empty(
                b.num_rows, step.q.shape[1], 512, dtype=torch.bfloat16, device=self.device
            )
            out["copy_decode_rows_ms"] = self.timer.median(
                lambda: o_all[b.decode_rows].copy_(o_dec)
            )[0]
        # allocation behaviour in steady state (after the calls above)
        if self.device.type == "cuda":
            unsplit, split = self.fns(step, plan_all, plan_pre, ws_all, ws_pre, tail)
            for name, fn in (("unsplit", unsplit), ("split", split)):
                fn()
                torch.cuda.synchronize()
                s0 = torch.cuda.memory_stats()
                fn()
                torch.cuda.synchronize()
                s1 = torch.cuda.memory_stats()
                out[f"{name}_allocator_requests_per_call"] = (
                    s1["allocation.all.allocated"] - s0["allocation.all.allocated"]
                )
                out[f"{name}_cudamalloc_per_call"] = (
                    s1["segment.all.allocated"] - s0["segment.all.allocated"]
                )
        out["decode_floor_ms"] = (
            shape.keys_dec * kvl.BYTES_PER_TOKEN / self.bw * 1e3 if self.bw == self.bw else None
        )
        return out

    def run(self):
        a = self.args
        if self.dry:
            self.contexts, self.decode_rows, self.prefill_rows = [256, 1024], [2, 5], [0, 40]
            calib = [256]
        elif a.smoke:
            self.contexts, self.decode_rows, self.prefill_rows = [2048, 8192], [32, 256], [0, 1792]
            calib = [2048, 8192]
        else:
            self.contexts, self.decode_rows, self.prefill_rows = CONTEXTS, DECODE_ROWS, PREFILL_ROWS
            calib = CALIB_CONTEXTS
        env = self.environment()
        self.bw = copy_bandwidth(self.device)
        env["copy_bandwidth_GBps"] = self.bw / 1e9
        log(f"copy bandwidth (read+write): {self.bw / 1e9:.0f} GB/s")
        t0 = time.time()

        # phase A: calibration contexts, unsplit and split
        samples, phase_a = [], []
        for layer, ratio in LAYERS:
            for ctx in calib:
                for d in self.decode_rows:
                    for p in self.prefill_rows:
                        rec, ex, shape = self.measure_point(
                            layer, ratio, ctx, d, p, seed=ctx + d + p
                        )
                        samples.append((shape, rec["unsplit_ms"], rec["split_ms"]))
                        phase_a.append(dict(rec, **{k: v for k, v in ex.items() if k != "shape"}))
                        log(
                            f"[A] {layer} ctx={ctx} D={d} P={p}: unsplit {rec['unsplit_ms']:.3f} split {rec['split_ms']:.3f}"
                        )
        arch = "cpu" if self.dry else cm.detect_arch()
        coeffs = fit.fit_coefficients(
            samples,
            arch=arch,
            margin=cm.KNOWN_ARCH_MARGIN,
            source=(
                f"benchmark/mixed_split_kernel.py phase A on {env.get('gpu')}, {datetime.date.today()}, "
                f"contexts {calib}, decode rows {self.decode_rows}, prefill rows {self.prefill_rows}, h_q {self.h_q}"
            ),
        )
        fit_err = fit.relative_errors(samples, coeffs)
        log("fitted:", json.dumps(coeffs.to_json()["coefficients"]))
        log(f"phase A done after {time.time() - t0:.0f} s")

        # phase B: the whole sweep, three ways
        points, extras = [], []
        for layer, ratio in LAYERS:
            for ctx in self.contexts:
                for d in self.decode_rows:
                    for p in self.prefill_rows:
                        check = d == self.decode_rows[-1] and p == self.prefill_rows[-1]
                        rec, ex, shape = self.measure_point(
                            layer, ratio, ctx, d, p, coeffs, seed=7 * ctx + d + p, check=check
                        )
                        assert tuple(rec) == FIELDS or set(rec) == set(FIELDS), rec.keys()
                        points.append({k: rec[k] for k in FIELDS})
                        extras.append(
                            dict(
                                layer=layer,
                                context=ctx,
                                decode_rows=d,
                                prefill_rows=p,
                                calibration_context=ctx in calib,
                                **ex,
                            )
                        )
                        best = min(rec["unsplit_ms"], rec["split_ms"])
                        log(
                            f"[B] {layer} ctx={ctx} D={d} P={p}: unsplit {rec['unsplit_ms']:.3f} split "
                            f"{rec['split_ms']:.3f} adaptive {rec['adaptive_ms']:.3f} "
                            f"({'split' if ex['decision_split'] else 'unsplit'}; "
                            f"{(rec['adaptive_ms'] / best - 1) * 100:+.1f}% vs best) "
                            f"ws {rec['unsplit_workspace_bytes'] / 2**20:.0f}->{rec['split_workspace_bytes'] / 2**20:.0f} MiB"
                        )
        log(f"phase B done after {time.time() - t0:.0f} s")

        breakdown = []
        bd_d = 256 if 256 in self.decode_rows else self.decode_rows[-1]
        bd_p = 1792 if 1792 in self.prefill_rows else self.prefill_rows[-1]
        for layer, ratio in LAYERS:
            for ctx in self.contexts:
                bd = self.breakdown(layer, ratio, ctx, bd_d, bd_p, seed=ctx)
                breakdown.append(
                    dict(layer=layer, context=ctx, decode_rows=bd_d, prefill_rows=bd_p, **bd)
                )
                log(
                    f"[breakdown] {layer} ctx={ctx} D={bd_d} P={bd_p}: "
                    + " ".join(
                        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in bd.items()
                    )
                )
        env["wall_s"] = time.time() - t0
        self.write(points, extras, phase_a, breakdown, coeffs, fit_err, samples, env, calib)

    def environment(self):
        env = dict(
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            python=platform.python_version(),
            torch=torch.__version__,
            argv=sys.argv,
            h_q=self.h_q,
            topk=self.topk,
        )
        if self.device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name()
            env["capability"] = torch.cuda.get_device_capability()
            env["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
            try:
                import triton

                env["triton"] = triton.__version__
                import flash_mla

                env["flash_mla"] = flash_mla.__version__
            except Exception as exc:  # pragma: no cover
                env["import_error"] = repr(exc)
        return env

    def write(self, points, extras, phase_a, breakdown, coeffs, fit_err, samples, env, calib):
        out = self.args.out
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "mixed_split_h200.json"), "w") as f:
            json.dump(points, f, indent=1)
        with open(os.path.join(out, f"split_cost_{coeffs.arch}.json"), "w") as f:
            json.dump(coeffs.to_json(), f, indent=1)
        fit = [
            dict(
                layer=s.ratio,
                ws_all=s.ws_all,
                keys_all=s.keys_all,
                D=s.num_decode,
                b0=s.prefill_rows,
                unsplit_ms=u,
                split_ms=sp,
                unsplit_rel_err=e[0],
                split_rel_err=e[1],
            )
            for (s, u, sp), e in zip(samples, fit_err, strict=False)
        ]
        with open(os.path.join(out, "mixed_split_h200_extra.json"), "w") as f:
            json.dump(
                dict(
                    environment=env,
                    calibration_contexts=calib,
                    coefficients=coeffs.to_json(),
                    fit_residuals=fit,
                    phase_a=phase_a,
                    points=extras,
                    breakdown=breakdown,
                ),
                f,
                indent=1,
            )
        self.plot(points, os.path.join(out, "mixed_split_h200.png"), env)
        # summary table last (the device reply carries the end of the output)
        log("\nlayer            ctx    D     P   unsplit   split  adaptive  split/unsplit")
        for r in points:
            log(
                f"{r['layer']:15s} {r['context']:6d} {r['decode_rows']:4d} {r['prefill_rows']:5d} "
                f"{r['unsplit_ms']:8.3f} {r['split_ms']:7.3f} {r['adaptive_ms']:8.3f}   "
                f"{r['split_ms'] / r['unsplit_ms']:.3f}"
            )

    def plot(self, points, path, env):
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception as exc:  # pragma: no cover
            log("no plot:", exc)
            return
        fig, axes = plt.subplots(
            len(LAYERS),
            len(self.prefill_rows),
            figsize=(4 * len(self.prefill_rows), 7),
            sharex=True,
            squeeze=False,
        )
        for i, (layer, _) in enumerate(LAYERS):
            for j, p in enumerate(self.prefill_rows):
                ax = axes[i][j]
                for d in self.decode_rows:
                    pts = [
                        r
                        for r in points
                        if r["layer"] == layer and r["prefill_rows"] == p and r["decode_rows"] == d
                    ]
                    xs = [r["context"] for r in pts]
                    (line,) = ax.plot(
                        xs,
                        [r["split_ms"] / r["unsplit_ms"] for r in pts],
                        marker="o",
                        label=f"D={d} split",
                    )
                    ax.plot(
                        xs,
                        [r["adaptive_ms"] / r["unsplit_ms"] for r in pts],
                        ls="--",
                        marker="x",
                        color=line.get_color(),
                        label=f"D={d} adaptive",
                    )
                ax.axhline(1.0, color="k", lw=0.8)
                ax.set_xscale("log", base=2)
                ax.set_title(f"{layer}, prefill rows {p}", fontsize=9)
                if j == 0:
                    ax.set_ylabel("time / unsplit")
                if i == len(LAYERS) - 1:
                    ax.set_xlabel("context (tokens)")
        axes[0][0].legend(fontsize=6)
        fig.suptitle(
            f"DSV4 mixed step, one layer: split and adaptive vs unsplit ({env.get('gpu', 'cpu')}, h_q {self.h_q})"
        )
        fig.tight_layout()
        fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="a few points only")
    ap.add_argument(
        "--dry-run-cpu", action="store_true", help="reference kernels on CPU, tiny shapes"
    )
    args = ap.parse_args()
    if not args.dry_run_cpu and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --dry-run-cpu)")
    torch.manual_seed(0)
    with torch.inference_mode():
        Bench(args).run()


if __name__ == "__main__":
    main()
