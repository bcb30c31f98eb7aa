"""The A/B configuration as frozen pydantic models, one per TOML section; its errors as one line.

Each section (`[server]`, `[[arm]]`, `[sweep]`, `[[shape]]`, `[slo]`, `[gsm8k]`, `[tokens]`,
`[[gate]]`, `[run]`) is a model that says, key by key, what a value may be and its default: strict types
(an integer is not `true`, `1.0` or `"1"`), no unknown key, numbers finite and in range, counts
bounded (MAX_*) so that a plan stays small, ports, URLs, names and vocabularies. `Config`, the
whole file, is what the run uses; config.py checks what spans keys or sections and sets the
derived values (shapes, blocks, the workload) in copies, as the models are frozen.
`validated` turns pydantic's first error into a `ConfigError`: one line naming the key as
the file writes it (`[sweep] num_prompts`, `[[arm]] #2 name`, `arm 'split' url`), the value
and what is allowed, so the command prints it without a traceback.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from sglang_mixgraph.resolution.serving_client import url_problem

# Bounds that keep a mistyped count from planning (or sending) billions of anything: a count
# of prompts, tokens, requests or examples; repeats and blocks; a timeout (a week).
MAX_COUNT = 10_000_000
MAX_REPEATS = 1000
MAX_TIMEOUT_S = 7 * 86400.0
MAX_SEED = 2**32 - 1  # bench_serving seeds numpy with it
# Words of one list (server arguments, extra_args, a command): real ones are tens. argparse
# parses n options in time n^2 (100,000 took minutes); refused at once above this.
MAX_WORDS = 1000
# Metrics a gate may compare; the report shows the same names.
GATE_METRICS = (
    "output_throughput_per_gpu",
    "output_throughput",
    "input_throughput",
    "total_throughput",
    "accept_length",
    *(f"{p}_{m}_ms" for m in ("tpot", "ttft", "itl") for p in ("median", "p90", "p95", "p99")),
    "request_goodput",
    "slo_attainment",
)
# [slo] key -> bench_serving's --goodput name: the per-request latencies upstream's goodput
# judges (sglang.benchmark.goodput.GOODPUT_SLO_METRICS; a test checks they still match).
SLO_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}
# How a gate or the GSM8K threshold is judged against the 95% interval (docs/ab.md,
# "Gates"): fail only when the whole interval is beyond the bound (the default: the data
# show a regression), pass only when the whole interval is within it, or the point value.
JUDGES = ("no_regression", "confirmed", "mean")
DEFAULT_JUDGE = "no_regression"  # of a gate
CONCURRENCY = "concurrency"  # the kinds of a load point
RATE = "rate"
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# The error types of this module's own rules, as a message reads them: `KEY: TEXT` (_RULE),
# `KEY 'VALUE': TEXT` (_VALUE_RULE).
_RULE = "config_rule"
_VALUE_RULE = "config_value"


class ConfigError(ValueError):
    """A configuration problem, one line, naming the key."""


def sets_flag(arg: str, flag: str) -> bool:
    """Whether bench_serving would read `arg` as `flag`: the flag itself, `flag=value`, or an
    abbreviation of it (argparse takes any unambiguous prefix: `--max-conc 1`)."""
    option = arg.split("=", 1)[0]
    return option.startswith("--") and len(option) > 2 and flag.startswith(option)


# ---------------------------------------------------------------- value types


def _reachable(url: str) -> str:
    if problem := url_problem(url):
        raise PydanticCustomError(_VALUE_RULE, problem)
    return url


def _file_name(name: str) -> str:
    if not _FILE_NAME.match(name):
        raise PydanticCustomError(
            _VALUE_RULE, "use letters, digits, '.', '_' and '-' (it names files)"
        )
    return name


def _one_of(choices: tuple[str, ...]) -> AfterValidator:
    def check(value: str) -> str:
        if value not in choices:
            raise PydanticCustomError(_VALUE_RULE, f"one of {', '.join(choices)}")
        return value

    return AfterValidator(check)


def _above_zero(value: float) -> float:
    if not 0 < value < math.inf:  # nan fails it too: one rule for rates, SLOs and bounds
        raise PydanticCustomError(_RULE, f"must be a finite number above 0, got {value:g}")
    return value


def _tcp_port(port: int) -> int:
    # Said as a port, not as a count: "1-65535", no thousands separator.
    if not 1 <= port <= 65535:
        raise PydanticCustomError(_RULE, f"a TCP port is 1-65535, got {port}")
    return port


def _env_value(value: Any) -> Any:
    # TOML numbers and booleans would reach the server as Python reprs ("True").
    if not isinstance(value, str):
        raise PydanticCustomError(
            _RULE, f"expected a string, got {value!r} (write environment values as strings)"
        )
    return value


def _shell_words(value: Any) -> Any:
    """A launch prefix: a list of words, or one string split like a shell would."""
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as e:
            raise PydanticCustomError(_RULE, str(e)) from None
    if not isinstance(value, list):
        raise PydanticCustomError(_RULE, f"expected a list of strings or a string, got {value!r}")
    return value


# A TOML array is a list; the tuple is lax only about that, its items stay strict.
T = TypeVar("T")
Values = Annotated[tuple[T, ...], Field(strict=False)]
Words = Annotated[Values[str], Field(max_length=MAX_WORDS)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
CountOrZero = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Repeats = Annotated[int, Field(ge=1, le=MAX_REPEATS)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Timeout = Annotated[float, Field(ge=1, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
Positive = Annotated[float, AfterValidator(_above_zero)]
Port = Annotated[int, AfterValidator(_tcp_port)]
NonEmpty = Annotated[str, Field(min_length=1)]
FileName = Annotated[str, AfterValidator(_file_name)]
Url = Annotated[str, AfterValidator(_reachable)]
Judge = Annotated[str, _one_of(JUDGES)]
Env = dict[str, Annotated[str, BeforeValidator(_env_value)]]
Prefix = Annotated[Words, BeforeValidator(_shell_words)]


# ---------------------------------------------------------------- sections


class _Table(BaseModel):
    # Frozen: what was checked is what runs; parse_config derives values in copies.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Server(_Table):
    model_path: str | None = None
    args: Words = ()
    env: Env = {}
    gpus: Count | None = None
    host: NonEmpty = "127.0.0.1"
    port: Port = 30000
    health_timeout_s: Timeout = 3600.0
    stop_timeout_s: Timeout = 60.0
    command: Annotated[Words, Field(min_length=1)] = ()  # empty: python -m sglang.launch_server
    allow_env: Words = ()
    launch_prefix: Prefix = ()  # put in front of the launch command
    launch_python: NonEmpty | None = None  # None: this python, or python3 after a prefix

    @field_validator("args")
    @classmethod
    def _no_model_or_port(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        # The tool passes both itself; a second --port would point the health check elsewhere.
        if "--model-path" in args or "--port" in args:
            raise PydanticCustomError(
                _RULE,
                "give the model as model_path and the port as port, not as --model-path/--port",
            )
        return args


class Arm(_Table):
    name: FileName
    env: Env = {}
    args: Words = ()
    url: Url | None = None
    gpus: Count | None = None
    launch_prefix: Prefix | None = None  # None: [server] launch_prefix; (): none


class SharedPrefix(_Table):
    """bench_serving's generated-shared-prefix workload (its `--gsp-*` flags, without the
    prefix): `num_groups` system prompts, each shared by `prompts_per_group` requests of
    `num_turns` questions. The defaults are bench_serving's own (sglang.benchmark.serving)."""

    num_groups: Count = 64
    prompts_per_group: Count = 16
    system_prompt_len: Count = 2048
    question_len: Count = 128
    output_len: Count = 256
    num_turns: Count = 1
    range_ratio: Fraction = 1.0

    @property
    def requests(self) -> int:
        """What bench_serving sends: one request (conversation) per group and prompt; it
        ignores --num-prompts for this dataset."""
        return self.num_groups * self.prompts_per_group

    def flags(self) -> list[str]:
        """The `--gsp-*` flags that send this workload."""
        argv = []
        for key, value in self.model_dump().items():
            argv += [f"--gsp-{key.replace('_', '-')}", str(value)]
        return argv


