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
`pairs` (ratios of two candidates). Every value is checked here, once: finite numbers in
range, ports 1-65535, http(s) URLs, gates whose bounds some ratio can meet, and counts bounded
(MAX_*) so that a plan stays small. Every problem is a `ConfigError` with one line naming the
key, the value and what is allowed, so the command can print it without a traceback.

`cell_settings` turns one measurement into the exact settings that key it on disk: a run
directory is resumed by these keys, so anything that changes what is measured is in them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import tomllib
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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
# Metrics a gate may compare; the report shows the same names.
GATE_METRICS = (
    "output_throughput_per_gpu",
    "output_throughput",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "request_goodput",
    "slo_attainment",
)
# Goodput needs SLOs: bench_serving reports these only with --goodput ([slo]).
GOODPUT_METRICS = ("request_goodput", "slo_attainment")
# [slo] key -> bench_serving's --goodput name: the per-request latencies upstream's goodput
# judges (sglang.benchmark.goodput.GOODPUT_SLO_METRICS; a test checks they still match).
SLO_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}
CONCURRENCY = "concurrency"
RATE = "rate"
# How a gate or the GSM8K threshold is judged against the 95% interval (docs/ab.md,
# "Gates"): fail only when the whole interval is beyond the bound (the default: the data
# show a regression), pass only when the whole interval is within it, or the point value.
JUDGES = ("no_regression", "confirmed", "mean")
DEFAULT_JUDGE = "no_regression"
_ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Bounds that keep a mistyped count from planning (or sending) billions of anything: a count
# of prompts, tokens, requests or examples; repeats and blocks; the cells of a whole plan; a
# timeout (a week).
MAX_COUNT = 10_000_000
MAX_REPEATS = 1000
MAX_CELLS = 10_000
MAX_TIMEOUT_S = 7 * 86400.0
MAX_SEED = 2**32 - 1  # bench_serving seeds numpy with it


class ConfigError(ValueError):
    """A configuration problem, one line, naming the key."""


@dataclass(frozen=True)
class Server:
    model_path: str | None
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
        if self.num_prompts is not None:
            return self.num_prompts
        if point.kind == RATE:
            return max(self.min_prompts, math.ceil(point.value * self.rate_duration_s))
        return max(self.min_prompts, self.prompts_per_concurrency * int(point.value))

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


def _take(table: dict[str, Any], where: str, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )


