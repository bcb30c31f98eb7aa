"""`sglang-mixgraph ab run [CONFIG]` and `sglang-mixgraph ab report RUN_DIR`.

`run` reads the TOML configuration (or builds one from flags alone: --model-path,
--server-args, --launch-prefix, --arm, --concurrencies, ...), applies the command-line
overrides (attach URLs, GSM8K data, repeats, concurrencies, lengths; this machine's id and
how many blocks to measure here), checks the run
directory, the configuration's paths and, with `--offline`, what it would download
(checks.py), that every launch prefix can run, every arm's environment against SGLang's
and the plugin's flags, its server arguments with SGLang's parser and the load generator's
flags with bench_serving's (tool_parsers.py; one line each, exit 2), then locks the run directory, refuses one that
holds finished cells this configuration leaves out unless `--force-new` (rundir.py), runs or
resumes the sweep in it and writes the report. A write that fails (a full disk) is one line
naming the run directory and the file; every file is written whole or not at all (files.py).
Finished cells measured with other versions (versions.py) are measured again unless
`--reuse-cells`. `--accuracy-only` runs only the GSM8K eval (one arm is enough) for CI jobs that only gate on
accuracy. `report` rebuilds report.md, results.json and the plots from a run directory; a
write that fails is one line naming the file, saying so when the directory is read-only.

`--dry-run` prints every visit's server and every cell's exact command, what the run would
download ("needs network: ..."), and an estimate of the time left (dryrun.py; its TPOT from
`--assume-tpot-ms`, else `[slo] tpot_ms`, else an assumption it names).

Exit status: 0 everything measured and every threshold and gate passed (PASS); 1 a cell
failed, an arm is below its GSM8K threshold, or a gate failed (FAIL), or cells are not
measured yet (INCOMPLETE, from `report`); 2 the configuration or the command line is wrong;
130 interrupted (Ctrl-C, SIGTERM or SIGHUP; INCOMPLETE, run the same command to resume).
"""

from __future__ import annotations