class Shape(_Table):
    """One input/output length pair: a `[[shape]]`, or `[sweep]`'s lengths when there is none.
    parse_config names it (`in1024_out1024`) and gives it `[sweep] range_ratio` if not set."""

    name: FileName | None = None
    input_len: Count
    output_len: Count
    range_ratio: Fraction | None = None


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


def _distinct_sorted(values: tuple[float, ...]) -> tuple[float, ...]:
    if len(set(values)) != len(values):
        raise PydanticCustomError(_RULE, "a value is listed twice")
    return tuple(sorted(values))


class Sweep(_Table):
    concurrencies: Annotated[Values[Count], AfterValidator(_distinct_sorted)] = ()
    request_rates: Annotated[Values[Positive], AfterValidator(_distinct_sorted)] = ()
    backend: str = "sglang"
    dataset: str = "random"
    dataset_path: str = ""
    input_len: Count = 1024
    output_len: Count = 1024
    range_ratio: Fraction = 1.0
    # Prompts: num_prompts when set, else max(min_prompts, prompts_per_concurrency x
    # concurrency); the upstream PRs' runs sent 6x concurrency after a 2x warm-up.
    num_prompts: Count | None = None
    prompts_per_concurrency: Count = 6
    min_prompts: Count = 64
    warmup_requests: CountOrZero | None = None  # None: warmup_per_concurrency x concurrency
    warmup_per_concurrency: Count = 2
    # A request-rate point has no concurrency: it sends what arrives in rate_duration_s
    # (at least min_prompts), after the arrivals of warmup_per_concurrency seconds.
    rate_duration_s: Positive = 60.0
    # bench_serving --flush-cache: the prefix cache is emptied after the warm-up, so a cell
    # does not reuse the prompts an earlier cell (same seed) left in the radix cache.
    flush_cache: bool = True
    seed: Seed = 42
    repeats: Repeats = 3  # A B, B A, A B: the fewest that give an interval worth reading
    cell_timeout_s: Timeout = 3600.0
    extra_args: Words = ()
    # The generated-shared-prefix dataset's workload (None for every other dataset).
    shared_prefix: SharedPrefix | None = None
    # Blocks: `block` is the visit order of one block (arm names, each arm equally often), run
    # whole on one machine; `repeats` is then blocks x visits per arm. Without `block`, each
    # repeat is a block of one visit per arm (A B, then B A).
    block: Words = ()
    blocks: Repeats | None = None
    # One visit of this arm served first on a machine that has not served the run, not counted.
    warm_visit: str | None = None
    _shapes: tuple[Shape, ...] = PrivateAttr(())

    @field_validator("extra_args")
    @classmethod
    def _not_the_tools_flags(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        for flag in ("--goodput", "--request-rate", "--max-concurrency"):
            for arg in args:
                if sets_flag(arg, flag):
                    said = flag if arg.split("=", 1)[0] == flag else f"{arg} ({flag})"
                    raise PydanticCustomError(
                        _RULE, f"{said} is set by the tool ([slo], request_rates, concurrencies)"
                    )
        return args

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """The lengths measured, in run order (set by parse_config)."""
        return self._shapes

    def with_shapes(self, shapes: tuple[Shape, ...], **values: Any) -> Sweep:
        """A copy that measures `shapes`, with the derived `values` (the workload)."""
        copy = self.model_copy(update=values)
        copy._shapes = shapes
        return copy

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


class Slo(_Table):
    """Latency SLOs in ms (bench_serving --goodput); none: no goodput."""

    ttft_ms: Positive | None = None  # the keys of SLO_KEYS
    tpot_ms: Positive | None = None
    e2el_ms: Positive | None = None
    # The report names, per arm and shape, the highest concurrency whose mean SLO attainment
    # (the fraction of requests meeting every SLO) is at least this.
    attainment: Fraction = 0.99

    @property
    def limits(self) -> dict[str, float]:
        """[slo] key -> ms, of the SLOs given."""
        return {key: value for key in SLO_KEYS if (value := getattr(self, key)) is not None}

    def goodput_args(self) -> list[str]:
        return [f"{SLO_KEYS[key]}:{value:g}" for key, value in self.limits.items()]


class Gsm8k(_Table):
    enabled: bool = True
    num_examples: Count = 200
    num_shots: CountOrZero = 5
    parallel: Count = 128
    max_tokens: Count = 512
    threshold: Fraction | None = None
    data_path: str | None = None
    arms: Words = ()  # empty: every arm
    timeout_s: Timeout = 3600.0
    # SGLang's CI compares the GSM8K score itself with its threshold: the same by default.
    judge: Judge = "mean"  # the threshold against the score or its Wilson interval (JUDGES)


class Tokens(_Table):
    """The greedy token check: after each visit's load cells, the same seeded prompts at
    temperature 0 on the same server, so the arms' output ids can be compared."""

    enabled: bool = False
    prompts: Count = 16
    input_len: Count = 512  # the prompts' lengths spread over input_len/2 .. input_len*3/2
    output_len: Count = 32
    seed: Seed = 0
    arms: Words = ()  # empty: every arm
    timeout_s: Timeout = 300.0


class Gate(_Table):
    metric: Annotated[str, _one_of(GATE_METRICS)]
    candidate: str
    baseline: str
    concurrency: Count | None = None
    request_rate: Positive | None = None
    shape: str | None = None  # set by parse_config when the run has one shape
    min_ratio: Positive | None = None
    max_ratio: Positive | None = None
    judge: Judge = DEFAULT_JUDGE  # the bounds against the ratio's 95% interval (JUDGES)
    _several_shapes: bool = PrivateAttr(False)  # name the shape in describe()

    def at_shape(self, shape: str, several_shapes: bool) -> Gate:
        """A copy at `shape`, one of the run's shapes (several: describe() names it)."""
        copy = self.model_copy(update={"shape": shape})
        copy._several_shapes = several_shapes
        return copy

    @property
    def point(self) -> Point:
        """The load point the gate compares: its concurrency or request rate, of its shape."""
        if self.request_rate is None:
            return Point(self.shape, CONCURRENCY, self.concurrency)
        return Point(self.shape, RATE, self.request_rate)

    def describe(self) -> str:
        bounds = []
        if self.min_ratio is not None:
            bounds.append(f">= {self.min_ratio:g}x")
        if self.max_ratio is not None:
            bounds.append(f"<= {self.max_ratio:g}x")
        p = self.point
        at = f"concurrency {int(p.value)}" if p.kind == CONCURRENCY else f"request rate {p.value:g}"
        if self._several_shapes:
            at += f" of shape {p.shape}"
        return f"{self.metric} {self.candidate}/{self.baseline} at {at} {' and '.join(bounds)}"


class Run(_Table):
    offline: bool = False  # a fetch from the network is refused before a run (network.py)


class Config(_Table):
    """The whole file; the sections in the order their problems are reported. parse_config
    returns it checked across sections, with the derived values set."""

    note: str | None = None  # shown under the report's title (machine, build, caveats)
    arms: Values[Arm] = Field((), alias="arm")
    server: Server = Server()
    sweep: Sweep = Sweep()
    shape: Values[Shape] | None = None  # as written; the run's shapes are sweep.shapes
    slo: Slo = Slo()
    gsm8k: Gsm8k = Gsm8k()
    tokens: Tokens = Tokens()
    gates: Values[Gate] = Field((), alias="gate")
    # Ratios reported besides each candidate's to the baseline: "CANDIDATE/BASELINE" arms.
    pairs: Words = ()
    run: Run = Run()  # how to run, not what is measured

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(name)

    @property
    def ratio_pairs(self) -> list[tuple[str, str]]:
        """`pairs` as (candidate, baseline) arm names."""
        return [(c, b) for c, _, b in (pair.partition("/") for pair in self.pairs)]


_SECTIONS: dict[str, type[_Table]] = {
    "server": Server,
    "arm": Arm,
    "sweep": Sweep,
    "shape": Shape,
    "slo": Slo,
    "gsm8k": Gsm8k,
    "tokens": Tokens,
    "gate": Gate,
    "run": Run,
}
_ARRAYS_OF_TABLES = ("arm", "shape", "gate")  # written [[arm]]
# Tables inside a section, by (section, key): their unknown keys list their own known ones.
_SUBTABLES: dict[tuple[str, str], type[_Table]] = {("sweep", "shared_prefix"): SharedPrefix}


# ---------------------------------------------------------------- errors as one line


def validated(data: Any) -> Config:
    """`data` (the TOML document, with the flags' changes) as models, else a ConfigError."""
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e.errors(), data)) from None


_KINDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true/false",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
}


def _one_line(errors: list[ErrorDetails], data: Any) -> str:
    # An unknown key first: a misspelt key explains the missing or refused value after it.
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc, kind, value = error["loc"], error["type"], error["input"]
    if kind == "extra_forbidden":
        table = _SECTIONS[str(loc[0])] if len(loc) > 1 else Config
        table = _SUBTABLES.get((str(loc[0]), str(loc[1])), table) if len(loc) > 2 else table
        known = ", ".join(sorted(f.alias or key for key, f in table.model_fields.items()))
        return f"{_key(loc[:-1], data)}: unknown key {loc[-1]!r} (known: {known})"
    if kind == "missing":
        return f"{_key(loc[:-1], data)}: missing key {loc[-1]!r}"
    if kind == _VALUE_RULE:
        return f"{_key(loc, data)} {value!r}: {error['msg']}"
    return f"{_key(loc, data)}: {_allowed(error)}"


def _allowed(error: ErrorDetails) -> str:
    """What the value should be, and the value."""
    kind, value, ctx = error["type"], error["input"], error.get("ctx", {})
    if kind in _KINDS:
        return f"expected {_KINDS[kind]}, got {value!r}"
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx['ge'])}, got {_number(value)}"
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx['le'])}, got {_number(value)}"
    if kind == "finite_number":
        return f"must be a finite number, got {value}"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind == "too_long":
        return f"at most {ctx['max_length']:,} words, got {ctx['actual_length']:,}"
    return error["msg"]  # this module's rules word their own


def _number(value: float) -> str:
    # Counts with separators (1,000,000,000), other numbers short (604800, 0.5).
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _key(loc: tuple[int | str, ...], data: Any) -> str:
    """`loc` as the file names it: `[sweep] concurrencies[0]`, `[[arm]] #2`, `pairs[1]`."""
    if not loc:
        return "config"
    section, rest = loc[0], list(loc[1:])
    if section in _ARRAYS_OF_TABLES:
        text = f"[[{section}]]"
        if rest:
            index = rest.pop(0)
            text += f" #{index + 1}"
            # An arm's keys are named after the arm once its name is good (`arm 'split' url`).
            if section == "arm" and rest and rest[0] != "name":
                name = data["arm"][index].get("name")
                if isinstance(name, str) and _FILE_NAME.match(name):
                    text = f"arm {name!r}"
    elif section in _SECTIONS:
        text = f"[{section}]"
    else:
        text = str(section)  # a top-level key: note, pairs
    named = section not in _SECTIONS  # past the first key, a dotted name: env.SGLANG_X
    for part in rest:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if named else f" {part}"
            named = True
    return text