def _typed(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    # bool is an int in Python; a count of `true` is a mistake, not 1.
    if isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{where}: expected {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{where}: expected {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(
            k, k.__name__
        )
        for k in kinds
    )


def _positive_int(value: Any, where: str, maximum: int = MAX_COUNT) -> int:
    _typed(value, int, where)
    if value < 1:
        raise ConfigError(f"{where}: must be at least 1, got {value}")
    if value > maximum:
        raise ConfigError(f"{where}: must be at most {maximum:,}, got {value:,}")
    return value


def _number(value: Any, where: str, minimum: float = 0.0, maximum: float = math.inf) -> float:
    _typed(value, (int, float), where)
    # nan passes every comparison below and would reach a timer or a bound unnoticed.
    if not math.isfinite(value):
        raise ConfigError(f"{where}: must be a finite number, got {value}")
    if value < minimum:
        raise ConfigError(f"{where}: must be at least {minimum:g}, got {value}")
    if value > maximum:
        raise ConfigError(f"{where}: must be at most {maximum:g}, got {value:g}")
    return float(value)


def _timeout(value: Any, where: str) -> float:
    return _number(value, where, minimum=1.0, maximum=MAX_TIMEOUT_S)


def _port(value: Any, where: str) -> int:
    _typed(value, int, where)
    if not 1 <= value <= 65535:
        raise ConfigError(f"{where}: a TCP port is 1-65535, got {value}")
    return value


def url_problem(url: str) -> str | None:
    """Why `url` cannot reach a server (None: it can): an http(s) URL with a host."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises on a port outside 0-65535)
    except ValueError as e:
        return f"not a valid URL ({e})"
    if parts.scheme not in ("http", "https"):
        # "localhost:30000" parses as scheme "localhost": urllib would never connect.
        return f"give the scheme, e.g. http://{url}" if "://" not in url else "use http or https"
    if not parts.hostname:
        return "no host in it"
    return None


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    _typed(value, list, where)
    for i, item in enumerate(value):
        _typed(item, str, f"{where}[{i}]")
    return tuple(value)


def _prefix(value: Any, where: str) -> tuple[str, ...]:
    """A launch prefix: a list of words, or one string split like a shell would."""
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of strings or a string, got {value!r}")
    return _str_list(value, where)


def _file_name(value: Any, where: str) -> str:
    """An arm's or a shape's name: it names files."""
    name = _typed(value, str, where)
    if not _ARM_NAME.match(name):
        raise ConfigError(
            f"{where} {name!r}: use letters, digits, '.', '_' and '-' (it names files)"
        )
    return name


def _check_unique_names(names: list[str], section: str) -> None:
    seen: set[str] = set()  # linear: a generated file may list thousands of entries
    for name in names:
        if name in seen:
            raise ConfigError(f"{section}: the name {name!r} is used twice")
        seen.add(name)


def _range_ratio(value: Any, where: str) -> float:
    ratio = _number(value, where)
    if ratio > 1:
        raise ConfigError(f"{where}: must be between 0 and 1")
    return ratio


def _env(value: Any, where: str) -> dict[str, str]:
    _typed(value, dict, where)
    env = {}
    for name, item in value.items():
        # TOML numbers and booleans would reach the server as Python reprs ("True").
        _typed(item, str, f"{where}.{name} (write environment values as strings)")
        env[name] = item
    return env


def _server(table: dict[str, Any]) -> Server:
    where = "[server]"
    _take(
        table,
        where,
        {
            "model_path",
            "args",
            "env",
            "gpus",
            "host",
            "port",
            "health_timeout_s",
            "stop_timeout_s",
            "command",
            "allow_env",
            "launch_prefix",
            "launch_python",
        },
    )
    kwargs: dict[str, Any] = {}
    if "model_path" in table:
        kwargs["model_path"] = _typed(table["model_path"], str, f"{where} model_path")
    else:
        kwargs["model_path"] = None
    if "args" in table:
        kwargs["args"] = _str_list(table["args"], f"{where} args")
        if "--model-path" in kwargs["args"] or "--port" in kwargs["args"]:
            raise ConfigError(
                f"{where} args: give the model as model_path and the port as port, "
                "not as --model-path/--port"
            )
    if "env" in table:
        kwargs["env"] = _env(table["env"], f"{where} env")
    if "gpus" in table:
        kwargs["gpus"] = _positive_int(table["gpus"], f"{where} gpus")
    if "host" in table:
        kwargs["host"] = _typed(table["host"], str, f"{where} host")
        if not kwargs["host"]:
            raise ConfigError(f"{where} host: must not be empty")
    if "port" in table:
        kwargs["port"] = _port(table["port"], f"{where} port")
    for key in ("health_timeout_s", "stop_timeout_s"):
        if key in table:
            kwargs[key] = _timeout(table[key], f"{where} {key}")
    if "command" in table:
        kwargs["command"] = _str_list(table["command"], f"{where} command")
        if not kwargs["command"]:
            raise ConfigError(f"{where} command: must not be empty")
    if "allow_env" in table:
        kwargs["allow_env"] = _str_list(table["allow_env"], f"{where} allow_env")
    if "launch_prefix" in table:
        kwargs["launch_prefix"] = _prefix(table["launch_prefix"], f"{where} launch_prefix")
    if "launch_python" in table:
        kwargs["launch_python"] = _typed(table["launch_python"], str, f"{where} launch_python")
        if not kwargs["launch_python"]:
            raise ConfigError(f"{where} launch_python: must not be empty")
    return Server(**kwargs)


def _arms(items: Any) -> tuple[Arm, ...]:
    _typed(items, list, "[[arm]]")
    arms = []
    for i, table in enumerate(items):
        where = f"[[arm]] #{i + 1}"
        _typed(table, dict, where)
        _take(table, where, {"name", "env", "args", "url", "gpus", "launch_prefix"})
        if "name" not in table:
            raise ConfigError(f"{where}: missing key 'name'")
        name = _file_name(table["name"], f"{where} name")
        where = f"arm {name!r}"
        arms.append(
            Arm(
                name=name,
                env=_env(table.get("env", {}), f"{where} env"),
                args=_str_list(table.get("args", []), f"{where} args"),
                url=_url(table["url"], f"{where} url") if "url" in table else None,
                gpus=_positive_int(table["gpus"], f"{where} gpus") if "gpus" in table else None,
                launch_prefix=(
                    _prefix(table["launch_prefix"], f"{where} launch_prefix")
                    if "launch_prefix" in table
                    else None
                ),
            )
        )
    _check_unique_names([a.name for a in arms], "[[arm]]")
    return tuple(arms)


def _url(value: Any, where: str) -> str:
    url = _typed(value, str, where)
    problem = url_problem(url)
    if problem:
        raise ConfigError(f"{where} {url!r}: {problem}")
    return url


def _positive_number(value: Any, where: str) -> float:
    _typed(value, (int, float), where)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: must be a finite number above 0, got {value}")
    return float(value)


def _sweep(table: dict[str, Any]) -> Sweep:
    where = "[sweep]"
    ints = {
        "input_len",
        "output_len",
        "num_prompts",
        "prompts_per_concurrency",
        "min_prompts",
        "warmup_per_concurrency",
        "repeats",
        "blocks",
    }
    _take(
        table,
        where,
        ints
        | {
            "concurrencies",
            "request_rates",
            "backend",
            "dataset",
            "dataset_path",
            "range_ratio",
            "warmup_requests",
            "rate_duration_s",
            "flush_cache",
            "seed",
            "cell_timeout_s",
            "extra_args",
            "block",
            "warm_visit",
        },
    )
    if "concurrencies" not in table and "request_rates" not in table:
        raise ConfigError(f"{where}: missing key 'concurrencies' (or 'request_rates')")
    kwargs: dict[str, Any] = {}
    _typed(table.get("concurrencies", []), list, f"{where} concurrencies")
    concurrencies = tuple(
        _positive_int(c, f"{where} concurrencies[{i}]")
        for i, c in enumerate(table.get("concurrencies", []))
    )
    _typed(table.get("request_rates", []), list, f"{where} request_rates")
    rates = tuple(
        _positive_number(r, f"{where} request_rates[{i}]")
        for i, r in enumerate(table.get("request_rates", []))
    )
    if not concurrencies and not rates:
        raise ConfigError(f"{where} concurrencies: give at least one (or a request rate)")
    for key, values in (("concurrencies", concurrencies), ("request_rates", rates)):
        if len(set(values)) != len(values):
            raise ConfigError(f"{where} {key}: a value is listed twice")
    kwargs["concurrencies"] = tuple(sorted(concurrencies))
    kwargs["request_rates"] = tuple(sorted(rates))
    for key in ints:
        if key in table:
            most = MAX_REPEATS if key in ("repeats", "blocks") else MAX_COUNT
            kwargs[key] = _positive_int(table[key], f"{where} {key}", most)
    if "num_prompts" in table:
        for other in ("prompts_per_concurrency", "min_prompts"):
            if other in table:
                raise ConfigError(f"{where}: give num_prompts (a count) or {other}, not both")
    for key in ("backend", "dataset", "dataset_path"):
        if key in table:
            kwargs[key] = _typed(table[key], str, f"{where} {key}")
    if "range_ratio" in table:
        kwargs["range_ratio"] = _range_ratio(table["range_ratio"], f"{where} range_ratio")
    if "warmup_requests" in table:
        if "warmup_per_concurrency" in table:
            raise ConfigError(
                f"{where}: give warmup_requests (a count) or warmup_per_concurrency, not both"
            )
        kwargs["warmup_requests"] = _typed(
            table["warmup_requests"], int, f"{where} warmup_requests"
        )
        if not 0 <= kwargs["warmup_requests"] <= MAX_COUNT:
            raise ConfigError(
                f"{where} warmup_requests: must be 0 to {MAX_COUNT:,}, "
                f"got {kwargs['warmup_requests']:,}"
            )
    if "rate_duration_s" in table:
        kwargs["rate_duration_s"] = _positive_number(
            table["rate_duration_s"], f"{where} rate_duration_s"
        )
    if "flush_cache" in table:
        kwargs["flush_cache"] = _typed(table["flush_cache"], bool, f"{where} flush_cache")
    if "seed" in table:
        kwargs["seed"] = _typed(table["seed"], int, f"{where} seed")
        if not 0 <= kwargs["seed"] <= MAX_SEED:
            raise ConfigError(f"{where} seed: must be 0 to {MAX_SEED}, got {kwargs['seed']}")
    if "cell_timeout_s" in table:
        kwargs["cell_timeout_s"] = _timeout(table["cell_timeout_s"], f"{where} cell_timeout_s")
    if "extra_args" in table:
        kwargs["extra_args"] = _str_list(table["extra_args"], f"{where} extra_args")
        for flag in ("--goodput", "--request-rate", "--max-concurrency"):
            if flag in kwargs["extra_args"]:
                raise ConfigError(
                    f"{where} extra_args: {flag} is set by the tool ([slo], request_rates, "
                    "concurrencies)"
                )
    if "block" in table:
        kwargs["block"] = _str_list(table["block"], f"{where} block")
        if not kwargs["block"]:
            raise ConfigError(f"{where} block: give the visit order of one block (arm names)")
        if "repeats" in table:
            raise ConfigError(f"{where}: give blocks (with block) or repeats, not both")
        kwargs.setdefault("blocks", 1)
    elif "blocks" in table:
        raise ConfigError(f"{where} blocks: needs block (the visit order of one block)")
    if "warm_visit" in table:
        kwargs["warm_visit"] = _typed(table["warm_visit"], str, f"{where} warm_visit")
    sweep = Sweep(**kwargs)
    shape = Shape(
        f"in{sweep.input_len}_out{sweep.output_len}",
        sweep.input_len,
        sweep.output_len,
        sweep.range_ratio,
    )
    return replace(sweep, shapes=(shape,))


def _shapes(items: Any, sweep_table: dict[str, Any], sweep: Sweep) -> Sweep:
    """`[[shape]]` entries replace `[sweep]`'s one pair of lengths."""
    _typed(items, list, "[[shape]]")
    if not items:
        raise ConfigError("[[shape]]: give at least one, or leave it out")
    for key in ("input_len", "output_len"):
        if key in sweep_table:
            raise ConfigError(f"[sweep] {key}: with [[shape]] entries, give the lengths there")
    shapes = []
    for i, table in enumerate(items):
        where = f"[[shape]] #{i + 1}"
        _typed(table, dict, where)
        _take(table, where, {"name", "input_len", "output_len", "range_ratio"})
        for key in ("input_len", "output_len"):
            if key not in table:
                raise ConfigError(f"{where}: missing key {key!r}")
        input_len = _positive_int(table["input_len"], f"{where} input_len")
        output_len = _positive_int(table["output_len"], f"{where} output_len")
        name = f"in{input_len}_out{output_len}"
        if "name" in table:
            name = _file_name(table["name"], f"{where} name")
        range_ratio = sweep.range_ratio
        if "range_ratio" in table:
            range_ratio = _range_ratio(table["range_ratio"], f"{where} range_ratio")
        shapes.append(Shape(name, input_len, output_len, range_ratio))
    _check_unique_names([s.name for s in shapes], "[[shape]]")
    return replace(sweep, shapes=tuple(shapes))


def _slo(table: dict[str, Any]) -> Slo:
    where = "[slo]"
    _take(table, where, {*SLO_KEYS, "attainment"})
    limits = {
        key: _positive_number(table[key], f"{where} {key}") for key in SLO_KEYS if key in table
    }
    if not limits:
        raise ConfigError(f"{where}: give at least one of {', '.join(SLO_KEYS)}")
    kwargs: dict[str, Any] = {"limits": limits}
    if "attainment" in table:
        kwargs["attainment"] = _number(table["attainment"], f"{where} attainment")
        if kwargs["attainment"] > 1:
            raise ConfigError(f"{where} attainment: a fraction between 0 and 1")
    return Slo(**kwargs)


def _gsm8k(table: dict[str, Any], arm_names: list[str]) -> Gsm8k:
    where = "[gsm8k]"
    _take(
        table,
        where,
        {
            "enabled",
            "num_examples",
            "num_shots",
            "parallel",
            "max_tokens",
            "threshold",
            "data_path",
            "arms",
            "timeout_s",
            "judge",
        },
    )
    kwargs: dict[str, Any] = {}
    if "enabled" in table:
        kwargs["enabled"] = _typed(table["enabled"], bool, f"{where} enabled")
    for key in ("num_examples", "parallel", "max_tokens"):
        if key in table:
            kwargs[key] = _positive_int(table[key], f"{where} {key}")
    if "num_shots" in table:
        kwargs["num_shots"] = _typed(table["num_shots"], int, f"{where} num_shots")
        if not 0 <= kwargs["num_shots"] <= MAX_COUNT:
            raise ConfigError(
                f"{where} num_shots: must be 0 to {MAX_COUNT:,}, got {kwargs['num_shots']:,}"
            )
    if "threshold" in table:
        kwargs["threshold"] = _number(table["threshold"], f"{where} threshold")
        if kwargs["threshold"] > 1:
            raise ConfigError(f"{where} threshold: an accuracy between 0 and 1")
    if "data_path" in table:
        kwargs["data_path"] = _typed(table["data_path"], str, f"{where} data_path")
    if "arms" in table:
        kwargs["arms"] = _str_list(table["arms"], f"{where} arms")
        for name in kwargs["arms"]:
            if name not in arm_names:
                raise ConfigError(f"{where} arms: no arm named {name!r}")
    if "timeout_s" in table:
        kwargs["timeout_s"] = _timeout(table["timeout_s"], f"{where} timeout_s")
    if "judge" in table:
        kwargs["judge"] = _judge(table["judge"], f"{where} judge")
    return Gsm8k(**kwargs)


def _judge(value: Any, where: str) -> str:
    _typed(value, str, where)
    if value not in JUDGES:
        raise ConfigError(f"{where} {value!r}: one of {', '.join(JUDGES)}")
    return value


def _gate_point(table: dict[str, Any], where: str, sweep: Sweep) -> Point:
    """The gate's load point: its concurrency or request rate, of its shape."""
    if ("concurrency" in table) == ("request_rate" in table):
        raise ConfigError(f"{where}: give concurrency or request_rate (one of them)")
    names = [s.name for s in sweep.shapes]
    if "shape" in table:
        shape = _typed(table["shape"], str, f"{where} shape")
        if shape not in names:
            raise ConfigError(f"{where} shape: no shape named {shape!r} (shapes: {names})")
    elif len(names) > 1:
        raise ConfigError(f"{where}: missing key 'shape' (the run has shapes {names})")
    else:
        shape = names[0]
    if "concurrency" in table:
        concurrency = _positive_int(table["concurrency"], f"{where} concurrency")
        if concurrency not in sweep.concurrencies:
            raise ConfigError(
                f"{where} concurrency {concurrency}: not in [sweep] concurrencies "
                f"{list(sweep.concurrencies)}"
            )
        return Point(shape, CONCURRENCY, concurrency)
    rate = _positive_number(table["request_rate"], f"{where} request_rate")
    if rate not in sweep.request_rates:
        raise ConfigError(
            f"{where} request_rate {rate:g}: not in [sweep] request_rates "
            f"{list(sweep.request_rates)}"
        )
    return Point(shape, RATE, rate)


def _gates(items: Any, arm_names: list[str], sweep: Sweep, slo: Slo | None) -> tuple[Gate, ...]:
    _typed(items, list, "[[gate]]")
    gates = []
    for i, table in enumerate(items):
        where = f"[[gate]] #{i + 1}"
        _typed(table, dict, where)
        _take(
            table,
            where,
            {
                "metric",
                "candidate",
                "baseline",
                "concurrency",
                "request_rate",
                "shape",
                "min_ratio",
                "max_ratio",
                "judge",
            },
        )
        for key in ("metric", "candidate", "baseline"):
            if key not in table:
                raise ConfigError(f"{where}: missing key {key!r}")
        metric = _typed(table["metric"], str, f"{where} metric")
        if metric not in GATE_METRICS:
            raise ConfigError(f"{where} metric {metric!r}: one of {', '.join(GATE_METRICS)}")
        if metric in GOODPUT_METRICS and slo is None:
            raise ConfigError(f"{where} metric {metric!r}: needs the SLOs of an [slo] section")
        for key in ("candidate", "baseline"):
            if table[key] not in arm_names:
                raise ConfigError(f"{where} {key}: no arm named {table[key]!r}")
        if table["candidate"] == table["baseline"]:
            raise ConfigError(
                f"{where}: candidate and baseline are both {table['candidate']!r}; a gate "
                "compares two different arms"
            )
        point = _gate_point(table, where, sweep)
        bounds = {
            key: _positive_number(table[key], f"{where} {key}")
            for key in ("min_ratio", "max_ratio")
            if key in table
        }
        if not bounds:
            raise ConfigError(f"{where}: give min_ratio, max_ratio or both")
        if bounds.get("min_ratio", 0.0) > bounds.get("max_ratio", math.inf):
            raise ConfigError(
                f"{where}: min_ratio {bounds['min_ratio']:g} is above max_ratio "
                f"{bounds['max_ratio']:g}; no ratio can pass"
            )
        gates.append(
            Gate(
                metric=metric,
                candidate=table["candidate"],
                baseline=table["baseline"],
                point=point,
                judge=_judge(table["judge"], f"{where} judge")
                if "judge" in table
                else DEFAULT_JUDGE,
                several_shapes=len(sweep.shapes) > 1,
                **bounds,
            )
        )
    return tuple(gates)


def parse_config(data: dict[str, Any], *, accuracy_only: bool = False) -> Config:
    _take(
        data,
        "config",
        {"note", "server", "arm", "sweep", "shape", "slo", "gsm8k", "gate", "pairs", "run"},
    )
    note = _typed(data["note"], str, "note") if "note" in data else None
    arms = _arms(data.get("arm", []))
    minimum = 1 if accuracy_only else 2
    if len(arms) < minimum:
        raise ConfigError(
            f"[[arm]]: give at least {minimum} arm{'s' if minimum > 1 else ''} "
            f"(found {len(arms)})" + ("" if accuracy_only else "; one arm: --accuracy-only")
        )
    server = _server(_typed(data.get("server", {}), dict, "[server]"))
    launched = [a.name for a in arms if a.url is None]
    if launched and server.model_path is None:
        raise ConfigError(
            f"[server] model_path: needed to launch arm {launched[0]!r} (or give the arm a url)"
        )
    names = [a.name for a in arms]
    if "sweep" in data:
        sweep_table = _typed(data["sweep"], dict, "[sweep]")
        sweep = _sweep(sweep_table)
        if "shape" in data:
            sweep = _shapes(data["shape"], sweep_table, sweep)
    elif accuracy_only:
        sweep = _sweep({"concurrencies": [1]})
    else:
        raise ConfigError("config: missing section [sweep]")
    sweep = _blocks(sweep, names)
    _check_plan_size(sweep, len(arms), accuracy_only)
    slo = _slo(_typed(data["slo"], dict, "[slo]")) if "slo" in data else None
    gsm8k = _gsm8k(_typed(data.get("gsm8k", {}), dict, "[gsm8k]"), names)
    if accuracy_only and (not gsm8k.enabled or gsm8k.threshold is None):
        raise ConfigError("[gsm8k]: --accuracy-only needs enabled = true and a threshold")
    gates = _gates(data.get("gate", []), names, sweep, slo)
    return Config(
        server=server,
        arms=arms,
        sweep=sweep,
        gsm8k=gsm8k,
        gates=gates,
        note=note,
        slo=slo or Slo(),
        pairs=_pairs(data.get("pairs", []), names),
        offline=_run_table(_typed(data.get("run", {}), dict, "[run]")),
    )


def _run_table(table: dict[str, Any]) -> bool:
    """`[run]`: how to run, not what is measured; only `offline` (see network.py)."""
    _take(table, "[run]", {"offline"})
    return _typed(table.get("offline", False), bool, "[run] offline")


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


def _pairs(value: Any, names: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for i, item in enumerate(_str_list(value, "pairs")):
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


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = path.read_bytes()
        return tomllib.loads(data.decode("utf-8"))
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


def with_counts(raw: dict[str, Any], sweep: Sweep) -> dict[str, Any]:
    """`raw` with the prompt and warm-up counts it left to the defaults written out.

    run.json keeps what a run measured: a later change of a default must not make
    `ab report` look for cells under other keys (and call them missing).
    """
    table = dict(raw.get("sweep", {}))
    if "num_prompts" not in table:
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
