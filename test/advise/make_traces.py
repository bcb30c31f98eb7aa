"""The recorded traces of advise's tests, and how they were made: synthetic, in torch.profiler's
chrome format (sglang_mixgraph.kits.profiler_trace), with the step spans SGLang 0.5.23 writes
under a profile with detailed annotations (`step[MIXED bs=.. c=.. g=.. ...]`).

    PYTHONPATH=python python test/advise/make_traces.py      # rewrites test/advise/traces/
    PYTHONPATH=python python test/advise/make_traces.py --server-info   # and server_info_dsv4.json

`dsv4_eager_h200/`: two attention-DP ranks of a DeepSeek-V4 server on an H200 whose MIXED steps
run eagerly and host-bound (212 ms of launch over 140 ms of kernels, 24 decode rows at about
2k tokens), beside an eager EXTEND step and DECODE steps replayed from the decode graph (23 and
24 rows: bucket 24). `dsv4_replay_h200/`: one rank whose MIXED steps replay the breakable
prefill graph (35 ms of host, 175 ms of kernels: GPU-bound; 256 decode rows at 32k) with 0.4 ms
of GPU idle after each. `idle_h200/`: a profile stopped before any step ran.
`server_info_dsv4.json`: the fields advise reads of `/server_info`, from SGLang's own resolution
of the reference DeepSeek-V4 launch at two ranks (tp 2, attention DP 2) on an H200.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang_mixgraph.kits.profiler_trace import TraceBuilder

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
MS = 1000.0  # the trace's unit is the microsecond

FORWARD = "sglang/srt/models/deepseek_v4.py(3400): forward"
ATTENTION = "nn.Module: DeepseekV4Attention_0"
DEQUANT = "sglang/kernels/ops/attention/dsv4/dequant_k_cache.py(27): dequantize_k_cache_paged_dsv4"
INDEXER = "nn.Module: C4Indexer_0"
MOE = "nn.Module: DeepseekV4MoE_0"
REPLAY = "sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py(1900): replay"

# (class, kernel, its frames, ms) of one eager MIXED step: 140 ms of kernels.
EAGER_MIXED_KERNELS = (
    ("attention", "void flash::sparse_attn_fwd_kernel<...>", (ATTENTION,), 30.0),
    ("dequant", "_dequantize_k_cache_paged_kernel", (ATTENTION, DEQUANT), 12.0),
    ("indexer", "tl_fp8_paged_mqa_logits_kernel", (INDEXER,), 8.0),
    ("gemm", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", (ATTENTION,), 50.0),
    ("moe", "fused_moe_kernel", (MOE,), 20.0),
    ("elementwise", "void at::native::elementwise_kernel<128, 4, CopyFunctor>", (), 20.0),
)


def mixed_label(decode: int, decode_ctx: int, chunk: int, prefix: int, forward_id: int) -> str:
    """SGLang's MIXED span name with detailed annotations: one prefill request of `chunk`
    tokens after `prefix` cached ones, `decode` running requests at `decode_ctx` tokens."""
    c_sk = prefix + chunk
    g_sk = decode * decode_ctx
    return (
        f"step[MIXED bs={decode + 1} c=1 g={decode} c_sq={chunk} c_sk={c_sk} "
        f"c_sqsq={chunk * chunk} c_sqsk={chunk * c_sk} g_sq={decode} g_sk={g_sk} "
        f"g_sqsq={decode} g_sqsk={g_sk} forward_id={forward_id}]"
    )


def decode_label(bs: int, ctx: int, forward_id: int) -> str:
    return (
        f"step[DECODE bs={bs} g_sq={bs} g_sqsq={bs} g_sqsk={bs * ctx} g_sk={bs * ctx} "
        f"forward_id={forward_id}]"
    )


def launch_call(kernel: str) -> str:
    """Triton and TileLang kernels go through the driver API; torch's and cuBLAS's through
    the runtime."""
    return "cuLaunchKernel" if kernel.startswith(("_", "tl_")) else "cudaLaunchKernel"


def eager_step(b: TraceBuilder, label: str, t0: float, host_ms: float, kernels) -> float:
    """An eager step at `t0` (us): each kernel launched inside its frames, spread over the host
    span, and run once the GPU is free. Returns when the step's GPU work ends."""
    host = host_ms * MS
    b.frame(FORWARD, t0, host)
    gpu, gap = t0, host / (len(kernels) + 1)
    for i, (_, name, frames, ms) in enumerate(kernels):
        at = t0 + (i + 1) * gap - 30
        for depth, frame in enumerate(frames):
            b.frame(frame, at - 10 + depth, 20 - 2 * depth)
        start = max(at + 8, gpu)
        b.launch(at, [(name, start, ms * MS)], call=launch_call(name))
        gpu = start + ms * MS
    first = t0 + gap - 22
    b.annotation(label, t0, host, gpu_span=(first, gpu))
    return gpu


