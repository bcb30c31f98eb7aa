#!/usr/bin/env python3
"""Roofline estimate of one MIXED step of a DeepSeek-V4-shaped model, per kernel class.

    python3 tools/rank-slice/step_roofline.py CONFIG.json [--prefill 2560] [--decode 256]
        [--context 2048] [--fp8] [--json]

Every estimate is computed from the model's ``config.json`` and the step's shape: for each
operation the FLOPs and the bytes it must move, and its time as the larger of FLOPs / peak and
bytes / bandwidth (``PEAK_BF16``, ``PEAK_FP8``, ``HBM_BW``: the H200's practical ceilings).
The classes are those of ``sglang_mixgraph.core.kernel_classes`` (attention, indexer, mhc, norm,
gemm, moe); copies, elementwise kernels and the workspace dequantization have no estimate. The
prefill rows are one chunk of a request whose context reaches ``--context``; the decode rows
each have ``--context`` tokens. No torch, no sglang.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

PEAK_BF16 = 790e12  # dense bf16 FLOP/s, measured practical ceiling on the H200
PEAK_FP8 = 2 * PEAK_BF16  # Hopper's fp8 tensor rate is twice its bf16 rate
HBM_BW = 4.3e12  # bytes/s, practical copy bandwidth on the H200
BF16, FP32 = 2, 4
FP8_KV_BYTES = 584  # one token's DeepSeek-V4 FP8 KV entry: 448 fp8 + 64 bf16 rope + scales


@dataclass
class Op:
    cls: str
    name: str
    flops: float
    bytes: float
    fp8: bool = False

    def seconds(self) -> float:
        peak = PEAK_FP8 if self.fp8 else PEAK_BF16
        return max(self.flops / peak, self.bytes / HBM_BW)


def layer_counts(config: dict) -> dict:
    ratios = config["compress_ratios"][: config["num_hidden_layers"]]
    return {r: ratios.count(r) for r in (0, 4, 128)}


def _gemm(cls, name, rows, k, n, calls, fp8, groups=1) -> Op:
    wbytes = (1 if fp8 else BF16) * groups * k * n
    act = rows * groups * (k + n) * BF16
    return Op(cls, name, calls * 2 * rows * groups * k * n, calls * (wbytes + act), fp8)


def step_ops(config: dict, prefill: int, decode: int, context: int, fp8: bool) -> list[Op]:
    """The operations of one MIXED step: ``prefill`` chunk rows and ``decode`` decode rows."""
    rows = prefill + decode
    n = layer_counts(config)
    layers = sum(n.values())
    h, nh, hd = config["hidden_size"], config["num_attention_heads"], config["head_dim"]
    ql, ol, og = config["q_lora_rank"], config["o_lora_rank"], config["o_groups"]
    ih, ihd, topk = config["index_n_heads"], config["index_head_dim"], config["index_topk"]
    hc, win = config["hc_mult"], config["sliding_window"]
    ops = [
        _gemm("gemm", "wq_a", rows, h, ql, layers, fp8),
        _gemm("gemm", "wkv", rows, h, hd, layers, fp8),
        _gemm("gemm", "wq_b", rows, ql, nh * hd, layers, fp8),
        _gemm("gemm", "wo_a (grouped)", rows, nh * hd // og, ol, layers, fp8, groups=og),
        _gemm("gemm", "wo_b", rows, og * ol, h, layers, fp8),
        # The compressors' kv and gate projections: overlapping windows (two per slot) at 4x.
        _gemm("gemm", "compressor c4", rows, h, 2 * 2 * hd, n[4], fp8),
        _gemm("gemm", "compressor c128", rows, h, 2 * hd, n[128], fp8),
    ]
    # Sparse attention, bf16 over the dequantized workspace for prefill, fp8 decode: the keys a
    # row attends to are the window, the top-k of the c4 entries, or all the c128 entries.
    c4_keys = win + min(topk, context // 4)
    c128_keys = win + context // 128
    for kind, count, keys in ((0, n[0], win), (4, n[4], c4_keys), (128, n[128], c128_keys)):
        flops = count * 2 * rows * nh * (hd + hd) * keys
        kv = count * (
            prefill * keys * hd * BF16 / max(1, prefill // 64) + decode * keys * FP8_KV_BYTES
        )
        io = count * rows * nh * hd * BF16 * 2
        ops.append(Op("attention", f"sparse attention c{kind}", flops, kv + io))
    ops.append(Op("attention", "KV store", 0, layers * rows * (hd * BF16 + FP8_KV_BYTES)))
    # The c4 indexer: its projections, the fp8 logits over the compressed keys, the top-k.
    ckeys = context // 4
    ops += [
        _gemm("indexer", "indexer wq_b", rows, ql, ih * ihd, n[4], fp8),
        _gemm("indexer", "indexer weights_proj", rows, h, ih, n[4], False),
        _gemm("indexer", "indexer compressor", rows, h, 2 * 2 * ihd, n[4], fp8),
        Op(
            "indexer",
            "indexer logits",
            n[4] * 2 * rows * ih * ihd * ckeys,
            n[4] * (rows * ckeys * FP32 + (decode + 1) * ckeys * ihd + rows * ih * ihd),
            fp8=True,
        ),
        Op("indexer", "indexer top-k", 0, n[4] * rows * (ckeys * FP32 + topk * FP32)),
    ]
    # mHC, twice a layer: pre reads the hc streams, its prenorm GEMM (fp32) mixes them and writes
    # one stream; post reads the block output and the streams, and writes the streams.
    mix = (2 + hc) * hc
    ops += [
        Op(
            "mhc",
            "mhc pre",
            2 * layers * 2 * rows * hc * h * mix,
            2 * layers * rows * (hc * h + h) * BF16,
        ),
        Op("mhc", "mhc post", 0, 2 * layers * rows * (h + 2 * hc * h) * BF16),
    ]
    # RMSNorm: the block's two norms and the final one, and the attention's q and kv norms.
    ops += [
        Op("norm", "rmsnorm hidden", 0, (2 * layers + 1) * 2 * rows * h * BF16),
        Op("norm", "rmsnorm q, kv", 0, layers * 2 * rows * (ql + hd) * BF16),
    ]
    # MoE: the router, top-k routed experts and the shared ones (w13 then w2).
    inter, k = config["moe_intermediate_size"], config["num_experts_per_tok"]
    experts = k + config.get("n_shared_experts", 0)
    ops += [
        _gemm("moe", "router", rows, h, config["n_routed_experts"], layers, False),
        Op(
            "moe",
            "experts",
            layers * experts * 2 * rows * 3 * h * inter,
            layers
            * (
                (config["n_routed_experts"] + config.get("n_shared_experts", 0))
                * 3
                * h
                * inter
                * BF16
                + experts * rows * (2 * h + 3 * inter) * BF16
            ),
        ),
    ]
    return ops


def estimate(config: dict, prefill: int, decode: int, context: int, fp8: bool) -> dict:
    ops = step_ops(config, prefill, decode, context, fp8)
    classes: dict[str, dict] = {}
    for op in ops:
        c = classes.setdefault(op.cls, {"ms": 0.0, "gflop": 0.0, "mb": 0.0, "ops": {}})
        c["ms"] += op.seconds() * 1e3
        c["gflop"] += op.flops / 1e9
        c["mb"] += op.bytes / 1e6
        c["ops"][op.name] = round(op.seconds() * 1e3, 4)
    for c in classes.values():
        c["ms"], c["gflop"], c["mb"] = round(c["ms"], 3), round(c["gflop"], 1), round(c["mb"], 1)
    return {
        "shape": {"prefill": prefill, "decode": decode, "context": context, "fp8_gemms": fp8},
        "ceilings": {
            "bf16_tflops": PEAK_BF16 / 1e12,
            "fp8_tflops": PEAK_FP8 / 1e12,
            "hbm_tbps": HBM_BW / 1e12,
        },
        "classes": classes,
        "ms": round(sum(c["ms"] for c in classes.values()), 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="the model's config.json")
    ap.add_argument("--prefill", type=int, default=2560)
    ap.add_argument("--decode", type=int, default=256)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--fp8", action="store_true", help="the dense projections in fp8")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for flag in ("prefill", "decode", "context"):
        if getattr(args, flag) < 0:
            ap.error(f"--{flag} {getattr(args, flag)}: must be 0 or more")
    try:
        with open(args.config) as f:
            config = json.load(f)
        est = estimate(config, args.prefill, args.decode, args.context, args.fp8)
    except (OSError, ValueError, KeyError) as e:
        print(f"step_roofline: cannot read {args.config}: {e!r}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(est, indent=1))
    else:
        for cls, c in est["classes"].items():
            print(f"{cls:10s} {c['ms']:8.2f} ms  {c['gflop']:9.1f} GFLOP  {c['mb']:9.1f} MB")
        print(f"{'all':10s} {est['ms']:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
