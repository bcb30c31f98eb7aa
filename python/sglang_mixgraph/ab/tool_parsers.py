"""The arms' server arguments and the load generator's flags, checked by the parsers of the
tools that will read them before anything starts: one line each, naming the arm and argument.

Server arguments: SGLang's own parser (`plan_inputs.sglang_parser`, ServerArgs.add_cli_args),
when the launch runs `sglang.launch_server` (no `[server] command`, or one ending in
`-m sglang.launch_server`; another command's arguments are its own). `[server] args` are
parsed alone first, then each launched arm's `args` after them, as the launch passes them.

Load generator: `[sweep] dataset` and `backend` against bench_serving's choices, then the
argv a cell passes (`tools.bench_argv`, `extra_args` included) through bench_serving's parser.
SGLang 0.5.23 builds that parser inside `sglang.benchmark.serving.cli_main`, which parses
at once; `bench_parser` runs it with the module's `ArgumentParser` replaced for the call.
"""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path

from sglang_mixgraph.ab.config import CONCURRENCY, LAUNCH_MODULE, Config, Server
from sglang_mixgraph.ab.tools import bench_argv
from sglang_mixgraph.resolution.serving_client import BENCH_MODULE

SERVER_PARSER = "SGLang's parser"
BENCH_PARSER = "bench_serving's parser"
# What `bench_parser` relies on: cli_main builds `ArgumentParser(...)` (the name imported into
# the module) and calls its `parse_args()` before anything else runs.
BENCH_ENTRY = "cli_main"
BENCH_ENTRY_NAMES = ("ArgumentParser", "parse_args")
# Whole names, or the first word of an option (--tpp is near --tp-size and --pp-size).
SIMILAR = 0.75


class ToolArgumentError(ValueError):
    """A tool's parser refused an argv (argparse's message, one line)."""


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


class _HandBack(argparse.ArgumentParser):
    """Stands in for bench_serving's ArgumentParser: hands the built parser back at
    `parse_args` (bench_serving parses sys.argv and runs); errors raise instead of exiting."""

    def parse_args(self, args=None, namespace=None):
        raise _Built(self)

    def error(self, message: str):
        raise ToolArgumentError(" ".join(message.split()))


def bench_parser() -> argparse.ArgumentParser:
    """bench_serving's own parser, built by its `cli_main` and handed back before it parses."""
    from sglang_mixgraph.resolution.plan_inputs import quiet_import_warnings

    with quiet_import_warnings():
        from sglang.benchmark import serving

    entry = getattr(serving, BENCH_ENTRY, None)
    names = set(getattr(getattr(entry, "__code__", None), "co_names", ()))
    if not set(BENCH_ENTRY_NAMES) <= names:
        # Calling it otherwise would parse this tool's own command line and run a benchmark.
        raise ToolArgumentError(
            f"{BENCH_MODULE}.{BENCH_ENTRY} no longer builds its parser with "
            f"{' and '.join(BENCH_ENTRY_NAMES)}; this sglang-mixgraph cannot read its options"
        )
    saved = serving.ArgumentParser
    serving.ArgumentParser = _HandBack
    try:
        entry()
    except _Built as built:
        return built.parser
    finally:
        serving.ArgumentParser = saved
    raise ToolArgumentError(f"{BENCH_MODULE}.{BENCH_ENTRY} returned without parsing")


def _closest_options(parser: argparse.ArgumentParser, word: str) -> list[str]:
    """The options nearest a misspelt `word`, one per option, at most two, best first."""

    def similarity(option: str) -> tuple[float, float]:
        whole = difflib.SequenceMatcher(None, word, option).ratio()
        head = "--" + option.lstrip("-").split("-")[0]
        return max(whole, difflib.SequenceMatcher(None, word, head).ratio()), whole

    scored = []
    for action in parser._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            scored.append(max((similarity(o), o) for o in action.option_strings))
    scored.sort(key=lambda item: item[0], reverse=True)
    best = [option for score, option in scored if score == scored[0][0]] if scored else []
    return best[:2] if scored and scored[0][0][0] >= SIMILAR else []


