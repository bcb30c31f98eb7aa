#!/usr/bin/env python3
"""What each kit stand-in costs in one MIXED step of the one-rank slice, timed on the GPU.

    bash tools/gpu-upstream/device.sh python3 tools/rank-slice/standin_costs.py --out "$OUT"

Each stand-in on the slice's serving path (upstream's torch fallbacks chosen by the kit's flags,
the kit's own sgl_kernel stand-ins) is called as the server calls it, on random inputs of one
2816-row MIXED step's shapes, timed with CUDA events (median after warm-up) and multiplied by its
calls per step, counted from the slice config's layer kinds. The indexer rows are timed at the
live width and at 8192. A full install's kernel is named, and timed only where the machine has it
(`--jit-topk`). `step_plan` and `row_contexts` import neither torch nor sglang (the CPU tests
read them); without torch or a GPU the script prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

CHUNK = 2816  # rows of one steady MIXED step: 2560 prefill tokens + 256 decode rows
DECODE_ROWS = 256
PROMPT = 2048  # the probe's prompts; a chunk spans the tail of one and the head of the next
LIVE_WIDTH = 2304  # the probe's longest context, page aligned (--cuda-graph-prefill-max-context)
WIDE = 8192  # the probe's context length: the breakable graph's metadata width
PAGE = 256  # the DeepSeek-V4 backend's page size
C4_PAGE = PAGE // 4  # compressed slots per page of the c4 indexer key cache
EXPERT_BLOCK = 64  # moe_align_block_size's block (the Triton config's BLOCK_SIZE_M; assumed)
ROUTED_SCALING = 1.5  # the slice's routed_scaling_factor: != 1 sends topk 2 to moe_sum_reduce


def layer_kinds(config: dict) -> dict:
    """Layers per kind from compress_ratios: c0 (sliding window only), c4 (with the indexer), c128."""
    ratios = config["compress_ratios"][: config["num_hidden_layers"]]
    return {f"c{r}": ratios.count(r) for r in (0, 4, 128)} | {"all": len(ratios)}


def row_contexts(rows: int = CHUNK, decode: int = DECODE_ROWS, width: int = LIVE_WIDTH):
    """(context length, request id) per row of one MIXED step: the prefill chunk continues one
    prompt and starts the next (causal: row i sees i+1 tokens of its prompt), the decode rows each
    have their own request with a context up to ``width``."""
    prefill, out, start = rows - decode, [], PROMPT - (rows - decode) // 2
    for i in range(prefill):
        pos = start + i
        out.append((pos % PROMPT + 1, pos // PROMPT))
    span = max(1, width - PROMPT)
    for j in range(decode):
        out.append((min(width, PROMPT + 1 + (j * 7) % span), 2 + j))
    return out


def step_plan(config: dict, rows: int = CHUNK, widths=(LIVE_WIDTH, WIDE)) -> list:
    """The stand-ins of one MIXED step: name, what a full install runs instead, shape, calls per
    step, and the dimensions the GPU benchmark builds its inputs from."""
    k = layer_kinds(config)
    h, hc = config["hidden_size"], config["hc_mult"]
    nh, hd, ih, ihd = (
        config["num_attention_heads"],
        config["head_dim"],
        config["index_n_heads"],
        config["index_head_dim"],
    )
    q_lora, topk = config["q_lora_rank"], config["index_topk"]
    mix = (2 + hc) * hc
    plan = []
    for w in widths:
        pages = -(-w // PAGE)
        cols = pages * C4_PAGE
        plan.append(
            dict(
                key=f"indexer_logits_w{w}",
                standin="c4 indexer logits in torch: dsv4.indexer.fp8_paged_mqa_logits_torch "
                "(SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1)",
                full="deep_gemm.fp8_paged_mqa_logits",
                full_module="deep_gemm",
                shape=f"q [{rows}, 1, {ih}, {ihd}] fp8, page table [{rows}, {pages}] "
                f"(width {w}: {cols} compressed columns)",
                calls=k["c4"],
                width=w,
                dims=dict(rows=rows, heads=ih, head_dim=ihd, pages=pages, width=w),
            )
        )
        plan.append(
            dict(
                key=f"topk_w{w}",
                standin="c4 top-k in torch: dsv4.indexer.topk_transform_pytorch_vectorized "
                "(--dsa-topk-backend torch)",
                full="sglang JIT top-k v2: kernels.ops.attention.dsv4.topk_transform_paged_v2",
                full_module="jit_topk",
                shape=f"scores [{rows}, {cols}] fp32, top {topk}",
                calls=k["c4"],
                width=w,
                dims=dict(rows=rows, pages=pages, width=w, topk=topk),
            )
        )
    plan += [
        dict(
            key="hc_pre",
            standin="mHC pre in torch + Triton: DeepseekV4DecoderLayerBase.hc_pre (torch prenorm "
            "GEMM, the kit's Triton sinkhorn, Triton mhc_combine)",
            full="TileLang mhc_pre (SGLANG_OPT_USE_TILELANG_MHC_PRE); deep_gemm "
            "tf32_hc_prenorm_gemm",
            full_module="tilelang",
            shape=f"x [{rows}, {hc}, {h}] bf16, fn [{mix}, {hc * h}] fp32",
            calls=2 * k["all"],
            dims=dict(rows=rows, hc=hc, hidden=h),
        ),
        dict(
            key="hc_split_sinkhorn",
            standin="(inside hc_pre) mHC sinkhorn on upstream's Triton port, "
            "mhc._hc_split_sinkhorn_triton (kit)",
            full="TileLang hc_split_sinkhorn",
            full_module="tilelang",
            shape=f"mixes [{rows}, 1, {mix}] fp32",
            calls=2 * k["all"],
            part_of="hc_pre",
            dims=dict(rows=rows, hc=hc),
        ),
        dict(
            key="hc_post",
            standin="mHC post in torch: deepseek_v4_mhc.post (post_torch_impl)",
            full="TileLang mhc_post (SGLANG_OPT_USE_TILELANG_MHC_POST)",
            full_module="tilelang",
            shape=f"x [{rows}, {h}], residual [{rows}, {hc}, {h}] bf16",
            calls=2 * k["all"],
            dims=dict(rows=rows, hc=hc, hidden=h),
        ),
        dict(
            key=f"rmsnorm_{h}",
            standin="sgl_kernel.rmsnorm in torch (kit): input and post-attention layernorms, "
            "the final norm",
            full="sgl_kernel.rmsnorm (CUDA)",
            full_module="sgl_kernel",
            shape=f"[{rows}, {h}] bf16",
            calls=2 * k["all"] + 1,
            dims=dict(rows=rows, hidden=h),
        ),
        dict(
            key=f"rmsnorm_{q_lora}",
            standin="sgl_kernel.rmsnorm in torch (kit): the attention's q_norm",
            full="sgl_kernel.rmsnorm (CUDA)",
            full_module="sgl_kernel",
            shape=f"[{rows}, {q_lora}] bf16",
            calls=k["all"],
            dims=dict(rows=rows, hidden=q_lora),
        ),
        dict(
            key="moe_sum_reduce",
            standin="sgl_kernel.moe_sum_reduce in torch (kit)",
            full="sgl_kernel.moe_sum_reduce (CUDA)",
            full_module="sgl_kernel",
            shape=f"[{rows}, {config['num_experts_per_tok']}, {h}] bf16 -> [{rows}, {h}]",
            calls=k["all"],
            dims=dict(rows=rows, topk=config["num_experts_per_tok"], hidden=h),
        ),
        dict(
            key="moe_align_block_size",
            standin="sgl_kernel.moe_align_block_size on upstream's JIT kernel (kit)",
            full="sgl_kernel.moe_align_block_size (the same kernel, built ahead of time)",
            full_module="sgl_kernel",
            shape=f"topk_ids [{rows}, {config['num_experts_per_tok']}], "
            f"{config['n_routed_experts']} experts, block {EXPERT_BLOCK}",
            calls=k["all"],
            dims=dict(
                rows=rows, topk=config["num_experts_per_tok"], experts=config["n_routed_experts"]
            ),
        ),
    ]
    # bf16 dense projections (cuBLAS through UnquantizedLinearMethod.apply); a full install of
    # Pro runs them in FP8 on deep_gemm. A subset: wo_a's grouped GEMM, the compressors, the
    # router, the shared expert and the LM head are not timed.
    gemms = [
        ("wq_a", h, q_lora, k["all"]),
        ("wkv", h, hd, k["all"]),
        ("wq_b", q_lora, nh * hd, k["all"]),
        ("wo_b", config["o_groups"] * config["o_lora_rank"], h, k["all"]),
        ("indexer.wq_b", q_lora, ih * ihd, k["c4"]),
        ("indexer.weights_proj", h, ih, k["c4"]),
    ]
    for name, n_in, n_out, calls in gemms:
        plan.append(
            dict(
                key=f"gemm_{name}",
                standin=f"bf16 dense GEMM {name} (UnquantizedLinearMethod.apply, dummy bf16 weights)",
                full="FP8 deep_gemm GEMM (Pro's FP8 checkpoint)",
                full_module="deep_gemm",
                shape=f"[{rows}, {n_in}] x [{n_out}, {n_in}]^T",
                calls=calls,
                dims=dict(rows=rows, n_in=n_in, n_out=n_out),
            )
        )
    plan.append(
        dict(
            key="triton_moe",
            standin="bf16 experts through the Triton MoE runner",
            full="flashinfer mxfp4 MoE (Pro's FP4 experts)",
            full_module="flashinfer",
            shape=f"{config['n_routed_experts']} experts top-{config['num_experts_per_tok']} of "
            f"{config['moe_intermediate_size']}",
            calls=k["all"],
            skip="not timed: the slice's MoE is a shrunk model, not Pro's; no kernel ratio to "
            "give (see the step profile's bf16 GEMM and Triton rows)",
            dims={},
        )
    )
    return plan


# ----------------------------------------------------------------------------- GPU part


def _kit_setup() -> None:
    """The kit's kernel selection and its Engine stand-ins, before sglang is imported."""
    from sglang_mixgraph.kits import gpu_machine

    os.environ.update(gpu_machine.UPSTREAM_ENV)
    gpu_machine.engine_standins().install()


