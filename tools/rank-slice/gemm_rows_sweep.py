#!/usr/bin/env python3
"""Does a prefill bucket at the live row count spare the replay's GEMM excess? Times the bf16
GEMMs of DeepSeek-V4-Pro's compressors (`Compressor.wkv_gate`: hidden 7168 -> 2 x coff x
head_dim: 2048 for a c4 layer's, 1024 for a c128 layer's, 512 for the c4 indexer's) at row
counts around the slice's profiled MIXED step (2791 live rows, replayed in the 2816 bucket),
with torch's own matmul as SGLang's unquantized linear calls it (`F.linear`), on the GPU:

    python3 tools/rank-slice/gemm_rows_sweep.py [--rows 2791,2792,...] [--reps 50]

Prints one line per (N, rows): the median of `--reps` timed calls (CUDA events, after 10
warm-up calls) and the cuBLAS kernel a profiled call ran. Plain torch: runs on any CUDA
machine, no SGLang needed.
"""

from __future__ import annotations

import argparse

from standin_costs import _time as time_median_ms  # CUDA events, the median

HIDDEN = 7168
OUT_FEATURES = (2048, 1024, 512)
ROWS = (2791, 2792, 2800, 2808, 2816)


def kernel_names(fn) -> list[str]:
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"})


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for n in OUT_FEATURES:
        w = torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16)
        for m in rows:
            x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
            call = lambda x=x, w=w: F.linear(x, w)  # noqa: E731
            ms = time_median_ms(call, warmup=10, iters=args.reps)
            print(f"N {n:5d} rows {m:5d}: {ms * 1e3:8.1f} us  {', '.join(kernel_names(call))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
