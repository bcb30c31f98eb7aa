"""Does a replayed breakable-graph bucket read memory that another owner took? Measured on
upstream's own ``BreakableCUDAGraph`` / ``BreakableCUDAGraphCapture`` / ``eager_on_graph``.

Several buckets are captured largest first into one shared graph memory pool (as SGLang's
runners do); each has one eager break whose input is, by scenario:
  ``produced``  the segment before the break wrote it into the pool (every replay rewrites it);
  ``persisted`` a pool buffer the break fills once, at capture, and reads on every replay;
  ``outside``   a per-bucket tensor made outside the capture that nothing but the break keeps.
``dsv4`` is DeepSeek-V4's real attention break (``kits.dsv4_gpu.BreakableBucket``). After the
captures the Python references are dropped, the ordinary allocator is churned (tensors filled
with NaN stay alive), and every bucket is replayed in alternating orders and compared with
eager. ``mode``: ``weak`` (upstream as installed), ``held`` (this plugin's hold_break_inputs
patch), ``all`` (every input held, what upstream PR 37448 does). A fault kills the CUDA context,
so a driver runs each case in its own process (``main``: one case, one JSON line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import torch

BUCKETS = (4096, 2048, 1024, 512)  # rows, captured in this order
WIDTH = 1024
SCENARIOS = ("produced", "persisted", "outside", "dsv4")
MODES = ("weak", "held", "all")
BCG = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"


def _bcg():
    import importlib

    return importlib.import_module(BCG)


@contextlib.contextmanager
def mode_installed(mode: str):
    """Upstream as it is, this plugin's patch, or every break input held."""
    if mode == "weak":
        yield
        return
    if mode == "held":
        from sglang_mixgraph.kits.install import installed
        from sglang_mixgraph.patches import hold_break_inputs

        env = {hold_break_inputs.HOLD_FLAG.name: "1"}
        with installed([hold_break_inputs.PATCH], env):
            yield
        return
    bcg = _bcg()
    original = bcg._weak_ref_if_tensor
    bcg._weak_ref_if_tensor = lambda x: x
    try:
        yield
    finally:
        bcg._weak_ref_if_tensor = original


def _pattern(n: int) -> torch.Tensor:
    return ((torch.arange(n * WIDTH, device="cuda", dtype=torch.float32) + n) % 13).view(n, WIDTH)


class SyntheticBucket:
    """One bucket: the runner's static input and output (kept), a body with one eager break."""

    def __init__(self, n: int, scenario: str):
        bcg = _bcg()
        self.n, self.scenario = n, scenario
        self.x = torch.zeros(n, WIDTH, device="cuda")
        self.y = torch.zeros(n, WIDTH, device="cuda")
        self.input_ptrs: list[int] = []
        filled: set[int] = set()

        @bcg.eager_on_graph
        def mix(h, extra):
            if scenario == "persisted" and extra.data_ptr() not in filled:
                extra.copy_(_pattern(n))  # filled once; replays read what it holds
                filled.add(extra.data_ptr())
            return h * 0.5 + extra

        self._mix = mix

    def body(self, capturing: bool) -> None:
        h = self.x * 2 + 1  # a captured kernel writing the break's first input into the pool
        if self.scenario == "outside":
            extra = self._outside
        elif self.scenario == "persisted":
            extra = torch.empty(self.n, WIDTH, device="cuda")  # pool memory, no kernel
        else:
            extra = self.x.roll(1, 0)  # a captured kernel: the segment writes it
        if capturing:
            self.input_ptrs = [h.data_ptr(), extra.data_ptr()]
        out = self._mix(h, extra)
        self.y.copy_(out + 1)

    def reference(self) -> torch.Tensor:
        h = self.x * 2 + 1
        extra = self.x.roll(1, 0) if self.scenario == "produced" else _pattern(self.n)
        return h * 0.5 + extra + 1

    def capture(self, pool) -> None:
        bcg = _bcg()
        if self.scenario == "outside":  # made for this bucket outside the capture
            self._outside = _pattern(self.n)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.body(capturing=False)  # the runner's warm-up
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = bcg.BreakableCUDAGraph()
        with bcg.BreakableCUDAGraphCapture(self.graph, pool=pool, stream=stream):
            self.body(capturing=True)
        torch.cuda.synchronize()
        self._outside = None  # the runner keeps only its static buffers

    def replay_error(self, gen: torch.Generator) -> float:
        self.x.copy_(torch.randn(self.n, WIDTH, generator=gen).cuda())
        self.graph.replay()
        torch.cuda.synchronize()
        return (self.y - self.reference()).abs().max().item()


class Tally:
    """Replays counted, wrong ones (error over ``limit``, NaN included) and the worst error."""

    def __init__(self, limit: float):
        self.limit, self.replays, self.wrong, self.worst = limit, 0, 0, 0.0

    def add(self, err) -> None:
        err = float(err)
        err = float("inf") if err != err else err  # a NaN read counts as the worst
        self.replays += 1
        self.worst = max(self.worst, err)
        self.wrong += err > self.limit

    def result(self, worst_key: str) -> dict:
        return {"replays": self.replays, "wrong": self.wrong, worst_key: self.worst}