def _did_you_mean(candidates: list[str]) -> str:
    return f" (did you mean {' or '.join(candidates)}?)" if candidates else ""


def _parse_problem(
    parser: argparse.ArgumentParser, argv: list[str], who: str
) -> tuple[str | None, str] | None:
    """Why `parser` refuses `argv`: (the argument, what is wrong), or None when it takes it."""
    from sglang_mixgraph.resolution.plan_inputs import ServerArgumentError

    try:
        _, unknown = parser.parse_known_args(argv)
    except (ServerArgumentError, ToolArgumentError) as e:
        named = re.fullmatch(r"argument (\S+): (.*)", str(e))
        if named:
            return named[1], f"{named[2]} ({who})"
        return None, f"{e} ({who})"
    if not unknown:
        return None
    word = unknown[0]
    if not word.startswith("-"):
        return repr(word), f"{who} takes no such value (after an option that takes none?)"
    option = word.split("=", 1)[0]
    return option, f"{who} does not know it{_did_you_mean(_closest_options(parser, option))}"


def _line(where: str, problem: tuple[str | None, str]) -> str:
    argument, text = problem
    return f"{where} {argument}: {text}" if argument else f"{where}: {text}"


def runs_launch_server(server: Server) -> bool:
    """The launch ends in SGLang's launch_server (its arguments are SGLang's)."""
    return not server.command or tuple(server.command[-2:]) == LAUNCH_MODULE


def server_arg_problems(config: Config) -> list[str]:
    """Each launched arm's server arguments through SGLang's parser, one line per arm."""
    from sglang_mixgraph.resolution.plan_inputs import quiet_import_warnings, sglang_parser

    launched = [arm for arm in config.arms if arm.url is None]
    if not launched or not runs_launch_server(config.server):
        return []
    with quiet_import_warnings():
        parser = sglang_parser()
    shared = list(config.server.args)
    if problem := _parse_problem(parser, shared, SERVER_PARSER):
        return [_line("[server] args", problem)]
    problems = []
    for arm in launched:
        if problem := _parse_problem(parser, [*shared, *arm.args], SERVER_PARSER):
            problems.append(_line(f"arm {arm.name!r} server argument", problem))
    return problems


def _choice_problem(parser: argparse.ArgumentParser, key: str, dest: str, value: str):
    for action in parser._actions:
        if action.dest == dest and action.choices is not None and value not in action.choices:
            choices = sorted(map(str, action.choices))
            close = difflib.get_close_matches(value, choices, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"it knows {', '.join(choices)}"
            return f"[sweep] {key} {value!r}: {BENCH_PARSER} does not know it ({hint})"
    return None


def bench_arg_problems(config: Config, *, accuracy_only: bool = False) -> list[str]:
    """The sweep's bench_serving flags through bench_serving's parser (none without a sweep)."""
    if accuracy_only:
        return []
    try:
        parser = bench_parser()
    except ToolArgumentError as e:
        return [str(e)]
    sw = config.sweep
    choices = [
        _choice_problem(parser, "dataset", "dataset_name", sw.dataset),
        _choice_problem(parser, "backend", "backend", sw.backend),
    ]
    if any(choices):
        return [line for line in choices if line]
    url = f"http://{config.server.host}:{config.server.port}"
    # Cells differ in their numbers only; one of each kind (concurrency, rate) per shape.
    firsts = {(p.shape, p.kind == CONCURRENCY): p for p in reversed(sw.points())}
    for point in firsts.values():
        argv = bench_argv(config, url, point, Path("cell.jsonl"))
        if problem := _parse_problem(parser, argv, BENCH_PARSER):
            # The tool's own flags are known; what it refuses is the user's unless named
            # only among them (an upstream that dropped one of the tool's flags).
            names = set((problem[0] or "").split("/"))
            tools_own = argv[: len(argv) - len(sw.extra_args)]
            ours = names & set(tools_own) and not names & set(sw.extra_args)
            where = f"the {BENCH_MODULE} command" if ours else "[sweep] extra_args"
            return [_line(where, problem)]
    return []