def dsv4_eager_rank(rank: int) -> TraceBuilder:
    b = TraceBuilder(gpu="H200", pid=5000 + rank, tid=5000 + rank, device=rank)
    t = 1_000_000.0
    extend = (
        "step[EXTEND bs=1 toks=2816 c_sq=2816 c_sqsq=7929856 c_sqsk=7929856 c_sk=2816 forward_id=1]"
    )
    end = eager_step(b, extend, t, 150.0, EAGER_MIXED_KERNELS)
    t = end + 2 * MS
    for i in range(3):
        label = mixed_label(24, 2050 + i, 2560, 2048, 2 + i)
        end = eager_step(b, label, t, 212.0, EAGER_MIXED_KERNELS)
        t = end + 5 * MS
    decode_graph = (
        ("nvjet_sm90_tst_128x64_64x4_1x1_v_bz_TNT", 8.0),
        ("flash_fwd_splitkv_mla_kernel", 6.0),
        ("fused_moe_kernel", 4.0),
        ("void at::native::elementwise_kernel<128, 4, CopyFunctor>", 2.0),
    )
    for i in range(4):
        bs = 23 if rank == 0 and i == 0 else 24
        b.frame(FORWARD, t, 3 * MS)
        start, kernels = t + 2.5 * MS, []
        for name, ms in decode_graph:
            kernels.append((name, start, ms * MS))
            start += ms * MS
        b.launch(t + 2 * MS, kernels, call="cudaGraphLaunch", dur=30)
        b.annotation(decode_label(bs, 2060, 5 + i), t, 3 * MS, gpu_span=(t + 2.5 * MS, start))
        t = start + 1 * MS
    return b