def churn(nbytes: int) -> list[torch.Tensor]:
    """Ordinary-allocator tensors of the buckets' sizes filled with NaN, kept alive."""
    kept = []
    per = [n * WIDTH for n in BUCKETS] * 4
    total = 0
    for numel in per:
        if total > nbytes:
            break
        kept.append(torch.full((numel,), float("nan"), device="cuda"))
        total += numel * 4
    return kept


def run_synthetic(scenario: str, mode: str, rounds: int, seed: int) -> dict:
    pool = torch.cuda.graph_pool_handle()
    torch.cuda.synchronize()
    base = torch.cuda.memory_reserved()
    buckets = []
    with mode_installed(mode):
        for n in BUCKETS:
            b = SyntheticBucket(n, scenario)
            b.capture(pool)
            buckets.append(b)
    capture_bytes = torch.cuda.memory_reserved() - base
    ptrs = [set(b.input_ptrs) for b in buckets]
    reused = sum(1 for i, p in enumerate(ptrs) for q in ptrs[i + 1 :] if p & q)
    kept = churn(2 * sum(n * WIDTH * 4 for n in BUCKETS))
    gen = torch.Generator().manual_seed(seed)
    tally = Tally(limit=1e-4)
    for r in range(rounds):
        for b in buckets if r % 2 else reversed(buckets):
            tally.add(b.replay_error(gen))
    del kept
    return {
        **tally.result("worst_abs_err"),
        "capture_reserved_mib": capture_bytes / 2**20,
        "input_address_shared_by_bucket_pairs": reused,
    }


def run_dsv4(mode: str, rounds: int, seed: int) -> dict:
    """DeepSeek-V4's attention break: buckets of 256, 128 and 64 rows share one pool."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_mixgraph.kits import dsv4_cpu as K
    from sglang_mixgraph.kits import dsv4_gpu as G

    world_step = K.Step(prefill=[(300, 40), (0, 64)], decode=[5, 130, 600, 257], seed=51 + seed)
    s = world_step.seq_lens
    lives = [
        K.Step(prefill=[(s[0] - 20, 20), (s[1] - 30, 30)], decode=[s[2] - 1, s[3] - 1]),
        K.Step(prefill=[(s[0] - 16, 16)], decode=[x - 1 for x in s[1:]]),
        K.Step(prefill=[(s[0] - 33, 33), (s[1] - 20, 20)], decode=[s[2] - 1, s[3] - 1, s[4] - 1]),
        K.Step(prefill=[(s[0] - 50, 50), (s[1] - 9, 9)], decode=[]),
    ]
    world = G.GpuWorld(world_step)

    def batch(step, **kw):
        view = world.view(K.Step(step.prefill, step.decode, seed=world_step.seed))
        mode_ = ForwardMode.MIXED if step.decode and step.prefill else ForwardMode.EXTEND
        return view, view.forward_batch(mode=mode_, **kw)

    pool = torch.cuda.graph_pool_handle()
    torch.cuda.synchronize()
    base = torch.cuda.memory_reserved()
    buckets = []
    with mode_installed(mode):
        for size in (256, 128, 64):
            b = G.BreakableBucket(world, size)
            view, fb = batch(lives[0])
            b.capture(view, fb, view.q(), pool=pool)
            buckets.append(b)
    capture_bytes = torch.cuda.memory_reserved() - base
    kept = churn(256 << 20)
    tally = Tally(limit=1e-3)
    for r in range(rounds):
        for i, b in enumerate(buckets if r % 2 else list(reversed(buckets))):
            step = lives[(r + i) % len(lives)]
            view, fb = batch(step)
            got = b.replay(view, fb, view.q())
            ref_view, ref_fb = batch(step, num_decode_attr=None)
            want = ref_view.run_step(ref_fb, q=ref_view.q(), sink=ref_view.attn_sink())
            rows = view.step.num_rows
            tally.add(max(G.rel_l2(got[layer][:rows], want[layer]) for layer in b.layers))
    del kept
    return {**tally.result("worst_rel_l2"), "capture_reserved_mib": capture_bytes / 2**20}


def run_case(scenario: str, mode: str, rounds: int, seed: int) -> dict:
    from sglang_mixgraph import counters

    if scenario == "dsv4":
        from sglang_mixgraph.kits import dsv4_cpu as K

        K.import_upstream()
        with K.sglang_context(device="cuda"):
            out = run_dsv4(mode, rounds, seed)
    else:
        out = run_synthetic(scenario, mode, rounds, seed)
    snap = counters.snapshot()
    out.update(
        scenario=scenario,
        mode=mode,
        seed=seed,
        patch_counters=snap["events"].get("hold_break_inputs", {}),
        patch_fallbacks=snap["fallbacks"].get("hold_break_inputs", {}),
    )
    return out


def run_isolated(scenario: str, mode: str, rounds: int = 6, seed: int = 0, timeout=600) -> dict:
    """One case in a fresh process (a fault there ends only that process): its result, or
    ``{"fault": <the error line>}`` when the process died."""
    import subprocess

    cmd = [sys.executable, "-m", __name__, scenario, mode, f"--rounds={rounds}", f"--seed={seed}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln]
    return {
        "scenario": scenario,
        "mode": mode,
        "seed": seed,
        "fault": (errors[-1] if errors else proc.stderr[-300:]).strip(),
        "returncode": proc.returncode,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("mode", choices=MODES)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print("RESULT " + json.dumps(run_case(a.scenario, a.mode, a.rounds, a.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
