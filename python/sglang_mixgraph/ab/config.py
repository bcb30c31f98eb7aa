"""The A/B configuration: one TOML file, read with the standard library (tomllib), and checked.

Its sections and keys are the frozen pydantic models of config_schema.py (`Config`, the whole
file, is what the run uses), which check each key's type and range. Here follows what spans
keys or sections, in the order its problems are reported: the arms, the sweep's keys against
each other (prompt counts, blocks, the shared-prefix workload), `[[shape]]`, blocks against
the arms, the plan's size, `[slo]`, gates against the arms and load points (with bounds some
ratio can meet), `pairs`; and the values derived from them are set in copies (the shapes,
blocks x visits as repeats, the workload). Every problem is a `ConfigError`: one line naming
the key, the value and what is allowed, so the command prints it without a traceback.

`cell_settings` turns one measurement into the exact settings that key it on disk: a run
directory is resumed by these keys, so anything that changes what is measured is in them.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sglang_mixgraph.ab.config_schema import (
    CONCURRENCY,
    MAX_COUNT,
    SLO_KEYS,
    Arm,
    Config,
    ConfigError,
    Gate,
    Point,
    Server,
    Shape,
    SharedPrefix,
    Sweep,
    sets_flag,
    validated,
)
from sglang_mixgraph.ab.config_schema import RATE as RATE  # a load point's kind, as CONCURRENCY

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
SHARED_PREFIX_DATASET = "generated-shared-prefix"
# bench_serving runs several turns of a conversation only through these backends
# (sglang.benchmark.serving.MULTI_TURN_BACKENDS; it asserts it in wrap_multi_turn_request_func).
MULTI_TURN_BACKENDS = ("sglang-oai-chat", "vllm-chat", "lmdeploy-chat")
# The cells of a whole plan, bounded as every count is (config_schema.MAX_COUNT).
MAX_CELLS = 10_000
# How deep tables and arrays may nest in the file ([[arm]] env.NAME, the deepest key, is 3).
MAX_DEPTH = 16


# ---------------------------------------------------------------- across keys and sections


def parse_config(data: dict[str, Any], *, accuracy_only: bool = False) -> Config:
    """The configuration of a TOML document: the models' checks, then those across keys and
    sections, in the order their problems are reported; the derived values set in copies."""
    config = validated(data)
    arms = config.arms
    _check_unique_names([a.name for a in arms], "[[arm]]")
    minimum = 1 if accuracy_only else 2
    if len(arms) < minimum:
        raise ConfigError(
            f"[[arm]]: give at least {minimum} arm{'s' if minimum > 1 else ''} "
            f"(found {len(arms)})" + ("" if accuracy_only else "; one arm: --accuracy-only")
        )
    launched = [a.name for a in arms if a.url is None]
    if launched and config.server.model_path is None:
        raise ConfigError(
            f"[server] model_path: needed to launch arm {launched[0]!r} (or give the arm a url)"
        )
    names = [a.name for a in arms]
    if _given(config, "sweep"):
        sweep = _sweep(config.sweep)
        if config.shape is not None:
            sweep = _shapes(config.shape, sweep)
    elif accuracy_only:
        sweep = _sweep(Sweep(concurrencies=(1,)))
    else:
        raise ConfigError("config: missing section [sweep]")
    sweep = _blocks(sweep, names)
    _check_plan_size(sweep, len(arms), accuracy_only)
    if _given(config, "slo") and not config.slo.limits:
        raise ConfigError(f"[slo]: give at least one of {', '.join(SLO_KEYS)}")
    for name in config.gsm8k.arms:
        if name not in names:
            raise ConfigError(f"[gsm8k] arms: no arm named {name!r}")
    for name in config.tokens.arms:
        if name not in names:
            raise ConfigError(f"[tokens] arms: no arm named {name!r}")
    if accuracy_only and (not config.gsm8k.enabled or config.gsm8k.threshold is None):
        raise ConfigError("[gsm8k]: --accuracy-only needs enabled = true and a threshold")
    gates = _gates(config, sweep)
    _check_pairs(config.pairs, names)
    return config.model_copy(update={"sweep": sweep, "gates": gates})


def _given(table: BaseModel, *keys: str) -> bool:
    """Whether the file gave any of `keys` (rather than leaving them to the defaults)."""
    return not table.model_fields_set.isdisjoint(keys)


def _check_unique_names(names: list[str], section: str) -> None:
    seen: set[str] = set()  # linear: a generated file may list thousands of entries
    for name in names:
        if name in seen:
            raise ConfigError(f"{section}: the name {name!r} is used twice")
        seen.add(name)


def _sweep(sweep: Sweep) -> Sweep:
    """`[sweep]` with the rules between its keys; its one shape from `input_len`/`output_len`."""
    where = "[sweep]"
    if not _given(sweep, "concurrencies", "request_rates"):
        raise ConfigError(f"{where}: missing key 'concurrencies' (or 'request_rates')")
    if not sweep.concurrencies and not sweep.request_rates:
        raise ConfigError(f"{where} concurrencies: give at least one (or a request rate)")
    if _given(sweep, "num_prompts"):
        for other in ("prompts_per_concurrency", "min_prompts"):
            if _given(sweep, other):
                raise ConfigError(f"{where}: give num_prompts (a count) or {other}, not both")
    if _given(sweep, "warmup_requests") and _given(sweep, "warmup_per_concurrency"):
        raise ConfigError(
            f"{where}: give warmup_requests (a count) or warmup_per_concurrency, not both"
        )
    if _given(sweep, "block"):
        if not sweep.block:
            raise ConfigError(f"{where} block: give the visit order of one block (arm names)")
        if _given(sweep, "repeats"):
            raise ConfigError(f"{where}: give blocks (with block) or repeats, not both")
    elif _given(sweep, "blocks"):
        raise ConfigError(f"{where} blocks: needs block (the visit order of one block)")
    if _given(sweep, "shared_prefix") or sweep.dataset == SHARED_PREFIX_DATASET:
        return _shared_prefix(sweep)
    name = f"in{sweep.input_len}_out{sweep.output_len}"
    return sweep.with_shapes((_shape(name, sweep.input_len, sweep.output_len, sweep.range_ratio),))


def _shape(name: str, input_len: int, output_len: int, range_ratio: float) -> Shape:
    # Built from checked values, not checked again: a shared prefix's two lengths add up.
    return Shape.model_construct(
        name=name, input_len=input_len, output_len=output_len, range_ratio=range_ratio
    )


def _shared_prefix(sweep: Sweep) -> Sweep:
    """The generated-shared-prefix workload: its counts and lengths are `[sweep] shared_prefix`
    (bench_serving's defaults where not given), and nothing else may say otherwise."""
    where = "[sweep]"
    if _given(sweep, "dataset") and sweep.dataset != SHARED_PREFIX_DATASET:
        raise ConfigError(
            f"{where} shared_prefix: is the workload of dataset {SHARED_PREFIX_DATASET!r}, "
            f"not of {sweep.dataset!r}"
        )
    for key in ("input_len", "output_len", "range_ratio"):
        if _given(sweep, key):
            raise ConfigError(
                f"{where} {key}: the shared-prefix workload takes its lengths from [sweep] "
                "shared_prefix (system_prompt_len, question_len, output_len, range_ratio)"
            )
    for key in ("num_prompts", "prompts_per_concurrency", "min_prompts"):
        if _given(sweep, key):
            raise ConfigError(
                f"{where} {key}: the shared-prefix workload sends num_groups x "
                "prompts_per_group requests ([sweep] shared_prefix); bench_serving ignores "
                "--num-prompts for it"
            )
    workload = sweep.shared_prefix or SharedPrefix()
    for flag in workload.flags()[::2]:
        if any(sets_flag(arg, flag) for arg in sweep.extra_args):
            key = flag.removeprefix("--gsp-").replace("-", "_")
            raise ConfigError(f"{where} extra_args: {flag} is set by [sweep] shared_prefix {key}")
    if workload.num_turns > 1 and sweep.backend not in MULTI_TURN_BACKENDS:
        raise ConfigError(
            f"{where} shared_prefix num_turns {workload.num_turns}: bench_serving sends several "
            f"turns only through a chat backend ({', '.join(MULTI_TURN_BACKENDS)}); [sweep] "
            f"backend is {sweep.backend!r}"
        )
    # One shape: the first turn's target lengths, system prompt and question together.
    shape = _shape(
        f"prefix{workload.system_prompt_len}_q{workload.question_len}_out{workload.output_len}",
        workload.system_prompt_len + workload.question_len,
        workload.output_len,
        workload.range_ratio,
    )
    return sweep.with_shapes((shape,), dataset=SHARED_PREFIX_DATASET, shared_prefix=workload)


def _shapes(tables: tuple[Shape, ...], sweep: Sweep) -> Sweep:
    """`[[shape]]` entries replace `[sweep]`'s one pair of lengths."""
    if sweep.shared_prefix is not None:
        raise ConfigError(
            "[[shape]]: the shared-prefix workload has its lengths in [sweep] shared_prefix"
        )
    if not tables:
        raise ConfigError("[[shape]]: give at least one, or leave it out")
    for key in ("input_len", "output_len"):
        if _given(sweep, key):
            raise ConfigError(f"[sweep] {key}: with [[shape]] entries, give the lengths there")
    shapes = tuple(
        _shape(
            t.name or f"in{t.input_len}_out{t.output_len}",
            t.input_len,
            t.output_len,
            sweep.range_ratio if t.range_ratio is None else t.range_ratio,
        )
        for t in tables
    )
    _check_unique_names([s.name for s in shapes], "[[shape]]")
    return sweep.with_shapes(shapes)


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
    blocks = sweep.blocks or 1  # one block unless said
    return sweep.model_copy(update={"blocks": blocks, "repeats": blocks * sweep.visits_per_block()})


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


def _gate_shape(gate: Gate, where: str, sweep: Sweep) -> str:
    """The shape of the gate's load point, which must be one of the sweep's."""
    if (gate.concurrency is None) == (gate.request_rate is None):
        raise ConfigError(f"{where}: give concurrency or request_rate (one of them)")
    names = [s.name for s in sweep.shapes]
    if gate.shape is not None:
        if gate.shape not in names:
            raise ConfigError(f"{where} shape: no shape named {gate.shape!r} (shapes: {names})")
        shape = gate.shape
    elif len(names) > 1:
        raise ConfigError(f"{where}: missing key 'shape' (the run has shapes {names})")
    else:
        shape = names[0]
    if gate.request_rate is None:
        if gate.concurrency not in sweep.concurrencies:
            raise ConfigError(
                f"{where} concurrency {gate.concurrency}: not in [sweep] concurrencies "
                f"{list(sweep.concurrencies)}"
            )
    elif gate.request_rate not in sweep.request_rates:
        raise ConfigError(
            f"{where} request_rate {gate.request_rate:g}: not in [sweep] request_rates "
            f"{list(sweep.request_rates)}"
        )
    return shape


def _gates(config: Config, sweep: Sweep) -> tuple[Gate, ...]:
    """The gates checked against the arms, the SLOs and the load points, each at its shape."""
    names = [a.name for a in config.arms]
    gates = []
    for i, gate in enumerate(config.gates):
        where = f"[[gate]] #{i + 1}"
        if gate.metric in GOODPUT_METRICS and not config.slo.limits:
            raise ConfigError(f"{where} metric {gate.metric!r}: needs the SLOs of an [slo] section")
        for key in ("candidate", "baseline"):
            if getattr(gate, key) not in names:
                raise ConfigError(f"{where} {key}: no arm named {getattr(gate, key)!r}")
        if gate.candidate == gate.baseline:
            raise ConfigError(
                f"{where}: candidate and baseline are both {gate.candidate!r}; a gate "
                "compares two different arms"
            )
        shape = _gate_shape(gate, where, sweep)
        if gate.min_ratio is None and gate.max_ratio is None:
            raise ConfigError(f"{where}: give min_ratio, max_ratio or both")
        low, high = gate.min_ratio, gate.max_ratio
        if low is not None and high is not None and low > high:
            raise ConfigError(
                f"{where}: min_ratio {low:g} is above max_ratio {high:g}; no ratio can pass"
            )
        blocks = sweep.repeats // sweep.visits_per_block()
        if gate.judge == "confirmed" and blocks < 2:
            # The ratio's interval is over blocks (each repeat one without a block order).
            raise ConfigError(
                f"{where} judge 'confirmed': passes only on a 95% interval, which needs at "
                f"least 2 repeats (blocks with a block order); the sweep has {blocks}"
            )
        gates.append(gate.at_shape(shape, several_shapes=len(sweep.shapes) > 1))
    return tuple(gates)


def _check_pairs(items: tuple[str, ...], names: list[str]) -> None:
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


# ---------------------------------------------------------------- reading


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
        bench["shared_prefix"] = sw.shared_prefix.model_dump()
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


def tokens_settings(config: Config, arm: Arm, repeat: int) -> dict[str, Any]:
    t = config.tokens
    return {
        "kind": "tokens",
        "arm": arm_settings(config, arm),
        "repeat": repeat,
        "prompts": t.prompts,
        "input_len": t.input_len,
        "output_len": t.output_len,
        "seed": t.seed,
    }


def settings_key(settings: dict[str, Any]) -> str:
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