import argparse
import copy
import errno
import re
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_mixgraph.ab.config import (
    ConfigError,
    parse_config,
    read_toml,
    with_counts,
)
from sglang_mixgraph.ab.dryrun import ASSUMED_TPOT_MS
from sglang_mixgraph.ab.progress import DEFAULT_EVERY_S
from sglang_mixgraph.resolution.serving_client import url_problem

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _error(message: str) -> None:
    print(f"sglang-mixgraph ab: {message}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-mixgraph ab",
        description=(
            "A/B sweeps of SGLang serving throughput and latency (sglang.benchmark.serving) and "
            "GSM8K accuracy (SGLang's eval) between arms that differ in environment variables "
            "or server arguments. See docs/ab.md."
        ),
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser(
        "run", help="run or resume a sweep and write its report", allow_abbrev=False
    )
    run.add_argument(
        "config",
        nargs="?",
        help="TOML configuration (see examples/ab_dsv4.toml); without it, the flags below "
        "describe the whole run",
    )
    run.add_argument("--model-path", help="the model to launch (sets [server] model_path)")
    run.add_argument(
        "--server-args",
        metavar="'ARGS'",
        help="launch_server arguments of every arm, one quoted string (sets [server] args)",
    )
    run.add_argument(
        "--launch-prefix",
        metavar="'WRAPPER ARGS'",
        help="a wrapper put in front of every arm's server launch, one quoted string (sets "
        "[server] launch_prefix; after it, `python3 -m sglang.launch_server` unless [server] "
        "command or launch_python say otherwise; an arm's own launch_prefix wins)",
    )
    run.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME[:ENV=VALUE,...]",
        help="an arm with its environment (repeatable; the first is the baseline); added to "
        "the configuration's arms",
    )
    run.add_argument(
        "--only-arms",
        metavar="NAME,...",
        help="run only these arms of the configuration, in the configuration's order (the "
        "first of them is the baseline); gates on other arms are left out",
    )
    run.add_argument("--input-len", type=int, help="sets [sweep] input_len")
    run.add_argument("--output-len", type=int, help="sets [sweep] output_len")
    run.add_argument(
        "--gsm8k-threshold", type=float, help="sets [gsm8k] threshold (the accuracy gate)"
    )
    run.add_argument(
        "--run-dir",
        help="where raw outputs, logs and the report go (default: ab_runs/<config name>); "
        "reusing it resumes: finished cells are skipped",
    )
    run.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="ARM=URL",
        help="attach ARM to a server already running at URL instead of launching it (repeatable)",
    )
    run.add_argument(
        "--accuracy-only",
        action="store_true",
        help="only the GSM8K eval of each arm (one arm is enough); exit 1 below the threshold",
    )
    run.add_argument(
        "--gsm8k-data", metavar="PATH", help="local GSM8K test.jsonl (offline clusters)"
    )
    run.add_argument("--repeats", type=int, help="override [sweep] repeats")
    run.add_argument("--concurrencies", metavar="C1,C2,...", help="override [sweep] concurrencies")
    run.add_argument(
        "--request-rates",
        metavar="R1,R2,...",
        help="override [sweep] request_rates (requests per second, Poisson arrivals)",
    )
    run.add_argument(
        "--machine",
        metavar="ID",
        help="name this machine's run in every record (default: host name and boot id); a "
        "ratio pairs cells of one machine only",
    )
    run.add_argument(
        "--max-blocks",
        type=int,
        metavar="N",
        help="measure at most N blocks not finished yet, then stop (one machine's share of a "
        "run whose blocks run on several machines)",
    )
    run.add_argument(
        "--reuse-cells",
        action="store_true",
        help="keep finished cells measured with other versions (SGLang, sglang-mixgraph, torch, "
        "git commit, GPUs); by default they are measured again",
    )
    run.add_argument(
        "--progress-every",
        type=float,
        default=DEFAULT_EVERY_S,
        metavar="SECONDS",
        help="while a cell runs or a server starts, print its elapsed time and its log's last "
        f"line this often (default {DEFAULT_EVERY_S:g})",
    )
    run.add_argument(
        "--offline",
        action="store_true",
        help="refuse to start when the run would download anything (GSM8K data, the ShareGPT "
        "text of dataset random, a model by hub id); sets [run] offline",
    )
    run.add_argument(
        "--force-new",
        action="store_true",
        help="start a new run in --run-dir: an earlier run there is moved aside to "
        "RUN_DIR.old-<time>, nothing is deleted",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="check the configuration, the arms' flags, their server arguments (SGLang's "
        "parser) and the load generator's flags (bench_serving's parser), print every "
        "server's and cell's command and an estimate of the time left, run nothing",
    )
    run.add_argument(
        "--assume-tpot-ms",
        type=float,
        metavar="MS",
        help="with --dry-run: the TPOT the estimate models cells with (over [slo] tpot_ms; "
        f"without either it assumes {ASSUMED_TPOT_MS:g} ms)",
    )
    report = sub.add_parser(
        "report", help="rebuild report.md, results.json and plots from a run directory"
    )
    report.add_argument("run_dir")
    return parser


