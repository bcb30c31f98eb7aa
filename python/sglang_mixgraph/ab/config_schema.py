"""The shape of the A/B TOML file: one pydantic model per section, and its errors as one line.

Each section (`[server]`, `[[arm]]`, `[sweep]`, `[[shape]]`, `[slo]`, `[gsm8k]`, `[[gate]]`,
`[run]`) is a model that says, key by key, what a value may be: strict types (an integer is
not `true`, `1.0` or `"1"`), no unknown key, numbers finite and in range, counts bounded
(MAX_*) so that a plan stays small, ports, URLs, names and vocabularies. pydantic (installed
with SGLang) checks them, so config.py keeps only what spans keys or sections (gates against
arms, blocks, the plan's size) and builds its dataclasses from the validated tables.
`validated` turns pydantic's first error into a `ConfigError`: one line naming the key as
the file writes it (`[sweep] num_prompts`, `[[arm]] #2 name`, `arm 'split' url`), the value
and what is allowed, so the command prints it without a traceback.
"""

from __future__ import annotations

import math
import re
import shlex
import urllib.parse
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

# Bounds that keep a mistyped count from planning (or sending) billions of anything: a count
# of prompts, tokens, requests or examples; repeats and blocks; a timeout (a week).
MAX_COUNT = 10_000_000
MAX_REPEATS = 1000
MAX_TIMEOUT_S = 7 * 86400.0
MAX_SEED = 2**32 - 1  # bench_serving seeds numpy with it
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
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# The error types of this module's own rules, as a message reads them: `KEY: TEXT` (_RULE),
# `KEY 'VALUE': TEXT` (_VALUE_RULE).
_RULE = "config_rule"
_VALUE_RULE = "config_value"


class ConfigError(ValueError):
    """A configuration problem, one line, naming the key."""


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
Words = Annotated[tuple[str, ...], Field(strict=False)]
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
    # Every key is optional unless said otherwise; None is "not given", so the dataclasses of
    # config.py keep the defaults.
    model_config = ConfigDict(strict=True, extra="forbid")


class ServerTable(_Table):
    model_path: str | None = None
    args: Words | None = None
    env: Env | None = None
    gpus: Count | None = None
    host: NonEmpty | None = None
    port: Port | None = None
    health_timeout_s: Timeout | None = None
    stop_timeout_s: Timeout | None = None
    command: Annotated[Words, Field(min_length=1)] | None = None
    allow_env: Words | None = None
    launch_prefix: Prefix | None = None
    launch_python: NonEmpty | None = None

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


class ArmTable(_Table):
    name: FileName
    env: Env | None = None
    args: Words | None = None
    url: Url | None = None
    gpus: Count | None = None
    launch_prefix: Prefix | None = None


class SharedPrefixTable(_Table):
    # bench_serving's --gsp-* flags of its generated-shared-prefix dataset, without the prefix.
    num_groups: Count | None = None
    prompts_per_group: Count | None = None
    system_prompt_len: Count | None = None
    question_len: Count | None = None
    output_len: Count | None = None
    num_turns: Count | None = None
    range_ratio: Fraction | None = None


class SweepTable(_Table):
    concurrencies: Annotated[tuple[Count, ...], Field(strict=False)] | None = None
    request_rates: Annotated[tuple[Positive, ...], Field(strict=False)] | None = None
    backend: str | None = None
    dataset: str | None = None
    dataset_path: str | None = None
    input_len: Count | None = None
    output_len: Count | None = None
    range_ratio: Fraction | None = None
    num_prompts: Count | None = None
    prompts_per_concurrency: Count | None = None
    min_prompts: Count | None = None
    warmup_requests: CountOrZero | None = None
    warmup_per_concurrency: Count | None = None
    rate_duration_s: Positive | None = None
    flush_cache: bool | None = None
    seed: Seed | None = None
    repeats: Repeats | None = None
    cell_timeout_s: Timeout | None = None
    extra_args: Words | None = None
    shared_prefix: SharedPrefixTable | None = None
    block: Words | None = None
    blocks: Repeats | None = None
    warm_visit: str | None = None

    @field_validator("concurrencies", "request_rates")
    @classmethod
    def _distinct(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        if len(set(values)) != len(values):
            raise PydanticCustomError(_RULE, "a value is listed twice")
        return values

    @field_validator("extra_args")
    @classmethod
    def _not_the_tools_flags(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        for flag in ("--goodput", "--request-rate", "--max-concurrency"):
            if flag in args:
                raise PydanticCustomError(
                    _RULE, f"{flag} is set by the tool ([slo], request_rates, concurrencies)"
                )
        return args


class ShapeTable(_Table):
    name: FileName | None = None
    input_len: Count
    output_len: Count
    range_ratio: Fraction | None = None


class SloTable(_Table):
    ttft_ms: Positive | None = None  # the keys of SLO_KEYS
    tpot_ms: Positive | None = None
    e2el_ms: Positive | None = None
    attainment: Fraction | None = None


class Gsm8kTable(_Table):
    enabled: bool | None = None
    num_examples: Count | None = None
    num_shots: CountOrZero | None = None
    parallel: Count | None = None
    max_tokens: Count | None = None
    threshold: Fraction | None = None
    data_path: str | None = None
    arms: Words | None = None
    timeout_s: Timeout | None = None
    judge: Judge | None = None


class GateTable(_Table):
    metric: Annotated[str, _one_of(GATE_METRICS)]
    candidate: str
    baseline: str
    concurrency: Count | None = None
    request_rate: Positive | None = None
    shape: str | None = None
    min_ratio: Positive | None = None
    max_ratio: Positive | None = None
    judge: Judge | None = None


class RunTable(_Table):
    offline: bool | None = None


class ConfigFile(_Table):
    """The whole file; the sections in the order their problems are reported."""

    note: str | None = None
    arm: list[ArmTable] = []
    server: ServerTable = ServerTable()
    sweep: SweepTable | None = None
    shape: list[ShapeTable] | None = None
    slo: SloTable | None = None
    gsm8k: Gsm8kTable = Gsm8kTable()
    gate: list[GateTable] = []
    pairs: Words = ()
    run: RunTable = RunTable()


_SECTIONS: dict[str, type[_Table]] = {
    "server": ServerTable,
    "arm": ArmTable,
    "sweep": SweepTable,
    "shape": ShapeTable,
    "slo": SloTable,
    "gsm8k": Gsm8kTable,
    "gate": GateTable,
    "run": RunTable,
}
_ARRAYS_OF_TABLES = ("arm", "shape", "gate")  # written [[arm]]
# Tables inside a section, by (section, key): their unknown keys list their own known ones.
_SUBTABLES: dict[tuple[str, str], type[_Table]] = {("sweep", "shared_prefix"): SharedPrefixTable}


# ---------------------------------------------------------------- errors as one line


def validated(data: Any) -> ConfigFile:
    """`data` (the TOML document, with the flags' changes) as models, else a ConfigError."""
    try:
        return ConfigFile.model_validate(data)
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
        table = _SECTIONS[str(loc[0])] if len(loc) > 1 else ConfigFile
        table = _SUBTABLES.get((str(loc[0]), str(loc[1])), table) if len(loc) > 2 else table
        known = ", ".join(sorted(table.model_fields))
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
