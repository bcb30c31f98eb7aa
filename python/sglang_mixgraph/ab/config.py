"""The A/B configuration: one TOML file, read with the standard library (tomllib).

Sections: `[server]` (shared launch: model, SGLang server arguments, environment, GPU count,
port, health timeout, the launch command and a launch prefix: a wrapper put in front of it),
`[[arm]]` (two or more: name, environment, extra server arguments, its own launch prefix, or
`url` to attach to a running server), `[sweep]` (the load points: concurrencies and request
rates, the `sglang.benchmark.serving` workload, prompt and warm-up counts, repeats, or blocks:
a visit order run whole on one machine, and a discarded warm visit), `[[shape]]`
(several input/output lengths in one run), `[slo]` (latency SLOs for bench_serving's goodput),
`[gsm8k]` (SGLang's GSM8K eval and its threshold), `[[gate]]` (ratio gates
between two different arms), `[run]` (`offline`), and top-level `note` (for the report) and
`pairs` (ratios of two candidates). Every value is checked once, before anything runs: each
key's type and range by the pydantic models of config_schema.py (finite numbers in range,
ports 1-65535, http(s) URLs, counts bounded by MAX_* so that a plan stays small), then here
what spans keys or sections: gates against the arms and load points (with bounds some ratio
can meet), blocks, pairs, the plan's size. Every problem is a `ConfigError` with one line
naming the key, the value and what is allowed, so the command can print it without a
traceback.

`cell_settings` turns one measurement into the exact settings that key it on disk: a run
directory is resumed by these keys, so anything that changes what is measured is in them.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sglang_mixgraph.ab.config_schema import (
    MAX_COUNT,
    SLO_KEYS,
    ArmTable,
    ConfigError,
    GateTable,
    Gsm8kTable,
    ShapeTable,
    SharedPrefixTable,
    SloTable,
    SweepTable,
    validated,
)
from sglang_mixgraph.ab.config_schema import url_problem as url_problem  # for the CLI's --url

# Without `[server] command` a server is `python -m sglang.launch_server` run by the interpreter
# that runs this tool (the one SGLang is installed in); the key records it by this label, so a
# run directory resumes from another virtual environment.
LAUNCH_MODULE = ("-m", "sglang.launch_server")
DEFAULT_LAUNCH_LABEL = ("<this python>", *LAUNCH_MODULE)
# After a launch prefix (a wrapper such as `bash tools/gpu-upstream/device.sh` that prepares a
# machine, then runs "$@") the interpreter is named, not this one: the wrapper may install or
# select its own Python, so it resolves `python3` on its own PATH ([server] launch_python
# names another one).
PREFIXED_PYTHON = "python3"
# Goodput needs SLOs: bench_serving reports these only with --goodput ([slo]).
GOODPUT_METRICS = ("request_goodput", "slo_attainment")
CONCURRENCY = "concurrency"
RATE = "rate"
DEFAULT_JUDGE = "no_regression"  # of a gate (config_schema.JUDGES)
SHARED_PREFIX_DATASET = "generated-shared-prefix"
# bench_serving runs several turns of a conversation only through these backends
# (sglang.benchmark.serving.MULTI_TURN_BACKENDS; it asserts it in wrap_multi_turn_request_func).
MULTI_TURN_BACKENDS = ("sglang-oai-chat", "vllm-chat", "lmdeploy-chat")
# The cells of a whole plan, bounded as every count is (config_schema.MAX_COUNT).
MAX_CELLS = 10_000
# How deep tables and arrays may nest in the file ([[arm]] env.NAME, the deepest key, is 3).
MAX_DEPTH = 16


@dataclass(frozen=True)
class Server:
    model_path: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    health_timeout_s: float = 3600.0
    stop_timeout_s: float = 60.0
    command: tuple[str, ...] = ()  # empty: DEFAULT_LAUNCH_LABEL
    allow_env: tuple[str, ...] = ()
    launch_prefix: tuple[str, ...] = ()  # put in front of the launch command
    launch_python: str | None = None  # None: this python, or PREFIXED_PYTHON after a prefix


@dataclass(frozen=True)
class Arm:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    url: str | None = None
    gpus: int | None = None
    launch_prefix: tuple[str, ...] | None = None  # None: [server] launch_prefix; (): none


@dataclass(frozen=True)
class Shape:
    """One input/output length pair (`[[shape]]`, or `[sweep]`'s lengths when there is none)."""

    name: str
    input_len: int
    output_len: int
    range_ratio: float


@dataclass(frozen=True)
class SharedPrefix:
    """bench_serving's generated-shared-prefix workload: `num_groups` system prompts, each
    shared by `prompts_per_group` requests of `num_turns` questions. The defaults are
    bench_serving's own (`--gsp-*` in sglang.benchmark.serving.cli_main)."""

    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 256
    num_turns: int = 1
    range_ratio: float = 1.0

    @property
    def requests(self) -> int:
        """What bench_serving sends: one request (conversation) per group and prompt; it
        ignores --num-prompts for this dataset."""
        return self.num_groups * self.prompts_per_group

    def flags(self) -> list[str]:
        """The `--gsp-*` flags that send this workload."""
        argv = []
        for key, value in asdict(self).items():
            argv += [f"--gsp-{key.replace('_', '-')}", str(value)]
        return argv


@dataclass(frozen=True)
class Point:
    """One load point of one shape: a `--max-concurrency` or a `--request-rate` (req/s)."""

    shape: str
    kind: str  # CONCURRENCY or RATE
    value: float  # an int for a concurrency

    def describe(self) -> str:
        if self.kind == CONCURRENCY:
            return f"concurrency={int(self.value)}"
        return f"request_rate={self.value:g}"


@dataclass(frozen=True)
class Sweep:
    concurrencies: tuple[int, ...]
    request_rates: tuple[float, ...] = ()
    backend: str = "sglang"
    dataset: str = "random"
    dataset_path: str = ""
    input_len: int = 1024
    output_len: int = 1024
    range_ratio: float = 1.0
    shapes: tuple[Shape, ...] = ()  # filled by parse_config: [[shape]], else the lengths above
    # Prompts: num_prompts when set, else max(min_prompts, prompts_per_concurrency x
    # concurrency); the upstream PRs' runs sent 6x concurrency after a 2x warm-up.
    num_prompts: int | None = None
    prompts_per_concurrency: int = 6
    min_prompts: int = 64
    warmup_requests: int | None = None  # None: warmup_per_concurrency x concurrency
    warmup_per_concurrency: int = 2
    # A request-rate point has no concurrency: it sends what arrives in rate_duration_s
    # (at least min_prompts), after the arrivals of warmup_per_concurrency seconds.
    rate_duration_s: float = 60.0
    # bench_serving --flush-cache: the prefix cache is emptied after the warm-up, so a cell
    # does not reuse the prompts an earlier cell (same seed) left in the radix cache.
    flush_cache: bool = True
    seed: int = 42
    repeats: int = 3  # A B, B A, A B: the fewest that give an interval worth reading
    cell_timeout_s: float = 3600.0
    extra_args: tuple[str, ...] = ()
    # The generated-shared-prefix dataset's workload (None for every other dataset).
    shared_prefix: SharedPrefix | None = None
    # Blocks: `block` is the visit order of one block (arm names, each arm equally often), run
    # whole on one machine; `repeats` is then blocks x visits per arm. Without `block`, each
    # repeat is a block of one visit per arm (A B, then B A).
    block: tuple[str, ...] = ()
    blocks: int | None = None
    # One visit of this arm served first on a machine that has not served the run, not counted.
    warm_visit: str | None = None

    def visits_per_block(self) -> int:
        """Visits of each arm in one block."""
        return self.block.count(self.block[0]) if self.block else 1

    def block_of(self, repeat: int) -> int:
        return repeat // self.visits_per_block()

    def prompts(self, point: Point) -> int:
        if self.shared_prefix is not None:
            return self.shared_prefix.requests
        if self.num_prompts is not None:
            return self.num_prompts
        if point.kind == RATE:
            return max(self.min_prompts, math.ceil(point.value * self.rate_duration_s))
        return max(self.min_prompts, self.prompts_per_concurrency * int(point.value))

    def completions(self, point: Point) -> int:
        """The `completed` count of a cell where every request succeeds: bench_serving counts
        each turn of a multi-turn conversation."""
        turns = self.shared_prefix.num_turns if self.shared_prefix is not None else 1
        return self.prompts(point) * turns

    def warmup(self, point: Point) -> int:
        if self.warmup_requests is not None:
            return self.warmup_requests
        per = math.ceil(point.value) if point.kind == RATE else int(point.value)
        return self.warmup_per_concurrency * per

    def shape(self, name: str) -> Shape:
        for shape in self.shapes:
            if shape.name == name:
                return shape
        raise KeyError(name)

    def points(self) -> list[Point]:
        """Every load point in run order: per shape, the concurrencies, then the rates."""
        return [
            Point(shape.name, kind, value)
            for shape in self.shapes
            for kind, values in ((CONCURRENCY, self.concurrencies), (RATE, self.request_rates))
            for value in values
        ]


@dataclass(frozen=True)
class Slo:
    """Latency SLOs in ms (bench_serving --goodput); empty: no goodput."""

    limits: dict[str, float] = field(default_factory=dict)  # [slo] key -> ms
    # The report names, per arm and shape, the highest concurrency whose mean SLO attainment
    # (the fraction of requests meeting every SLO) is at least this.
    attainment: float = 0.99

    def goodput_args(self) -> list[str]:
        return [f"{SLO_KEYS[key]}:{value:g}" for key, value in self.limits.items()]


@dataclass(frozen=True)
class Gsm8k:
    enabled: bool = True
    num_examples: int = 200
    num_shots: int = 5
    parallel: int = 128
    max_tokens: int = 512
    threshold: float | None = None
    data_path: str | None = None
    arms: tuple[str, ...] = ()  # empty: every arm
    timeout_s: float = 3600.0
    # SGLang's CI compares the GSM8K score itself with its threshold: the same by default.
    judge: str = "mean"  # the threshold against the score or its Wilson interval (JUDGES)


@dataclass(frozen=True)
class Gate:
    metric: str
    candidate: str
    baseline: str
    point: Point
    min_ratio: float | None = None
    max_ratio: float | None = None
    judge: str = DEFAULT_JUDGE  # the bounds against the ratio's 95% interval (JUDGES)
    several_shapes: bool = False  # name the shape in describe()

    def describe(self) -> str:
        bounds = []
        if self.min_ratio is not None:
            bounds.append(f">= {self.min_ratio:g}x")
        if self.max_ratio is not None:
            bounds.append(f"<= {self.max_ratio:g}x")
        p = self.point
        at = f"concurrency {int(p.value)}" if p.kind == CONCURRENCY else f"request rate {p.value:g}"
        if self.several_shapes:
            at += f" of shape {p.shape}"
        return f"{self.metric} {self.candidate}/{self.baseline} at {at} {' and '.join(bounds)}"


@dataclass(frozen=True)
class Config:
    server: Server
    arms: tuple[Arm, ...]
    sweep: Sweep
    gsm8k: Gsm8k
    gates: tuple[Gate, ...] = ()
    note: str | None = None  # shown under the report's title (machine, build, caveats)
    slo: Slo = field(default_factory=Slo)
    # Ratios reported besides each candidate's to the baseline: (candidate, baseline) arms.
    pairs: tuple[tuple[str, str], ...] = ()
    offline: bool = False  # [run] offline: a fetch from the network is refused before a run

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(name)


# ---------------------------------------------------------------- reading


def _given(table: BaseModel) -> dict[str, Any]:
    """The keys a validated table gave, as dataclass arguments (the dataclasses hold defaults)."""
    return table.model_dump(exclude_none=True)


def _check_unique_names(names: list[str], section: str) -> None:
    seen: set[str] = set()  # linear: a generated file may list thousands of entries
    for name in names:
        if name in seen:
            raise ConfigError(f"{section}: the name {name!r} is used twice")
        seen.add(name)


def _arms(tables: list[ArmTable]) -> tuple[Arm, ...]:
    arms = tuple(Arm(**_given(table)) for table in tables)
    _check_unique_names([a.name for a in arms], "[[arm]]")
    return arms


def _sweep(table: SweepTable) -> Sweep:
    """`[sweep]` with the rules between its keys; its one shape from `input_len`/`output_len`."""
    where = "[sweep]"
    if table.concurrencies is None and table.request_rates is None:
        raise ConfigError(f"{where}: missing key 'concurrencies' (or 'request_rates')")
    if not table.concurrencies and not table.request_rates:
        raise ConfigError(f"{where} concurrencies: give at least one (or a request rate)")
    if table.num_prompts is not None:
        for other in ("prompts_per_concurrency", "min_prompts"):
            if getattr(table, other) is not None:
                raise ConfigError(f"{where}: give num_prompts (a count) or {other}, not both")
    if table.warmup_requests is not None and table.warmup_per_concurrency is not None:
        raise ConfigError(
            f"{where}: give warmup_requests (a count) or warmup_per_concurrency, not both"
        )
    given = _given(table)
    given.pop("shared_prefix", None)
    given["concurrencies"] = tuple(sorted(table.concurrencies or ()))
    given["request_rates"] = tuple(sorted(table.request_rates or ()))
    if table.block is not None:
        if not table.block:
            raise ConfigError(f"{where} block: give the visit order of one block (arm names)")
        if table.repeats is not None:
            raise ConfigError(f"{where}: give blocks (with block) or repeats, not both")
        given.setdefault("blocks", 1)
    elif table.blocks is not None:
        raise ConfigError(f"{where} blocks: needs block (the visit order of one block)")
    sweep = Sweep(**given)
    if table.shared_prefix is not None or sweep.dataset == SHARED_PREFIX_DATASET:
        return _shared_prefix(table, sweep)
    shape = Shape(
        f"in{sweep.input_len}_out{sweep.output_len}",
        sweep.input_len,
        sweep.output_len,
        sweep.range_ratio,
    )
    return replace(sweep, shapes=(shape,))


def _shared_prefix(table: SweepTable, sweep: Sweep) -> Sweep:
    """The generated-shared-prefix workload: its counts and lengths are `[sweep] shared_prefix`
    (bench_serving's defaults where not given), and nothing else may say otherwise."""
    where = "[sweep]"
    if table.dataset not in (None, SHARED_PREFIX_DATASET):
        raise ConfigError(
            f"{where} shared_prefix: is the workload of dataset {SHARED_PREFIX_DATASET!r}, "
            f"not of {table.dataset!r}"
        )
    for key in ("input_len", "output_len", "range_ratio"):
        if getattr(table, key) is not None:
            raise ConfigError(
                f"{where} {key}: the shared-prefix workload takes its lengths from [sweep] "
                "shared_prefix (system_prompt_len, question_len, output_len, range_ratio)"
            )
    for key in ("num_prompts", "prompts_per_concurrency", "min_prompts"):
        if getattr(table, key) is not None:
            raise ConfigError(
                f"{where} {key}: the shared-prefix workload sends num_groups x "
                "prompts_per_group requests ([sweep] shared_prefix); bench_serving ignores "
                "--num-prompts for it"
            )
    workload = SharedPrefix(**_given(table.shared_prefix or SharedPrefixTable()))
    for flag in workload.flags()[::2]:
        if any(arg == flag or arg.startswith(f"{flag}=") for arg in sweep.extra_args):
            key = flag.removeprefix("--gsp-").replace("-", "_")
            raise ConfigError(f"{where} extra_args: {flag} is set by [sweep] shared_prefix {key}")
    if workload.num_turns > 1 and sweep.backend not in MULTI_TURN_BACKENDS:
        raise ConfigError(
            f"{where} shared_prefix num_turns {workload.num_turns}: bench_serving sends several "
            f"turns only through a chat backend ({', '.join(MULTI_TURN_BACKENDS)}); [sweep] "
            f"backend is {sweep.backend!r}"
        )
    # One shape: the first turn's target lengths, system prompt and question together.
    shape = Shape(
        f"prefix{workload.system_prompt_len}_q{workload.question_len}_out{workload.output_len}",
        workload.system_prompt_len + workload.question_len,
        workload.output_len,
        workload.range_ratio,
    )
    return replace(sweep, dataset=SHARED_PREFIX_DATASET, shared_prefix=workload, shapes=(shape,))


def _shapes(tables: list[ShapeTable], sweep_table: SweepTable, sweep: Sweep) -> Sweep:
    """`[[shape]]` entries replace `[sweep]`'s one pair of lengths."""
    if sweep.shared_prefix is not None:
        raise ConfigError(
            "[[shape]]: the shared-prefix workload has its lengths in [sweep] shared_prefix"
        )
    if not tables:
        raise ConfigError("[[shape]]: give at least one, or leave it out")
    for key in ("input_len", "output_len"):
        if getattr(sweep_table, key) is not None:
            raise ConfigError(f"[sweep] {key}: with [[shape]] entries, give the lengths there")
    shapes = tuple(
        Shape(
            t.name or f"in{t.input_len}_out{t.output_len}",
            t.input_len,
            t.output_len,
            sweep.range_ratio if t.range_ratio is None else t.range_ratio,
        )
        for t in tables
    )
    _check_unique_names([s.name for s in shapes], "[[shape]]")
    return replace(sweep, shapes=shapes)


def _slo(table: SloTable) -> Slo:
    limits = {key: value for key in SLO_KEYS if (value := getattr(table, key)) is not None}
    if not limits:
        raise ConfigError(f"[slo]: give at least one of {', '.join(SLO_KEYS)}")
    if table.attainment is None:
        return Slo(limits)
    return Slo(limits, table.attainment)


def _gsm8k(table: Gsm8kTable, arm_names: list[str]) -> Gsm8k:
    for name in table.arms or ():
        if name not in arm_names:
            raise ConfigError(f"[gsm8k] arms: no arm named {name!r}")
    return Gsm8k(**_given(table))


def _gate_point(table: GateTable, where: str, sweep: Sweep) -> Point:
    """The gate's load point: its concurrency or request rate, of its shape."""
    if (table.concurrency is None) == (table.request_rate is None):
        raise ConfigError(f"{where}: give concurrency or request_rate (one of them)")
    names = [s.name for s in sweep.shapes]
    if table.shape is not None:
        if table.shape not in names:
            raise ConfigError(f"{where} shape: no shape named {table.shape!r} (shapes: {names})")
        shape = table.shape
    elif len(names) > 1:
        raise ConfigError(f"{where}: missing key 'shape' (the run has shapes {names})")
    else:
        shape = names[0]
    if table.request_rate is None:
        if table.concurrency not in sweep.concurrencies:
            raise ConfigError(
                f"{where} concurrency {table.concurrency}: not in [sweep] concurrencies "
                f"{list(sweep.concurrencies)}"
            )
        return Point(shape, CONCURRENCY, table.concurrency)
    if table.request_rate not in sweep.request_rates:
        raise ConfigError(
            f"{where} request_rate {table.request_rate:g}: not in [sweep] request_rates "
            f"{list(sweep.request_rates)}"
        )
    return Point(shape, RATE, table.request_rate)


def _gates(
    tables: list[GateTable], arm_names: list[str], sweep: Sweep, slo: Slo | None
) -> tuple[Gate, ...]:
    gates = []
    for i, table in enumerate(tables):
        where = f"[[gate]] #{i + 1}"
        if table.metric in GOODPUT_METRICS and slo is None:
            raise ConfigError(
                f"{where} metric {table.metric!r}: needs the SLOs of an [slo] section"
            )
        for key in ("candidate", "baseline"):
            if getattr(table, key) not in arm_names:
                raise ConfigError(f"{where} {key}: no arm named {getattr(table, key)!r}")
        if table.candidate == table.baseline:
            raise ConfigError(
                f"{where}: candidate and baseline are both {table.candidate!r}; a gate "
                "compares two different arms"
            )
        point = _gate_point(table, where, sweep)
        if table.min_ratio is None and table.max_ratio is None:
            raise ConfigError(f"{where}: give min_ratio, max_ratio or both")
        low, high = table.min_ratio, table.max_ratio
        if low is not None and high is not None and low > high:
            raise ConfigError(
                f"{where}: min_ratio {low:g} is above max_ratio {high:g}; no ratio can pass"
            )
        blocks = sweep.repeats // sweep.visits_per_block()
        if table.judge == "confirmed" and blocks < 2:
            # The ratio's interval is over blocks (each repeat one without a block order).
            raise ConfigError(
                f"{where} judge 'confirmed': passes only on a 95% interval, which needs at "
                f"least 2 repeats (blocks with a block order); the sweep has {blocks}"
            )
        gates.append(
            Gate(
                metric=table.metric,
                candidate=table.candidate,
                baseline=table.baseline,
                point=point,
                min_ratio=table.min_ratio,
                max_ratio=table.max_ratio,
                judge=table.judge or DEFAULT_JUDGE,
                several_shapes=len(sweep.shapes) > 1,
            )
        )
    return tuple(gates)


def parse_config(data: dict[str, Any], *, accuracy_only: bool = False) -> Config:
    """The configuration of a TOML document: the schema's checks, then those across sections."""
    file = validated(data)
    arms = _arms(file.arm)
    minimum = 1 if accuracy_only else 2
    if len(arms) < minimum:
        raise ConfigError(
            f"[[arm]]: give at least {minimum} arm{'s' if minimum > 1 else ''} "
            f"(found {len(arms)})" + ("" if accuracy_only else "; one arm: --accuracy-only")
        )
    server = Server(**_given(file.server))
    launched = [a.name for a in arms if a.url is None]
    if launched and server.model_path is None:
        raise ConfigError(
            f"[server] model_path: needed to launch arm {launched[0]!r} (or give the arm a url)"
        )
    names = [a.name for a in arms]
    if file.sweep is not None:
        sweep = _sweep(file.sweep)
        if file.shape is not None:
            sweep = _shapes(file.shape, file.sweep, sweep)
    elif accuracy_only:
        sweep = _sweep(SweepTable(concurrencies=(1,)))
    else:
        raise ConfigError("config: missing section [sweep]")
    sweep = _blocks(sweep, names)
    _check_plan_size(sweep, len(arms), accuracy_only)
    slo = _slo(file.slo) if file.slo is not None else None
    gsm8k = _gsm8k(file.gsm8k, names)
    if accuracy_only and (not gsm8k.enabled or gsm8k.threshold is None):
        raise ConfigError("[gsm8k]: --accuracy-only needs enabled = true and a threshold")
    return Config(
        server=server,
        arms=arms,
        sweep=sweep,
        gsm8k=gsm8k,
        gates=_gates(file.gate, names, sweep, slo),
        note=file.note,
        slo=slo or Slo(),
        pairs=_pairs(file.pairs, names),
        offline=bool(file.run.offline),  # [run]: how to run, not what is measured (network.py)
    )


def _check_plan_size(sweep: Sweep, arms: int, accuracy_only: bool) -> None:
    """The plan and every cell's request counts stay small enough to list and to send."""
    if accuracy_only:
        return
    points = sweep.points()
    cells = arms * sweep.repeats * len(points)
    if cells > MAX_CELLS:
        raise ConfigError(
            f"[sweep]: {arms} arms x {sweep.repeats} repeats x {len(points)} load points is "
            f"{cells:,} cells; at most {MAX_CELLS:,}"
        )
    for point in points:
        for what, count in (("prompts", sweep.prompts(point)), ("warm-up", sweep.warmup(point))):
            if count > MAX_COUNT:
                raise ConfigError(
                    f"[sweep]: {point.describe()} sends {count:,} {what} requests; at most "
                    f"{MAX_COUNT:,} (num_prompts, prompts_per_concurrency, rate_duration_s, "
                    "warmup_*)"
                )


def _blocks(sweep: Sweep, names: list[str]) -> Sweep:
    """Checks `block` against the arms; the repeats are then blocks x visits per arm."""
    where = "[sweep]"
    if sweep.warm_visit is not None and sweep.warm_visit not in names:
        raise ConfigError(f"{where} warm_visit: no arm named {sweep.warm_visit!r} (arms: {names})")
    if not sweep.block:
        return sweep
    for name in sweep.block:
        if name not in names:
            raise ConfigError(f"{where} block: no arm named {name!r} (arms: {names})")
    left_out = [n for n in names if n not in sweep.block]
    if left_out:
        raise ConfigError(f"{where} block: arm {left_out[0]!r} is not in it; every arm must be")
    counts = {n: sweep.block.count(n) for n in names}
    if len(set(counts.values())) > 1:
        raise ConfigError(
            f"{where} block: not balanced, every arm must appear equally often "
            f"({', '.join(f'{n} {c}x' for n, c in counts.items())})"
        )
    assert sweep.blocks is not None
    return replace(sweep, repeats=sweep.blocks * sweep.visits_per_block())


def _pairs(items: tuple[str, ...], names: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for i, item in enumerate(items):
        where = f"pairs[{i}] {item!r}"
        candidate, sep, baseline = item.partition("/")
        if not sep or not candidate or not baseline:
            raise ConfigError(f"{where}: expected CANDIDATE/BASELINE")
        for name in (candidate, baseline):
            if name not in names:
                raise ConfigError(f"{where}: no arm named {name!r} (arms: {names})")
        if candidate == baseline:
            raise ConfigError(f"{where}: an arm against itself")
        pairs.append((candidate, baseline))
    return tuple(pairs)


def _nests_deeper(data: Any, limit: int) -> bool:
    """Whether tables and arrays in `data` nest more than `limit` levels below it; iterative,
    so that a document nested 100,000 deep cannot overflow the stack here."""
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if not isinstance(value, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in value)
    return False


def _too_deep(path: Path) -> ConfigError:
    return ConfigError(
        f"{path}: tables and arrays nested more than {MAX_DEPTH} levels deep (no key of a "
        "configuration nests deeper than 3)"
    )


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = path.read_bytes()
        document = tomllib.loads(data.decode("utf-8"))
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise _too_deep(path) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{path}: line {line}: byte 0x{data[e.start]:02x} is not UTF-8 (TOML is UTF-8 "
            "text: save the file as UTF-8)"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    # A dotted table name nests without recursing in tomllib, but copying, validating and
    # hashing the document all recurse: refused here, before any of them.
    if _nests_deeper(document, MAX_DEPTH):
        raise _too_deep(path)
    return document


def with_counts(raw: dict[str, Any], sweep: Sweep) -> dict[str, Any]:
    """`raw` with the prompt and warm-up counts it left to the defaults written out.

    run.json keeps what a run measured: a later change of a default must not make
    `ab report` look for cells under other keys (and call them missing).
    """
    table = dict(raw.get("sweep", {}))
    if "num_prompts" not in table and sweep.shared_prefix is None:
        table.setdefault("prompts_per_concurrency", sweep.prompts_per_concurrency)
        table.setdefault("min_prompts", sweep.min_prompts)
    if "warmup_requests" not in table:
        table.setdefault("warmup_per_concurrency", sweep.warmup_per_concurrency)
    if sweep.request_rates:
        table.setdefault("rate_duration_s", sweep.rate_duration_s)
    return {**raw, "sweep": table}


# ---------------------------------------------------------------- cell keys


def launch_prefix(config: Config, arm: Arm) -> tuple[str, ...]:
    """The wrapper in front of an arm's launch: its own, else `[server] launch_prefix`."""
    return config.server.launch_prefix if arm.launch_prefix is None else arm.launch_prefix


def launch_command(server: Server, prefixed: bool) -> tuple[str, ...] | None:
    """The command that follows the prefix; None: this tool's python -m sglang.launch_server."""
    if server.command:
        return server.command
    if server.launch_python is not None:
        return (server.launch_python, *LAUNCH_MODULE)
    if prefixed:
        return (PREFIXED_PYTHON, *LAUNCH_MODULE)
    return None


def arm_settings(config: Config, arm: Arm) -> dict[str, Any]:
    """What identifies the server an arm measures: its URL, or everything that launches it."""
    if arm.url is not None:
        # The server was started elsewhere; the env is the user's label of what it runs.
        return {"name": arm.name, "url": arm.url, "env": dict(arm.env)}
    s = config.server
    prefix = launch_prefix(config, arm)
    settings = {
        "name": arm.name,
        "command": list(launch_command(s, bool(prefix)) or DEFAULT_LAUNCH_LABEL),
        "model_path": s.model_path,
        "args": list(s.args) + list(arm.args),
        "env": {**s.env, **arm.env},
    }
    if prefix:
        # A wrapper changes what runs (what it installs, which python): part of the key. Only
        # then is the field present, so the cells of runs without a prefix keep their keys.
        settings["launch_prefix"] = list(prefix)
    return settings


def cell_settings(config: Config, arm: Arm, point: Point, repeat: int) -> dict[str, Any]:
    sw = config.sweep
    shape = sw.shape(point.shape)
    bench: dict[str, Any] = {
        "backend": sw.backend,
        "dataset": sw.dataset,
        "dataset_path": sw.dataset_path,
        "input_len": shape.input_len,
        "output_len": shape.output_len,
        "range_ratio": shape.range_ratio,
        "num_prompts": sw.prompts(point),
        "warmup_requests": sw.warmup(point),
        "flush_cache": sw.flush_cache,
        "seed": sw.seed,
        "extra_args": list(sw.extra_args),
    }
    if sw.shared_prefix is not None:
        # Only with that workload: the keys of every other dataset's cells stay what they were.
        bench["shared_prefix"] = asdict(sw.shared_prefix)
    if config.slo.limits:
        # Only with SLOs: the keys of runs without them stay what they were.
        bench["goodput"] = config.slo.goodput_args()
    settings: dict[str, Any] = {"kind": "bench", "arm": arm_settings(config, arm)}
    if point.kind == CONCURRENCY:
        settings["concurrency"] = int(point.value)
    else:
        settings["request_rate"] = point.value
    return {**settings, "repeat": repeat, "bench": bench}


def gsm8k_settings(config: Config, arm: Arm) -> dict[str, Any]:
    g = config.gsm8k
    return {
        "kind": "gsm8k",
        "arm": arm_settings(config, arm),
        "num_examples": g.num_examples,
        "num_shots": g.num_shots,
        "parallel": g.parallel,
        "max_tokens": g.max_tokens,
        "data_path": g.data_path,
    }


def settings_key(settings: dict[str, Any]) -> str:
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