def _installed(module: str) -> bool:
    import importlib.util

    if module == "jit_topk":
        return True  # sglang's own JIT kernel: built on first use (--jit-topk)
    mod = sys.modules.get(module)
    if mod is not None:
        return not getattr(mod, "__stub_module__", False)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _time(fn, warmup: int, iters: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _c4_inputs(d: dict, dev: str):
    """Per-row c4 lengths and page tables of the step (rows of one request share theirs)."""
    import torch

    ctx = row_contexts(d["rows"], width=min(d["width"], LIVE_WIDTH))
    seq = torch.tensor([c // 4 for c, _ in ctx], dtype=torch.int32, device=dev)
    req = torch.tensor([r for _, r in ctx], dtype=torch.int64, device=dev)
    n_req = int(req.max()) + 1
    pool_pages = n_req * d["pages"] + 64
    tables = torch.randperm(pool_pages, device=dev)[: n_req * d["pages"]].view(n_req, -1)
    return seq, tables[req].to(torch.int32).contiguous(), pool_pages


def _builders(dev: str = "cuda"):
    """key prefix -> (dims -> zero-argument callable running the server's function)."""
    import torch
    from sglang.srt.layers.attention.dsv4 import indexer as idx

    bf16 = torch.bfloat16

    def logits(d):
        seq, table, pool_pages = _c4_inputs(d, dev)
        q = torch.randn(d["rows"], 1, d["heads"], d["head_dim"], device=dev).to(idx.FP8_DTYPE)
        # The indexer key cache: per page 64 fp8 keys of 128 then 64 fp32 scales.
        shape = (pool_pages, C4_PAGE * (d["head_dim"] + 4))
        kv = torch.randint(0, 0x70, shape, device=dev, dtype=torch.uint8)  # finite fp8 bytes
        kv[:, C4_PAGE * d["head_dim"] :].view(torch.float32).fill_(1.0)
        kv = kv.view(pool_pages, C4_PAGE, 1, d["head_dim"] + 4)
        w = torch.randn(d["rows"], d["heads"], device=dev)
        width = d["pages"] * C4_PAGE
        return lambda: idx.fp8_paged_mqa_logits_torch(q, kv, w, seq, table, None, width, False)

    def topk(d, jit=False):
        seq, table, _ = _c4_inputs(d, dev)
        scores = torch.randn(d["rows"], d["pages"] * C4_PAGE, device=dev)
        out = torch.empty(d["rows"], d["topk"], dtype=torch.int32, device=dev)
        if not jit:
            return lambda: idx.topk_transform_pytorch_vectorized(scores, seq, table, out, C4_PAGE)
        from sglang.kernels.ops.attention.dsv4 import plan_topk_v2, topk_transform_paged_v2

        plan = plan_topk_v2(seq)  # per step, shared by every c4 layer (PagedIndexerMetadata)
        return lambda: topk_transform_paged_v2(scores, seq, table, out, C4_PAGE, plan)

    def hc_pre(d):
        from types import SimpleNamespace

        from sglang.srt.models.deepseek_v4 import DeepseekV4DecoderLayerBase as Layer

        me = SimpleNamespace(rms_norm_eps=1e-6, hc_mult=d["hc"], hc_sinkhorn_iters=20, hc_eps=1e-6)
        mix = (2 + d["hc"]) * d["hc"]
        x = torch.randn(d["rows"], d["hc"], d["hidden"], device=dev, dtype=bf16)
        fn = torch.randn(mix, d["hc"] * d["hidden"], device=dev) * 1e-3
        scale, base = torch.ones(3, device=dev), torch.zeros(mix, device=dev)
        return lambda: Layer.hc_pre(me, x, fn, scale, base)

    def sinkhorn(d):
        from sglang.kernels.ops.layernorm import mhc

        mix = (2 + d["hc"]) * d["hc"]
        mixes = torch.randn(d["rows"], 1, mix, device=dev)
        scale, base = torch.ones(3, device=dev), torch.zeros(mix, device=dev)
        return lambda: mhc.hc_split_sinkhorn(mixes, scale, base, d["hc"], 20, 1e-6)

    def hc_post(d):
        from sglang.srt.models import deepseek_v4_mhc as M

        cfg = M.HcConfig(d["hc"], 20, 1e-6, 1e-6, d["hidden"], False, False)
        x = torch.randn(d["rows"], d["hidden"], device=dev, dtype=bf16)
        res = torch.randn(d["rows"], d["hc"], d["hidden"], device=dev, dtype=bf16)
        post = torch.rand(d["rows"], d["hc"], device=dev)
        comb = torch.rand(d["rows"], d["hc"], d["hc"], device=dev)
        return lambda: M.post(cfg, x, res, post, comb)

    def rmsnorm(d):
        # The name RMSNorm.forward_cuda calls: the kit's torch stand-in on this machine.
        from sglang.srt.layers import layernorm

        x = torch.randn(d["rows"], d["hidden"], device=dev, dtype=bf16)
        w = torch.ones(d["hidden"], device=dev, dtype=bf16)
        return lambda: layernorm.rmsnorm(x, w, 1e-6)

    def sum_reduce(d):
        # The name the Triton MoE runner calls for top-k > 1 with a routed scaling factor.
        from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe

        x = torch.randn(d["rows"], d["topk"], d["hidden"], device=dev, dtype=bf16)
        out = torch.empty(d["rows"], d["hidden"], device=dev, dtype=bf16)
        return lambda: fused_moe.moe_sum_reduce(x, out, ROUTED_SCALING)

    def align(d):
        from sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size import (
            moe_align_block_size,
        )

        ids = torch.randint(0, d["experts"], (d["rows"], d["topk"]), device=dev, dtype=torch.int32)
        return lambda: moe_align_block_size(ids, EXPERT_BLOCK, d["experts"])

    def gemm(d):
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(
            torch.randn(d["n_out"], d["n_in"], device=dev, dtype=bf16), requires_grad=False
        )
        x = torch.randn(d["rows"], d["n_in"], device=dev, dtype=bf16)
        method = UnquantizedLinearMethod()
        return lambda: method.apply(layer, x)

    return {
        "indexer_logits": logits,
        "topk": topk,
        "hc_pre": hc_pre,
        "hc_split_sinkhorn": sinkhorn,
        "hc_post": hc_post,
        "rmsnorm": rmsnorm,
        "moe_sum_reduce": sum_reduce,
        "moe_align_block_size": align,
        "gemm": gemm,
    }


def _builder_for(key: str, builders: dict):
    for prefix in sorted(builders, key=len, reverse=True):
        if key == prefix or key.startswith(prefix + "_"):
            return builders[prefix]
    raise KeyError(key)


@contextlib.contextmanager
def _parallel_stand_in():
    """hc_pre reads ``get_parallel().tp_group`` for its symmetric-memory choice; with no
    process group built (one GPU, no server) it is stated as absent, so that choice is off."""
    from sglang.srt.runtime_context import get_parallel

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(get_parallel().override(tp_group=None))
        except Exception:  # noqa: BLE001 -- then hc_pre reports its own error in its row
            pass
        yield


def measure(plan: list, args) -> list:
    import torch

    builders = _builders()
    rows, start = [], time.time()
    for row in plan:
        r = {k: v for k, v in row.items() if k != "dims"}
        r["full_on_machine"] = _installed(row["full_module"])
        if not r.get("skip") and time.time() - start > args.budget_s:
            r["skip"] = f"not timed: the run's budget of {args.budget_s} s ran out"
        if r.get("skip"):
            rows.append(r)
            continue
        t0, build = time.time(), _builder_for(row["key"], builders)
        try:
            r["ms_per_call"] = round(_time(build(row["dims"]), args.warmup, args.iters), 4)
            r["ms_per_step"] = round(r["ms_per_call"] * row["calls"], 2)
        except Exception as e:  # noqa: BLE001 -- one row's failure is data, not the end
            r["error"] = f"{type(e).__name__}: {e}"[:300]
        if row["key"].startswith("topk_") and args.jit_topk:
            try:
                jit = build(row["dims"], jit=True)
                r["full_ms_per_call"] = round(_time(jit, args.warmup, args.iters), 4)
                r["full_ms_per_step"] = round(r["full_ms_per_call"] * row["calls"], 2)
            except Exception as e:  # noqa: BLE001
                r["full_error"] = f"{type(e).__name__}: {e}"[:300]
        r["wall_s"] = round(time.time() - t0, 1)
        torch.cuda.empty_cache()  # the wide logits rows hold GBs of temporaries
        rows.append(r)
        print(f"standin_costs: {row['key']}: {r.get('ms_per_call', r.get('error'))}", flush=True)
    return rows


def _cell(text: str) -> str:
    return " ".join(str(text).replace("|", "/").split())


def _full_cell(r: dict) -> str:
    if "full_ms_per_call" in r:
        return (
            f"{r['full']}: {r['full_ms_per_call']:.3f} ms/call, {r['full_ms_per_step']:.1f} ms/step"
        )
    if "full_error" in r:
        return f"{r['full']}: failed here ({r['full_error']})"
    if r["full_module"] == "jit_topk":
        return f"{r['full']} (not timed: run with --jit-topk)"
    where = "on this machine, not timed" if r["full_on_machine"] else "not on this machine"
    return f"{r['full']} ({where})"


def totals(rows: list, widths) -> dict:
    """ms per step of every timed stand-in (rows inside another row not added twice), once for
    each width of the width-dependent rows."""
    out = {}
    for w in widths:
        out[str(w)] = round(
            sum(
                r.get("ms_per_step", 0.0)
                for r in rows
                if not r.get("part_of") and r.get("width", w) == w
            ),
            1,
        )
    return out


def markdown(rows: list, meta: dict) -> str:
    lines = [
        f"Stand-in costs of one MIXED step ({meta['rows']} rows), {meta['device']}, "
        f"median of {meta['iters']} after {meta['warmup']} warm-up calls.",
        "",
        "| stand-in | a full install runs instead | shape | calls / step | ms / call | ms / step |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_call = (
            f"{r['ms_per_call']:.3f}" if "ms_per_call" in r else r.get("error", r.get("skip", "-"))
        )
        per_step = f"{r['ms_per_step']:.1f}" if "ms_per_step" in r else "-"
        if r.get("part_of"):
            per_step += f" (in {r['part_of']})"
        cells = (r["standin"], _full_cell(r), r["shape"], r["calls"], per_call, per_step)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines.append("")
    for w, ms in meta["totals"].items():
        lines.append(f"- all timed stand-ins, width-dependent rows at width {w}: {ms} ms per step")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."), help="directory for the JSON and table")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--widths", type=int, nargs="+", default=[LIVE_WIDTH, WIDE])
    p.add_argument(
        "--budget-s", type=float, default=60.0, help="stop timing new rows after this long"
    )
    p.add_argument(
        "--jit-topk",
        action="store_true",
        help="also time upstream's JIT top-k v2 (a full install's); compiles it on a cold cache",
    )
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("standin_costs: torch is not installed here; nothing measured (run it on the GPU)")
        return 0
    if not torch.cuda.is_available():
        print("standin_costs: no CUDA GPU here; nothing measured (run it on the GPU)")
        return 0
    import make_slice_model  # beside this script; stdlib only

    _kit_setup()
    torch.manual_seed(0)
    config = make_slice_model.build_config(make_slice_model.load_pro_config())
    t0 = time.time()
    plan = step_plan(config, CHUNK, tuple(args.widths))
    with _parallel_stand_in():
        rows = measure(plan, args)
    meta = dict(
        rows=CHUNK,
        layers=layer_kinds(config),
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        iters=args.iters,
        warmup=args.warmup,
        wall_s=round(time.time() - t0, 1),
    )
    meta["totals"] = totals(rows, args.widths)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "standin_costs.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = markdown(rows, meta)
    (args.out / "standin_costs.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