def dsv4_replay_rank() -> TraceBuilder:
    """MIXED steps replayed from the breakable prefill graph: three captured segments (GEMMs,
    MoE, copies: by name only) around the attention break, which runs eagerly inside the replay
    (FlashMLA, the workspace dequant, the indexer)."""
    b = TraceBuilder(gpu="H200", pid=6000, tid=6000)
    t = 2_000_000.0
    for i, chunk in enumerate((2560, 2560, 2400, 2560)):
        host = 35 * MS
        b.frame(FORWARD, t, host)
        b.frame(REPLAY, t + 1 * MS, host - 2 * MS)
        gpu = t + 2 * MS
        segments = (
            ("graph", (("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 40.0),)),
            (
                "break",
                (
                    ("_dequantize_k_cache_paged_kernel", 30.0, (ATTENTION, DEQUANT)),
                    ("void flash::sparse_attn_fwd_kernel<...>", 60.0, (ATTENTION,)),
                    ("tl_fp8_paged_mqa_logits_kernel", 5.0, (INDEXER,)),
                ),
            ),
            ("graph", (("fused_moe_kernel", 25.0), ("elementwise_kernel_copy", 15.0))),
        )
        at = t + 3 * MS
        for kind, kernels in segments:
            if kind == "graph":
                batch = []
                for name, ms in kernels:
                    batch.append((name, gpu, ms * MS))
                    gpu += ms * MS
                b.launch(at, batch, call="cudaGraphLaunch", dur=40)
                at += 2 * MS
                continue
            for name, ms, frames in kernels:
                for depth, frame in enumerate(frames):
                    b.frame(frame, at - 10 + depth, 20 - 2 * depth)
                b.launch(at, [(name, gpu, ms * MS)], call=launch_call(name))
                gpu += ms * MS
                at += 2 * MS
        label = mixed_label(256, 32768, chunk, 32768 - chunk, 10 + i)
        b.annotation(label, t, host, gpu_span=(t + 2 * MS, gpu))
        # the next step is launched while the GPU runs this one; its work starts 0.4 ms after
        t = gpu - 1.6 * MS
    return b


def idle_rank() -> TraceBuilder:
    b = TraceBuilder(gpu="H200", pid=7000, tid=7000)
    b.frame("sglang/srt/managers/scheduler.py(1200): event_loop_overlap", 0, 5 * MS)
    return b


SCENARIOS = {
    "dsv4_eager_h200": {
        "TP-0-DP-0-EP-0": lambda: dsv4_eager_rank(0),
        "TP-1-DP-1-EP-1": lambda: dsv4_eager_rank(1),
    },
    "dsv4_replay_h200": {"TP-0": dsv4_replay_rank},
    "idle_h200": {"TP-0": idle_rank},
}


def write(root: Path = TRACES) -> list[Path]:
    written = []
    for scenario, ranks in SCENARIOS.items():
        folder = root / scenario
        folder.mkdir(parents=True, exist_ok=True)
        for rank, build in ranks.items():
            written.append(build().write(folder / f"{rank}.trace.json.gz"))
    return written


def reference_argv() -> list[str]:
    """The recorded server's launch arguments: the DeepSeek-V4-Pro preset on two ranks with
    DP attention, 2816 chunk tokens and 256 running requests a rank."""
    from sglang_mixgraph.resolution.presets import DSV4_PRO

    argv = list(DSV4_PRO.argv)
    sizes = {"--tp": "2", "--attn-dp-size": "2", "--chunked-prefill-size": str(2816 * 2)}
    sizes["--max-running-requests"] = str(256 * 2)
    for flag, value in sizes.items():
        argv[argv.index(flag) + 1] = value
    return argv


def record_server_info() -> dict:
    """`/server_info` as SGLang builds it (`build_server_info`: the resolved arguments, then
    the endpoint's `version` and `launch_command`), trimmed to what advise reads."""
    import os

    from sglang_mixgraph.advise.server import ENDPOINT_KEYS, RESOLVED_KEYS
    from sglang_mixgraph.resolution.presets import DSV4_PRO
    from sglang_mixgraph.resolution.resolve import resolve, select_described_platform

    select_described_platform("H200")
    argv = reference_argv()
    os.environ.update(DSV4_PRO.env)
    resolved = resolve(argv, "H200").resolved
    info = {k: resolved[k] for k in RESOLVED_KEYS}
    info["model_path"] = "/models/DeepSeek-V4-Pro"  # the package's path is this machine's
    argv[argv.index("--model-path") + 1] = info["model_path"]
    info["launch_command"] = "python -m sglang.launch_server " + " ".join(argv)
    info["version"] = "0.5.23"
    assert set(info) == {*RESOLVED_KEYS, *ENDPOINT_KEYS}
    return info


if __name__ == "__main__":
    for path in write():
        print(path, path.stat().st_size)
    if "--server-info" in sys.argv[1:]:
        path = HERE / "server_info_dsv4.json"
        path.write_text(json.dumps(record_server_info(), indent=1) + "\n")
        print(path, path.stat().st_size)
