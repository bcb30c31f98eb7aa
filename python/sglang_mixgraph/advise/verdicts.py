"""One verdict per patch that could act on a MIXED step: what it would change there, and why.

The mixed split (`SGLANG_OPT_MIXED_SPLIT_DECODE_ATTN`) is priced by its own cost model
(split_pricing); the breakable prefill graph (`graph_config`'s buckets) by the eager MIXED
steps' host (unprofiled where the server's log gives the profiler's factor, server_log) and GPU
time against a replayed step's (measured in this profile where some
replayed, else the evidence's); the decode-tail graphs by the split's steps and the measured
per-layer host and GPU costs of the tails; read-done by the GPU's idle time after replayed
steps, which bounds what the whole-forward barrier costs. A prediction is a (low, high) range of
the MIXED step's wall change in ms, priced step by step (each step's own low and high, from the
cost model's error and the evidence's spread) and taken from the 10th percentile of the steps'
lows to the 90th of their highs; fewer than MIN_STEPS steps give no range ("unknown"). Its
outcome: pays (the whole range gains), may pay, no gain.
A patch that cannot act here (model, backend, speculative mode, no such step) says why; where
a number would need what neither the profile nor a record holds, the verdict is "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_mixgraph.advise import evidence as ev
from sglang_mixgraph.advise.auto_buckets import auto_prefill_buckets
from sglang_mixgraph.advise.server import ServerFacts
from sglang_mixgraph.advise.server_log import HostScale, ServedShare
from sglang_mixgraph.advise.split_pricing import ModelLayers, StepPrice, price_step
from sglang_mixgraph.advise.steps import Gpu, Step, med
from sglang_mixgraph.advise.summary import bucket_for

PAYS, MAY_PAY, NO_GAIN = "pays", "may pay", "no gain"
ALREADY_ON, CANNOT_ACT, UNKNOWN = "already on", "cannot act", "unknown"
# The GPU idle time after a replayed step below which read-done has nothing to win.
IDLE_FLOOR_MS = 0.05
PAGE = 256  # DeepSeek-V4's KV page: SGLang aligns the capture width to it
MIN_STEPS = 4  # fewer steps than this have no spread to take a range from


@dataclass(frozen=True)
class Inputs:
    facts: ServerFacts
    gpu: Gpu | None
    steps: list[Step]
    model: ModelLayers | None
    model_problem: str | None = None  # why `model` could not be read
    host_scale: HostScale | None = None  # the profiler's stretch of the eager host, from the log
    served: ServedShare | None = None  # the load's burst: its prefill phase against its tail

    @property
    def mixed(self) -> list[Step]:
        return [s for s in self.steps if s.mode == "MIXED"]


@dataclass(frozen=True)
class Verdict:
    id: str
    patch: str  # the plugin's patch the flags switch
    title: str
    outcome: str
    reason: str
    flags: tuple[str, ...] = ()
    delta_ms: float | None = None
    low_ms: float | None = None
    high_ms: float | None = None
    wall_ms: float | None = None  # the MIXED step's median wall the change is against
    basis: str = ""
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "flags": list(self.flags)
        }


def _verdict(id_: str, patch: str, title: str, outcome: str, reason: str, flags=(), **kw):
    """A verdict; its flags (what switches the patch on here) only where it was priced."""
    priced = outcome in (PAYS, MAY_PAY, NO_GAIN)
    return Verdict(id_, patch, title, outcome, reason, tuple(flags) if priced else (), **kw)


def _ranged(low: float, high: float) -> str:
    if high < 0:
        return PAYS
    return MAY_PAY if low < 0 else NO_GAIN


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    pos = q * (len(v) - 1)
    i = int(pos)
    return v[i] + (v[min(i + 1, len(v) - 1)] - v[i]) * (pos - i)


def _spread(lows: list[float], highs: list[float]) -> tuple[float, float]:
    """A prediction's range from its steps: the 10th percentile of their lows, the 90th of
    their highs (a step's own low and high carry the model's and the evidence's error)."""
    return _quantile(lows, 0.1), _quantile(highs, 0.9)


def _too_few(n: int, what: str) -> str:
    return (
        f"only {n} {what} in the profile: a range needs at least {MIN_STEPS} (profile more "
        "--steps while the server runs mixed traffic)"
    )


RANGE_BASIS = "range: 10th percentile of the steps' lows to 90th of their highs"


def _no_mixed_reason(x: Inputs) -> str:
    if x.facts.mixed_chunk is False:
        return "mixed chunked prefill is off (--enable-mixed-chunk): there are no MIXED steps"
    return (
        f"no MIXED step among the {len(x.steps)} profiled steps: no prefill ran beside "
        "running requests while profiling (send more load, or profile more --steps)"
    )


def _on_in(steps: list[Step], patch: str) -> int:
    return sum(patch in s.patches_seen for s in steps)


# ------------------------------------------------------------------ mixed split


def _setting(flag, value: str) -> str:
    """`NAME=value` for a patch's flag, the name read from its `Flag` (a renamed flag cannot
    leave a verdict naming the old one); a value the flag would refuse raises ValueError."""
    flag.field.parse(value)
    return f"{flag.name}={value}"


def _split_on() -> str:
    from sglang_mixgraph.patches.mixed_split.state import SPLIT_FLAG

    return _setting(SPLIT_FLAG, "1")


def _split_blocker(x: Inputs) -> str | None:
    """Why the split cannot act in any step of this deployment (None: it can)."""
    from sglang_mixgraph.patches.mixed_split.state import FALLBACKS
    from sglang_mixgraph.planner.split_view import SplitDeployment

    if not x.facts.deepseek_v4:
        return f"not a DeepSeek-V4 model ({x.facts.model_name()}): the split is DeepSeek-V4's"
    view = SplitDeployment(x.facts, x.gpu.major if x.gpu else None)
    for fallback in FALLBACKS:
        try:
            holds = fallback.deployment is not None and fallback.deployment(view)
        except ValueError:  # a speculative algorithm only the server's plugins know: not EAGLE
            holds = True
        if holds:
            return f"every step falls back to upstream: {fallback.text}"
    return None if x.mixed else _no_mixed_reason(x)


def split_verdict(x: Inputs) -> tuple[Verdict, list[tuple[Step, StepPrice]]]:
    """The split's verdict, and each priced MIXED step with its price (the tail graphs'
    verdict reads them)."""
    from sglang_mixgraph.core import split_cost_model as scm

    def verdict(outcome, reason, **kw) -> Verdict:
        flags = (_split_on(),)
        return _verdict("mixed_split", "mixed_split", "mixed split", outcome, reason, flags, **kw)

    if blocker := _split_blocker(x):
        return verdict(CANNOT_ACT, blocker), []
    mixed = x.mixed
    if on := _on_in(mixed, "mixed_split"):
        return verdict(ALREADY_ON, f"its hooks ran in {on} of {len(mixed)} MIXED steps"), []
    if x.gpu is None:
        return verdict(UNKNOWN, "the traces name no GPU: no calibration can be chosen"), []
    coeffs = scm.load_coefficients(x.gpu.arch)
    if coeffs.file != f"split_cost_{x.gpu.arch}.json":
        return verdict(
            UNKNOWN,
            f"no calibration of the split's cost model for {x.gpu.arch} ({x.gpu.name}); "
            f"not priced (`sglang-mixgraph plan` shows the fallback `adaptive` would use)",
            detail={"calibration": scm.calibration_info(coeffs)},
        ), []
    if x.model is None:
        return verdict(UNKNOWN, x.model_problem or "the model's config.json is not readable"), []
    priced = [(s, p) for s in mixed if (p := price_step(s, x.model, coeffs)) is not None]
    if not priced:
        reason = "the MIXED steps' labels carry no request counts (detailed annotations)"
        return verdict(UNKNOWN, reason), []
    if len(priced) < MIN_STEPS:
        return verdict(UNKNOWN, _too_few(len(priced), "priced MIXED steps")), []
    deltas = [p.wall_delta_ms for _, p in priced]
    low, high = _spread([p.wall_low_ms for _, p in priced], [p.wall_high_ms for _, p in priced])
    splitting = [(s, p) for s, p in priced if p.splits]
    labels = [s.label for s, _ in (splitting or priced)]
    shape = (
        f"{med(lb.decode_rows for lb in labels):.0f} decode rows at "
        f"~{med(lb.decode_context for lb in labels) or 0:.0f} tokens"
    )
    regimes = sorted({p.regime for _, p in priced})
    measured = med(s.class_ms["attention"] + s.class_ms["dequant"] for s, _ in priced)
    modelled = med(p.unsplit_ms for _, p in priced)
    if splitting:
        reason = (
            f"adaptive splits {len(splitting)} of {len(priced)} MIXED steps: attention "
            f"{med(p.unsplit_ms for _, p in splitting):.1f} -> "
            f"{med(p.split_ms for _, p in splitting):.1f} ms a step ({shape}; "
            f"{'/'.join(regimes)} model)"
        )
    else:
        reason = (
            f"adaptive keeps all {len(priced)} MIXED steps unsplit: the split would cost "
            f"{med(p.split_ms - p.unsplit_ms for _, p in priced):+.1f} ms of attention a step "
            f"({shape}); its decision costs {priced[0][1].eval_ms:.2f} ms a step"
        )
    reason += f"; the profile shows {measured:.1f} ms of attention and dequant kernels a step"
    off = modelled / max(measured, 1e-9)
    if regimes == [scm.REPLAY] and not 0.5 <= off <= 2.0:
        # Replays are GPU time, the model's unit: a factor of two apart means it does not fit.
        reason += (
            f" (the model's {modelled:.1f} ms is {off:.1f}x that: its calibration may not fit)"
        )
    info = scm.calibration_info(coeffs)
    errors = "/".join(f"{ev.SPLIT_MODEL_CHANGE_ERROR[r]:.1%} {r}" for r in regimes)
    return verdict(
        _ranged(low, high),
        reason,
        delta_ms=med(deltas),
        low_ms=low,
        high_ms=high,
        wall_ms=med(s.wall_ms for s in mixed),
        basis=f"the split's cost model, calibration {info['arch']} ({info['file']}); "
        f"layers from {x.model.source}; {RANGE_BASIS} over the {len(priced)} priced MIXED "
        f"steps, each with the model's own error ({errors} of the unsplit attention; "
        f"{ev.SPLIT_MODEL_ERROR_SOURCE})",
        detail={
            "steps_priced": len(priced),
            "steps_split": len(splitting),
            "regimes": regimes,
            "attention_ms_modelled": modelled,
            "attention_ms_measured": measured,
            "calibration": info,
        },
    ), priced


def tail_graphs_verdict(x: Inputs, split: Verdict, priced: list) -> Verdict:
    def verdict(outcome, reason, **kw) -> Verdict:
        from sglang_mixgraph.patches.mixed_split.state import TAIL_GRAPHS_FLAG

        flags = (_split_on(), _setting(TAIL_GRAPHS_FLAG, "1"))
        title = "decode-tail graphs"
        return _verdict("split_tail_graphs", "mixed_split", title, outcome, reason, flags, **kw)

    if split.outcome in (CANNOT_ACT, UNKNOWN):
        return verdict(split.outcome, f"needs the mixed split: {split.reason}")
    if split.outcome == ALREADY_ON:
        return verdict(UNKNOWN, "the split is on already; whether its tails replay is not traced")
    splitting = [(s, p) for s, p in priced if p.splits]
    if not splitting:
        return verdict(CANNOT_ACT, "adaptive splits none of the MIXED steps: no decode tail runs")
    if len(splitting) < MIN_STEPS:
        return verdict(UNKNOWN, _too_few(len(splitting), "MIXED steps that adaptive splits"))
    layers = x.model.count
    split_host = ev.SPLIT_HOST_PER_LAYER_MS.high * layers
    saved = (ev.SPLIT_HOST_PER_LAYER_MS.high - ev.TAIL_GRAPHS_HOST_PER_LAYER_MS.high) * layers
    gpu = ev.TAIL_GRAPHS_GPU_PER_LAYER_MS
    lows, highs, mids = [], [], []
    for s, p in splitting:
        # The split step as priced (its host with the split's calls, its GPU with the model's
        # change); the graphs take `saved` off the host and add their GPU time.
        host, kernels = s.host_ms + split_host, s.kernel_ms + (p.split_ms - p.unsplit_ms)
        before = max(host, kernels)
        lows.append(max(host - saved, kernels + gpu.low * layers) - before)
        highs.append(max(host - saved, kernels + gpu.high * layers) - before)
        mids.append((lows[-1] + highs[-1]) / 2)
    low, high = _spread(lows, highs)
    host_bound = sum(s.host_bound for s, _ in splitting) * 2 > len(splitting)
    if host_bound:
        reason = (
            f"the split steps are host-bound: the graphs save {saved:.1f} ms of host a step "
            f"({layers} layers x {saved / layers:.3f} ms), seen where the host stays longer "
            "than the GPU work"
        )
    else:
        reason = (
            f"the split steps are GPU-bound: the graphs add {gpu.low * layers:.1f}-"
            f"{gpu.high * layers:.1f} ms of GPU a step ({layers} layers x {gpu.low}-{gpu.high} "
            "ms) and their host saving is hidden"
        )
    return verdict(
        _ranged(low, high),
        reason,
        delta_ms=med(mids),
        low_ms=low,
        high_ms=high,
        wall_ms=split.wall_ms,
        basis=f"per-layer costs measured on the H200: {gpu.source}; the {len(splitting)} split "
        f"steps' host and GPU time measured here; {RANGE_BASIS}",
    )


# ------------------------------------------------------------------ breakable prefill graph


def _replay_host(x: Inputs, replayed: list[Step]) -> tuple[float, float, str] | None:
    """(low, high, where from) of a replayed MIXED step's host ms, or None."""
    if len(replayed) >= MIN_STEPS:
        hosts = [s.host_ms for s in replayed]
        low, high = _quantile(hosts, 0.1), _quantile(hosts, 0.9)
        return low, high, f"measured here over {len(replayed)} replayed MIXED steps (10th-90th)"
    if not x.facts.deepseek_v4:
        return None
    per = ev.DSV4_REPLAY_HOST_PER_LAYER
    layers = x.model.count if x.model else 61
    return per.low * layers, per.high * layers, f"{per.source}, {layers} layers"


def _padding_share(step: Step, buckets: tuple[int, ...]) -> float | None:
    """The rows a replay of this step would add in its bucket of `buckets`, over its rows."""
    rows = step.label.rows
    bucket = bucket_for(rows, buckets)  # None for unknown rows
    return (bucket - rows) / rows if bucket is not None and rows else None


def prefill_graph_verdict(x: Inputs) -> Verdict:
    from sglang_mixgraph.patches.graph_config import PREFILL_BUCKETS

    f = x.facts

    def verdict(outcome, reason, flags=(), **kw) -> Verdict:
        title = "breakable prefill graph"
        return _verdict("prefill_graph", "graph_config", title, outcome, reason, flags, **kw)

    if not (f.deepseek_v4 or f.glm5):
        return verdict(CANNOT_ACT, f"not a DeepSeek-V4 or GLM-5 model ({f.model_name()})")
    if f.disable_cuda_graph:
        return verdict(CANNOT_ACT, "CUDA graphs are off (--disable-cuda-graph)")
    mixed = x.mixed
    if not mixed:
        return verdict(CANNOT_ACT, _no_mixed_reason(x))
    eager = [s for s in mixed if not s.replayed]
    replayed = [s for s in mixed if s.replayed]
    if not eager:
        return verdict(ALREADY_ON, f"all {len(mixed)} MIXED steps replayed a prefill graph")
    if len(eager) < MIN_STEPS:
        return verdict(UNKNOWN, _too_few(len(eager), "eager MIXED steps"))
    # The profiler stretches the eager host; SGLang's log, where given, says by how much.
    r = x.host_scale.factor if x.host_scale else 1.0

    def eager_wall(s: Step) -> float:
        return max(s.wall_ms * r, s.kernel_ms) if x.host_scale else s.wall_ms

    host, kernel = med(s.host_ms for s in eager) * r, med(s.kernel_ms for s in eager)
    wall = med(eager_wall(s) for s in eager)
    # Priced in the buckets `auto` (the flag advised) would capture, where it derives them: the
    # high end without the mixed band, which `auto` drops where the band's capture does not fit.
    auto = auto_prefill_buckets(f)
    pads = [_padding_share(s, auto.banded if auto else f.prefill_graph.buckets) for s in eager]
    pads_hi = [_padding_share(s, auto.narrow) for s in eager] if auto else pads
    pad = med(pads) or 0.0
    factor = ev.DSV4_REPLAY_GPU_FACTOR if f.deepseek_v4 else None
    f_lo, f_hi = (factor.low, factor.high) if factor else (1.0, 1.0)
    h = _replay_host(x, replayed)
    flags = [_setting(PREFILL_BUCKETS, "auto")]
    longest = max((s.label.longest_context_at_least or 0) for s in mixed)
    width_advised = bool(f.deepseek_v4 and longest)
    if width_advised:
        # The low end of the GPU factor is a capture width cut to the live context; steps
        # longer than the width run eagerly. (The live-width indexer would cut the GPU work
        # too, but runs every c4 indexer eagerly: a replay's host grew to 451 ms with it.)
        flags.append(f"--cuda-graph-prefill-max-context {-(-longest // PAGE) * PAGE}")
    # The middle at the factor's low end where the width advised is the live context.
    f_mid = f_lo if width_advised else (f_lo + f_hi) / 2
    if host > kernel:
        if h is None:
            return verdict(
                UNKNOWN,
                f"host-bound ({host:.0f} ms of launch over {kernel:.0f} ms of kernels), but no "
                "replayed MIXED step is in the profile and none was measured for this model",
            )
        reason = (
            f"host-bound: {host:.0f} ms of launch over {kernel:.0f} ms of kernels; a replayed "
            f"step launches about {(h[0] + h[1]) / 2:.0f} ms"
        )
    else:
        h = h or (0.0, host, "")  # a replay launches no more than the eager step
        reason = (
            f"GPU-bound: {kernel:.0f} ms of kernels over {host:.0f} ms of launch; a replay "
            f"saves launch time only and pads the step to its bucket (+{pad:.0%} rows)"
        )
    if len(eager) < len(mixed):
        reason += f"; {len(eager)} of {len(mixed)} MIXED steps ran eagerly"
    lows, highs, mids = [], [], []
    for step, p, p_hi in zip(eager, pads, pads_hi, strict=True):
        gpu = step.kernel_ms * (1 + (p or 0.0))  # padded to its bucket (0 where unknown)
        lows.append(max(h[0], gpu * f_lo) - eager_wall(step))
        highs.append(max(h[1], step.kernel_ms * (1 + (p_hi or 0.0)) * f_hi) - eager_wall(step))
        mids.append(max((h[0] + h[1]) / 2, gpu * f_mid) - eager_wall(step))
    low, high = _spread(lows, highs)
    served = {}
    if x.served is not None and wall > 0:
        # Only the prefill phase gets faster: the decode tail after it replays in both.
        change = x.served.share * med(mids) / wall
        reason += (
            f"; at the load's prefill share of {x.served.share:.2f}, about {change:+.0%} of "
            "the time per output token"
        )
        served = {"prefill_share": x.served.share, "time_per_token_change": change}
    gpu_src = factor.source if factor else "padding only (the capture width's cost is unmeasured)"
    padded = "padded to the server's prefill buckets"
    if auto:
        padded = (
            f"padded to the {len(auto.banded)} prefill buckets auto derives for this server "
            f"(up to {auto.banded[-1]})"
        )
        if auto.banded != auto.narrow:
            band = len(auto.banded) - len(auto.narrow)
            padded += (
                f", the high end to the {len(auto.narrow)} left where the {band} mixed-band "
                "buckets' capture does not fit (`plan` says whether it does)"
            )
    elif not f.prefill_graph.buckets:
        padded = "unpadded (no bucket list known without the server)"
    return verdict(
        _ranged(low, high),
        reason,
        tuple(flags),
        delta_ms=med(mids),
        low_ms=low,
        high_ms=high,
        wall_ms=wall,
        basis=f"{_eager_basis(x.host_scale)}; replay host: {h[2] or 'at most the eager host'}; "
        f"replay GPU: the eager kernels {padded}, times {gpu_src}. "
        "Run `sglang-mixgraph plan` with the server's launch arguments and these settings "
        "first: its capture estimate decides whether `auto` turns the graph on; the context "
        f"width is the longest the profile saw, set it to the longest you want replayed; "
        f"{RANGE_BASIS}",
        detail={
            "eager_steps": len(eager),
            "replayed_steps": len(replayed),
            "padding": pad,
            "host_factor": x.host_scale.factor if x.host_scale else None,
            **served,
        },
    )


def _eager_basis(scale: HostScale | None) -> str:
    if scale is None:
        return (
            "eager MIXED steps measured here under the profiler, which slows their host (1.4x "
            "on an H100 run), so a host-bound step's gain is overstated: give the server's log "
            "(--server-log) to price the host unprofiled"
        )
    return (
        f"eager MIXED steps measured here, each one's wall scaled by {scale.factor:.2f} to its "
        f"unprofiled host: SGLang's log spaced {scale.unprofiled_batches} eager MIXED batches "
        f"{scale.unprofiled_ms:.0f} ms apart before the profile and {scale.profiled_batches} "
        f"{scale.profiled_ms:.0f} ms apart inside it"
    )


# ------------------------------------------------------------------ read-done


def read_done_verdict(x: Inputs) -> Verdict:
    def verdict(outcome, reason, **kw) -> Verdict:
        from sglang_mixgraph.patches.replay_read_done import FLAG

        flags = (_setting(FLAG, "1"),)
        title = "replay read-done"
        return _verdict("replay_read_done", "replay_read_done", title, outcome, reason, flags, **kw)

    if not x.facts.deepseek_v4:
        return verdict(CANNOT_ACT, f"not a DeepSeek-V4 model ({x.facts.model_name()})")
    replayed = [s for s in x.steps if s.mode in ("MIXED", "EXTEND") and s.replayed]
    if on := _on_in(replayed, "replay_read_done"):
        return verdict(ALREADY_ON, f"its hooks ran in {on} of {len(replayed)} replayed steps")
    if not replayed:
        return verdict(
            CANNOT_ACT,
            "no prefill or MIXED step replayed a breakable prefill graph (prefill graph "
            f"{x.facts.prefill_graph.backend}); it acts in those replays only, and SGLang's "
            "eager runner publishes read-done itself",
        )
    idle = [s.gpu_idle_after_ms for s in replayed if s.gpu_idle_after_ms is not None]
    if not idle:
        return verdict(UNKNOWN, "no step followed a replayed step in the profile")
    if len(idle) < MIN_STEPS:
        return verdict(UNKNOWN, _too_few(len(idle), "replayed steps followed by another"))
    gap = med(idle)
    wall = med(s.wall_ms for s in x.mixed) if x.mixed else None
    if gap < IDLE_FLOOR_MS:
        return verdict(
            NO_GAIN,
            f"the GPU does not wait after a replayed step (median idle {gap:.3f} ms)",
            delta_ms=0.0,
            low_ms=-gap,
            high_ms=0.0,
            wall_ms=wall,
        )
    return verdict(
        MAY_PAY,
        f"the GPU idles {gap:.2f} ms (median) between a replayed step's last kernel and the "
        "next step's first: at most that is what the whole-forward barrier costs",
        low_ms=-gap,
        high_ms=0.0,
        wall_ms=wall,
        basis=f"GPU idle time after {len(idle)} replayed steps, measured here (an upper bound)",
    )


def all_verdicts(x: Inputs) -> list[Verdict]:
    if not x.facts.architectures:  # traces read without a server or a config.json
        why = "the model is not known: give its config.json with --model-path"
        return [
            Verdict(id_, patch, title, UNKNOWN, why)
            for id_, patch, title in (
                ("mixed_split", "mixed_split", "mixed split"),
                ("prefill_graph", "graph_config", "breakable prefill graph"),
                ("split_tail_graphs", "mixed_split", "decode-tail graphs"),
                ("replay_read_done", "replay_read_done", "replay read-done"),
            )
        ]
    split, priced = split_verdict(x)
    return [
        split,
        prefill_graph_verdict(x),
        tail_graphs_verdict(x, split, priced),
        read_done_verdict(x),
    ]


def switch_on_order(verdicts: list[Verdict]) -> list[Verdict]:
    """What to switch on first: those that pay, then those that may, larger gains first."""
    rank = {PAYS: 0, MAY_PAY: 1}
    chosen = [v for v in verdicts if v.outcome in rank]
    return sorted(chosen, key=lambda v: (rank[v.outcome], v.delta_ms or v.low_ms or 0.0))