def _arm_from_flag(spec: str) -> dict[str, Any]:
    name, _, env_text = spec.partition(":")
    env = {}
    for item in filter(None, (x.strip() for x in env_text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--arm {spec!r}: expected NAME[:ENV=VALUE,...]")
        env[key] = value
    return {"name": name, "env": env}


def _only_arms(arms: list[Any], spec: str) -> list[Any]:
    wanted = [n.strip() for n in spec.split(",") if n.strip()]
    names = [a.get("name") for a in arms if isinstance(a, dict)]
    unknown = [n for n in wanted if n not in names]
    if not wanted or unknown:
        problem = (
            f"no arm named {', '.join(map(repr, unknown))}"
            if unknown
            else "give arm names, comma-separated"
        )
        raise ConfigError(
            f"--only-arms {spec!r}: {problem} (the arms: {', '.join(map(str, names)) or 'none'})"
        )
    return [a for a in arms if isinstance(a, dict) and a.get("name") in wanted]


def _comma_list(text: str, convert: Callable[[str], Any], flag: str, what: str) -> list[Any]:
    try:
        return [convert(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: {what}, comma-separated") from None


def _table(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """The section a flag writes into (created when missing)."""
    table = raw.setdefault(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{name}]: expected a table, got {table!r}")
    return table


def _apply_overrides(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    sets_server = args.model_path or args.server_args or args.launch_prefix is not None
    server = _table(raw, "server") if sets_server else None
    if args.model_path:
        server["model_path"] = args.model_path
    if args.server_args:
        try:
            server["args"] = shlex.split(args.server_args)
        except ValueError as e:
            raise ConfigError(f"--server-args: {e}") from None
    if args.launch_prefix is not None:  # "" sets no prefix (over the configuration's)
        try:
            server["launch_prefix"] = shlex.split(args.launch_prefix)
        except ValueError as e:
            raise ConfigError(f"--launch-prefix: {e}") from None
    if args.arm:
        if not isinstance(raw.setdefault("arm", []), list):
            raise ConfigError(f"[[arm]]: expected a list of tables, got {raw['arm']!r}")
        raw["arm"].extend(_arm_from_flag(spec) for spec in args.arm)
    if args.only_arms is not None:
        raw["arm"] = _only_arms(raw.get("arm", []), args.only_arms)
        kept = {a["name"] for a in raw["arm"]}
        raw["gate"] = [
            g
            for g in raw.get("gate", [])
            if not isinstance(g, dict) or {g.get("candidate"), g.get("baseline")} <= kept
        ]
    for flag, key in (("input_len", "input_len"), ("output_len", "output_len")):
        if getattr(args, flag) is not None:
            _table(raw, "sweep")[key] = getattr(args, flag)
    if args.gsm8k_threshold is not None:
        _table(raw, "gsm8k")["threshold"] = args.gsm8k_threshold
    arms = raw.get("arm", [])
    for item in args.url:
        name, sep, url = item.partition("=")
        if not sep or not url:
            raise ConfigError(f"--url {item!r}: expected ARM=URL")
        if problem := url_problem(url):
            raise ConfigError(f"--url {item!r}: {problem}")
        matches = [a for a in arms if isinstance(a, dict) and a.get("name") == name]
        if not matches:
            raise ConfigError(f"--url {item!r}: no arm named {name!r}")
        matches[0]["url"] = url
    if args.gsm8k_data:
        if not Path(args.gsm8k_data).is_file():
            raise ConfigError(f"--gsm8k-data {args.gsm8k_data}: no such file")
        _table(raw, "gsm8k")["data_path"] = str(Path(args.gsm8k_data).resolve())
    if args.offline:
        _table(raw, "run")["offline"] = True
    if args.repeats is not None:
        _table(raw, "sweep")["repeats"] = args.repeats
    if args.concurrencies is not None:
        _table(raw, "sweep")["concurrencies"] = _comma_list(
            args.concurrencies, int, "--concurrencies", "integers"
        )
    if args.request_rates is not None:
        _table(raw, "sweep")["request_rates"] = _comma_list(
            args.request_rates, float, "--request-rates", "numbers"
        )
    if args.max_blocks is not None and args.max_blocks < 1:
        raise ConfigError(f"--max-blocks {args.max_blocks}: must be 1 or more")
    if args.machine is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", args.machine):
        raise ConfigError(f"--machine {args.machine!r}: letters, digits, '.', '_' and '-' only")
    if args.assume_tpot_ms is not None:
        if not args.dry_run:
            raise ConfigError("--assume-tpot-ms: only with --dry-run (it sets the estimate's TPOT)")
        if not (0 < args.assume_tpot_ms <= 60_000):
            raise ConfigError(
                f"--assume-tpot-ms {args.assume_tpot_ms:g}: must be above 0 and at most 60000 ms"
            )
    if not (0 < args.progress_every <= 86400):
        raise ConfigError(
            f"--progress-every {args.progress_every:g}: must be above 0 and at most 86400 s"
        )
    return raw


def _describe_gpu_for_dry_run() -> Any:
    """`plan`'s choice of GPU (this machine's, else the default), described to SGLang in this
    process so that --dry-run resolves each arm as `plan` would; before `sglang.srt` loads."""
    from sglang_mixgraph.resolution.local_gpu import choose_target
    from sglang_mixgraph.resolution.resolve import select_described_platform

    target = choose_target(None)
    select_described_platform(target.name)
    return target


def _raise_interrupt(signum: int, frame: Any) -> None:
    # SIGTERM (a cancelled CI job) and SIGHUP (a closed terminal) clean up like Ctrl-C.
    raise KeyboardInterrupt


INTERRUPTS = (signal.SIGTERM, signal.SIGHUP)


def cmd_run(args: argparse.Namespace, invoker: Any = None) -> int:
    target = _describe_gpu_for_dry_run() if args.dry_run else None
    from sglang_mixgraph.ab import arms, checks, network, rundir, runner, server, tool_parsers

    path = Path(args.config) if args.config else None
    try:
        if path is None and not (args.accuracy_only or args.concurrencies or args.request_rates):
            raise ConfigError(
                "--concurrencies (or --request-rates): needed without a configuration file"
            )
        raw = _apply_overrides(read_toml(path) if path else {}, args)
        config = parse_config(raw, accuracy_only=args.accuracy_only)
    except ConfigError as e:
        _error(str(e))
        return EXIT_USAGE
    stem = path.stem if path else "-vs-".join(a.name for a in config.arms)
    run_dir = Path(args.run_dir or Path("ab_runs") / stem)
    problems = [
        *filter(None, [checks.run_dir_problem(run_dir)]),
        *checks.config_path_problems(
            config, accuracy_only=args.accuracy_only, dry_run=args.dry_run
        ),
        *checks.offline_problems(config, accuracy_only=args.accuracy_only),
        *server.launch_problems(config),
        *arms.env_problems(config),
        *tool_parsers.server_arg_problems(config),
        *tool_parsers.bench_arg_problems(config, accuracy_only=args.accuracy_only),
    ]
    visits = runner.plan(config, accuracy_only=args.accuracy_only)
    recorded = raw if args.accuracy_only else with_counts(raw, config.sweep)
    digest = rundir.digest(recorded, args.accuracy_only)
    planned = {c.stem for v in visits for c in v.cells}
    if not problems and run_dir.is_dir():
        problems += filter(None, [runner.record_problem(run_dir)])
    if not problems and not args.force_new and run_dir.is_dir():
        problems += filter(None, [rundir.conflict(run_dir, digest, planned)])
    arm_plans = None
    if not problems and target is not None:
        from sglang_mixgraph.ab.arm_plans import plan_arms

        arm_plans = plan_arms(config, target)
        problems += arm_plans.problems
    if problems:
        for problem in problems:
            _error(problem)
        return EXIT_USAGE
    notes = arms.attached_env_note(config)
    earlier = rundir.recorded_digest(run_dir) if run_dir.is_dir() else None
    if earlier not in (None, digest) and not args.force_new:
        notes.append(
            f"run directory {run_dir}: configuration {earlier} -> {digest}, which keeps every "
            "cell it finished"
        )
    fetches = network.fetches(config, accuracy_only=args.accuracy_only)
    if args.dry_run:
        _notes(notes)
        for warning in arm_plans.warnings:
            print(f"sglang-mixgraph ab: warning: {warning}", file=sys.stderr)
        return _dry_run(config, run_dir, visits, args, digest, fetches, arm_plans.lines)
    try:
        # First: a run directory in use is refused at once, before anything else is said.
        lock, moved = rundir.take(run_dir, digest, planned, args.force_new)
    except (rundir.RunDirBusy, ValueError) as e:
        _error(str(e))
        return EXIT_USAGE
    except OSError as e:
        _error(f"run directory {run_dir}: cannot lock it ({e.strerror or e})")
        return EXIT_USAGE
    try:
        _notes(notes + [fetch.line() for fetch in fetches])
        if moved is not None:
            _notes([f"the earlier run is kept in {moved}"])
        return _run_locked(config, run_dir, visits, args, recorded, invoker)
    finally:
        lock.release()


def _notes(lines: list[str]) -> None:
    for line in lines:
        print(f"sglang-mixgraph ab: note: {line}", file=sys.stderr)


def _dry_run(
    config: Any,
    run_dir: Path,
    visits: list[Any],
    args: argparse.Namespace,
    digest: str,
    fetches: list[Any],
    arm_lines: dict[str, list[str]],
) -> int:
    from sglang_mixgraph.ab import dryrun, rundir, runner, server, versions

    env = versions.environment()
    current = None if args.reuse_cells else env
    print(f"run directory: {run_dir}")
    fresh = args.force_new and run_dir.is_dir() and rundir.holds_a_run(run_dir)
    if fresh:
        print(f"a new run (configuration {digest}): the earlier run would be moved aside")
    for arm in config.arms:
        if arm.url is None:
            print(f"server {arm.name}: {server.launch_line(config, arm)}")
            for line in arm_lines.get(arm.name, []):
                print(line)
        else:
            print(f"server {arm.name}: attached at {arm.url}")
    for line in dryrun.plan_lines(config, run_dir, visits, current, fresh=fresh):
        print(line)
    for fetch in fetches:
        print(fetch.line())
    latency = dryrun.latency_model(config, args.assume_tpot_ms)
    print(dryrun.estimate_line(config, run_dir, visits, current, latency, fresh=fresh))
    print(f"versions: {versions.describe(env)}")
    if current is not None and not fresh:
        changed = runner.stale(run_dir, [c for v in visits for c in v.cells], env)
        if changed:
            print(f"measured again for other versions: {'; '.join(changed)}")
    return 0


def _run_locked(
    config: Any,
    run_dir: Path,
    visits: list[Any],
    args: argparse.Namespace,
    recorded: dict[str, Any],
    invoker: Any,
) -> int:
    """The run itself, in the run directory this process holds."""
    from sglang_mixgraph.ab import report, results, runner

    try:
        results.write_run_file(run_dir, recorded, args.accuracy_only)
    except OSError as e:  # checked above; a race or a full disk
        _error(f"run directory {run_dir}: cannot write {results.RUN_FILE} ({e.strerror or e})")
        return EXIT_USAGE
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in INTERRUPTS}
    try:
        kwargs: dict[str, Any] = {
            "reuse_cells": args.reuse_cells,
            "progress_every_s": args.progress_every,
            "machine": args.machine,
            "max_blocks": args.max_blocks,
        }
        if invoker is not None:
            kwargs["invoker"] = invoker
        outcome = runner.run(config, run_dir, visits, **kwargs)
        _restore(previous)
        built, plots = report.build(run_dir)
    except OSError as e:
        # A full disk mid-run: the servers are stopped, every record written is kept.
        where = f" ({e.filename})" if e.filename else ""
        _error(
            f"run directory {run_dir}: cannot write{where}: {e.strerror or e}; finished cells "
            "are kept, free space and run the same command to resume"
        )
        return EXIT_USAGE
    except results.RunDirError as e:  # e.g. a pair measured on two machines
        _error(str(e))
        return EXIT_USAGE
    finally:
        _restore(previous)
    for line in plots:
        if line == report.PLOTS_SKIPPED:
            print(f"sglang-mixgraph ab: {line}", file=sys.stderr)
    print(f"report: {run_dir / 'report.md'}")
    if outcome.interrupted:
        for problem in built.problems:
            _error(problem.splitlines()[0])
        _error(f"interrupted; finished cells are kept, run the same command to resume ({run_dir})")
        print(built.status)
        return EXIT_INTERRUPTED
    return _verdict(built)


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _verdict(built: Any) -> int:
    if built.passed:
        print(built.status)
        return 0
    for problem in built.problems:
        _error(problem.splitlines()[0])
    if built.missing:
        _error(f"{len(built.missing)} not measured yet, e.g. {built.missing[0]}")
    print(built.status)
    return EXIT_FAILED


def cmd_report(args: argparse.Namespace) -> int:
    from sglang_mixgraph.ab import report
    from sglang_mixgraph.ab.results import RunDirError
    from sglang_mixgraph.ab.runner import RecordError

    run_dir = Path(args.run_dir)
    try:
        built, plots = report.build(run_dir)
    except (RunDirError, ConfigError, RecordError) as e:
        _error(str(e))
        return EXIT_USAGE
    except OSError as e:  # reads catch their own errors: what fails here is a write
        _error(_report_write_problem(run_dir, e))
        return EXIT_USAGE
    for line in plots:
        if line == report.PLOTS_SKIPPED:
            print(f"sglang-mixgraph ab: {line}", file=sys.stderr)
    print(f"report: {run_dir / 'report.md'}")
    return _verdict(built)


def _report_write_problem(run_dir: Path, e: OSError) -> str:
    """Why `ab report` could not write a report file, and what to do; every file is whole."""
    where = f"run directory {run_dir}: cannot write {e.filename or 'the report'}: {e.strerror or e}"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"{where}; the run directory is read-only (an archived run?): copy it somewhere "
            "writable and run `sglang-mixgraph ab report` on the copy"
        )
    return f"{where}; every report file is whole (this one as before): free space and run again"


def main(argv: list[str], *, invoker: Any = None) -> int:
    """`invoker` replaces the child-process runner of SGLang's tools (tests only)."""
    args = _parser().parse_args(argv)
    try:
        if args.action == "report":
            return cmd_report(args)
        return cmd_run(args, invoker)
    except KeyboardInterrupt:
        # Before or after the sweep (the checks' imports, the report): no server is running.
        _error("interrupted; nothing it started is left running")
        return EXIT_INTERRUPTED
