"""The arms of the rank-slice runs and the Engine arguments of the reference per-rank shape.

One attention-DP rank of the reference deployment (DeepSeek-V4-Pro, 8 GPUs, attention DP 8,
chunked prefill 22528 and 2048 running requests in all) serves a 2816-token chunk and 256 running
requests: ``engine_kwargs`` is that rank on one GPU (tp 1), mixed chunked prefill on, the radix
cache on (Python tree core; random prompts only miss); ``chunk`` sets another chunk per rank (the
regime map's cells, ``regime_map.py``). An arm is a name, environment variables
and Engine arguments on top; arms differ in nothing else. No sglang import (the one helper it takes
from the package imports none): the CPU tests read this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_mixgraph.kits.gpu_machine import KERNEL_ENGINE, attention_dp_engine_kwargs

CHUNK = 2816  # chunked prefill per rank: 2560 prefill tokens + 256 decode rows when steady
RUNNING = 256  # running requests per rank
PAGE = 256  # the DeepSeek-V4 backend's page size
MEM_FRACTION = 0.75
SWA_WINDOW = 128
# Decode graph buckets: a short list keeps 61-layer decode capture quick; the same in every arm.
DECODE_BUCKETS = [16, 32, 64, 128, 192, 256]

SPLIT = "SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN"
POLICY = "SGLANG_MIXGRAPH_SPLIT_POLICY"
READ_DONE = "SGLANG_OPT_DSV4_REPLAY_READ_DONE"
TAIL_GRAPHS = "SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS"
BUCKETS = "SGLANG_MIXGRAPH_PREFILL_BUCKETS"
FORCE_BCG = "SGLANG_EXPERIMENTAL_FORCE_BCG"
LIVE_WIDTH = "SGLANG_OPT_DSV4_BCG_LIVE_WIDTH_INDEXER"
WO_A_IN_BREAK = "SGLANG_MIXGRAPH_BCG_WO_A_IN_BREAK"
COMPRESS_CAP = "SGLANG_MIXGRAPH_BCG_COMPRESS_PLAN_CAP"
HOLD = "SGLANG_MIXGRAPH_BCG_HOLD_BREAK_INPUTS"
ONE_STREAM = {"SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": "0"}  # upstream's DSV4 stream overlap off
# An allowlist that names no installed plugin: SGLang loads none, so the arm is SGLang alone.
NO_PLUGIN = {"SGLANG_PLUGINS": "none"}


@dataclass(frozen=True)
class Arm:
    name: str
    what: str
    env: dict[str, str] = field(default_factory=dict)
    engine: dict[str, object] = field(default_factory=dict)


def _bcg(**extra) -> dict[str, object]:
    return {"cuda_graph_backend_prefill": "breakable", **extra}


ARMS = {
    a.name: a
    for a in [
        Arm("upstream", "SGLang alone (the allowlist leaves the plugin out)", NO_PLUGIN),
        Arm("installed", "the plugin installed, no flag set"),
        Arm(
            "split-eager",
            "the split (always), prefill graph off",
            {SPLIT: "1", POLICY: "always"},
            {"cuda_graph_backend_prefill": "disabled"},
        ),
        Arm(
            "split-eager-adaptive",
            "the split (adaptive), prefill graph off",
            {SPLIT: "1", POLICY: "adaptive"},
            {"cuda_graph_backend_prefill": "disabled"},
        ),
        Arm("forced-bcg", "SGLANG_EXPERIMENTAL_FORCE_BCG=1, nothing else", {FORCE_BCG: "1"}),
        Arm(
            "bcg-auto",
            "derived buckets + the capture estimate in place of the DeepSeek-V4 rule",
            {BUCKETS: "auto"},
        ),
        Arm(
            "bcg-auto-wo-a",
            "bcg-auto with the inverse RoPE and wo_a inside the attention break",
            {BUCKETS: "auto", WO_A_IN_BREAK: "1"},
        ),
        Arm(
            "bcg-auto-lean",
            "bcg-auto-wo-a with the compressor plans capped (the replay's extra GPU work removed)",
            {BUCKETS: "auto", WO_A_IN_BREAK: "1", COMPRESS_CAP: "1"},
        ),
        Arm(
            "bcg-auto-held",
            "bcg-auto with the eager breaks' inputs from outside the pool held (capture memory)",
            {BUCKETS: "auto", HOLD: "1"},
        ),
        Arm(
            "bcg-auto-ctx",
            "bcg-auto with the capture context width cut to the workload's longest context",
            {BUCKETS: "auto"},
            {"cuda_graph_prefill_max_context": "workload"},
        ),
        Arm(
            "bcg-auto-1s",
            "bcg-auto with upstream's attention stream overlap off",
            {BUCKETS: "auto", **ONE_STREAM},
        ),
        Arm(
            "bcg-auto-lw",
            "bcg-auto-1s with the c4 indexer at an eager break over the live context",
            {BUCKETS: "auto", LIVE_WIDTH: "1", **ONE_STREAM},
        ),
        Arm(
            "bcg-split-always",
            "bcg-auto with the split (always) alone: the split's own cost in replays",
            {BUCKETS: "auto", SPLIT: "1", POLICY: "always"},
        ),
        Arm(
            "bcg-split-tg",
            "bcg-split-always with the decode tail replayed from its CUDA graphs",
            {BUCKETS: "auto", SPLIT: "1", POLICY: "always", TAIL_GRAPHS: "1"},
        ),
        Arm(
            "bcg-split-rd-always",
            "breakable prefill graph + split (always) + replay read-done",
            {BUCKETS: "auto", SPLIT: "1", POLICY: "always", READ_DONE: "1"},
            _bcg(),
        ),
        Arm(
            "bcg-split-rd-adaptive",
            "breakable prefill graph + split (adaptive) + replay read-done",
            {BUCKETS: "auto", SPLIT: "1", POLICY: "adaptive", READ_DONE: "1"},
            _bcg(),
        ),
        Arm(
            "bcg-split-rd-lw",
            "bcg-split-rd-always with the c4 indexer at the live width (stream overlap off)",
            {
                BUCKETS: "auto",
                SPLIT: "1",
                POLICY: "always",
                READ_DONE: "1",
                LIVE_WIDTH: "1",
                **ONE_STREAM,
            },
            _bcg(),
        ),
    ]
}


def ceil_page(n: int) -> int:
    return -(-n // PAGE) * PAGE


def pool_sizes(
    requests: int, input_len: int, output_len: int, shared_prefix: int = 0, chunk: int = CHUNK
) -> dict[str, object]:
    """KV pool and SWA ratio so that every request of the burst fits and the SWA pool holds the
    running requests' windows (each up to two pages) plus two chunks of ``chunk`` in flight. Upstream's
    DeepSeek-V4 default ratio (0.1) ran out at 173 decode rows of a 700k-token pool. A shared
    prefix (whole pages of it, served from the radix cache) is held once, not per request."""
    running = min(requests, RUNNING)
    shared = shared_prefix // PAGE * PAGE
    own = ceil_page(input_len + output_len - shared) + PAGE
    full = max(ceil_page(requests * own + shared), 4 * chunk)
    swa = running * 2 * PAGE + 2 * ceil_page(chunk)
    return {
        "max_total_tokens": full,
        "swa_full_tokens_ratio": round(min(1.0, swa / full + 0.02), 3),
    }


def engine_kwargs(
    model_dir: str,
    arm: Arm,
    *,
    requests: int,
    input_len: int,
    output_len: int,
    radix: bool,
    context_length: int,
    dp: int = 1,
    kernels: str = "standin",
    shared_prefix: int = 0,
    chunk: int = CHUNK,
) -> dict[str, object]:
    """``context_length`` is also the width breakable-graph metadata is built at (upstream's
    ``DeepseekV4AttnBackend._prefill_graph_context_width``) unless an arm cuts it. ``dp`` > 1
    serves that many ranks of the reference deployment on as many GPUs (attention DP, tp = dp):
    each rank with one rank's chunk, running requests and pool for its share of ``requests``.
    ``kernels`` names the kit's kernel selection (``gpu_machine.KERNEL_ENGINE``);
    ``shared_prefix``: the prompts' common first tokens, held once in the pool (radix on);
    ``chunk``: the chunked prefill per rank, decode rows included (``CHUNK`` by default)."""
    per_rank = -(-requests // dp)
    kwargs: dict[str, object] = dict(
        model_path=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        tp_size=1,
        enable_mixed_chunk=True,
        chunked_prefill_size=chunk,
        max_running_requests=RUNNING,
        context_length=context_length,
        moe_runner_backend="triton",
        cuda_graph_bs_decode=DECODE_BUCKETS,
        # The KV pool is capped by max_total_tokens (the same in every arm); at 0.85 the rest left
        # too little room for the breakable capture estimate on the H200, which turned the
        # graph off in the breakable arms (docs/results/rank_slice_h200.md). 0.75 as ab_slice.toml.
        mem_fraction_static=MEM_FRACTION,
        disable_radix_cache=not radix,
        random_seed=1,
        log_level="info",
        **pool_sizes(per_rank, input_len, output_len, shared_prefix if radix else 0, chunk),
    )
    kwargs.update(KERNEL_ENGINE[kernels])
    kwargs.update(attention_dp_engine_kwargs(dp, chunk, RUNNING))
    for k, v in arm.engine.items():
        kwargs[k] = ceil_page(input_len + output_len) if v == "workload" else v
    return kwargs


def parse(names: list[str]) -> list[Arm]:
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; known: {sorted(ARMS)}")
    return [ARMS[n] for n in names]
