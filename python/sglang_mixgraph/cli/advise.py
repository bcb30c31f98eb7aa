"""`sglang-mixgraph advise`: which of this plugin's patches pays on a running server.

With `--url` it attaches to the server (starts none), profiles `--steps` forward steps through
SGLang's own `/start_profile` (traces in `--trace-dir`, which the server writes on its own
host), optionally sends a burst with SGLang's benchmark client (`--load`, profiled once its
warm-up is over), reads every rank's trace and prints what to switch on first and the evidence
(`--json`: the same with a `schema_version`). Without `--url` it reads the traces SGLang's
profiler wrote earlier into `--trace-dir`. The parts live in `sglang_mixgraph.advise`
(docs/advise.md). Every failure is one line on stderr: exit 2 for the command line, 1 when the
server, its traces or its steps give no answer.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

NAME = "advise"
HELP = "profile a running SGLang server and say which of the plugin's patches pays there"
PROG = f"sglang-mixgraph {NAME}"
MAX_STEPS = 1000
MAX_TIMEOUT_S = 86400.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


def _one_line_error(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(2)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Attach to a running SGLang server (starts none), profile a few forward steps with "
            "its /start_profile endpoint, and say which of this plugin's patches would shorten "
            "its MIXED steps, with the evidence; without --url, read the traces SGLang's "
            "profiler wrote earlier into --trace-dir. See docs/advise.md."
        ),
        allow_abbrev=False,
    )
    parser.error = _one_line_error  # one line, not argparse's usage block
    parser.add_argument(
        "--url",
        help="the server to profile, e.g. http://127.0.0.1:30000 (without it: read the traces "
        "recorded earlier in --trace-dir)",
    )
    parser.add_argument(
        "--trace-dir",
        help="with --url: where the server writes its traces (kept there); it writes on its own "
        "host, so this must be a directory both machines see (default: a fresh temporary "
        "directory). Without --url: the directory of traces SGLang's profiler wrote earlier",
    )
    parser.add_argument(
        "--steps", type=int, default=16, help="forward steps to profile (default 16)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the steps before stopping the profile, and with --load first "
        "for the client's warm-up to end (default 60 each)",
    )
    parser.add_argument(
        "--load",
        action="store_true",
        help="send a short burst with SGLang's benchmark client while profiling",
    )
    parser.add_argument(
        "--load-args",
        default="",
        metavar="'ARGS'",
        help="more arguments for the benchmark client, one quoted string (with --load)",
    )
    parser.add_argument(
        "--model-path",
        help="a local directory (or config.json) with the served model's config, when the "
        "server's model path is not readable here",
    )
    parser.add_argument(
        "--stack",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="profile with Python stacks: kernels classed by their frames and the plugin's "
        "patches seen, but SGLang takes much longer to write the traces, so its /stop_profile "
        "is given a longer bound (docs/advise.md); default off",
    )
    parser.add_argument("--api-key", help="the server's admin or API key (sent as a bearer token)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _argument_problem(args) -> str | None:
    from sglang_mixgraph.resolution.serving_client import url_problem

    if args.url is None:
        if not args.trace_dir:
            return "give --url (a server to profile) or --trace-dir (traces recorded earlier)"
        if args.load:
            return "--load needs --url (a server to send it to)"
        if not Path(args.trace_dir).expanduser().is_dir():
            return f"--trace-dir {args.trace_dir} is not a directory"
    elif problem := url_problem(args.url):
        return f"--url {args.url}: {problem}"
    if not 1 <= args.steps <= MAX_STEPS:
        return f"--steps must be between 1 and {MAX_STEPS}, not {args.steps}"
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S):
        return f"--timeout must be more than 0 and at most {MAX_TIMEOUT_S:.0f} s"
    if args.load_args and not args.load:
        return "--load-args needs --load"
    try:
        shlex.split(args.load_args)
    except ValueError as e:
        return f"--load-args: {e}"
    if args.trace_dir and Path(args.trace_dir).expanduser().exists():
        if not Path(args.trace_dir).expanduser().is_dir():
            return f"--trace-dir {args.trace_dir} is not a directory"
    if args.model_path:
        p = Path(args.model_path).expanduser()
        if not (p.is_file() or (p / "config.json").is_file()):
            return f"--model-path {args.model_path}: no config.json there"
    return None


def _trace_dir(arg: str | None) -> Path:
    from sglang_mixgraph.advise.server import AdviseError

    if not arg:
        return Path(tempfile.mkdtemp(prefix="mixgraph-advise-"))
    path = Path(arg).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AdviseError(f"cannot create --trace-dir {path}: {e.strerror or e}", code=2) from None
    return path


def _read_rank(path: Path, profile_id: str):
    import gzip

    from sglang_mixgraph.advise.server import AdviseError
    from sglang_mixgraph.advise.steps import read_steps
    from sglang_mixgraph.core.kernel_classes import read_trace

    rank = path.name.removeprefix(profile_id + "-").split(".trace.json")[0]
    try:
        doc = read_trace(str(path))
    except (OSError, ValueError, EOFError, lzma.LZMAError, gzip.BadGzipFile) as e:
        raise AdviseError(f"cannot read the trace {path}: {e}") from None
    try:
        return read_steps(doc, rank)
    except (KeyError, TypeError, ValueError) as e:
        raise AdviseError(f"cannot read the trace {path}: malformed event ({e!r})") from None


def _model_layers(path: str):
    from sglang_mixgraph.advise.split_pricing import read_model_layers

    if not path:
        return None, "no model path is known: give the model's config.json with --model-path"
    try:
        return read_model_layers(path), None
    except (OSError, ValueError, TypeError, AttributeError) as e:
        why = getattr(e, "strerror", None) or e
        return None, (
            f"the model's config.json is not readable here ({path}: {why}); give a copy of it "
            "with --model-path"
        )


def advise(args) -> int:
    from sglang_mixgraph.advise.server import Server, ServerFacts

    if args.url is None:
        print(_read_earlier(args))
        return 0
    server = Server(args.url, args.api_key)
    info, model_info = server.get_json("/server_info"), server.get_json("/model_info")
    facts = ServerFacts.read(server.url, info, model_info)
    temporary = not args.trace_dir
    trace_dir = _trace_dir(args.trace_dir)  # once the server answers: no temporary dir left
    try:
        report = _profile_and_judge(args, server, facts, trace_dir, keep_log=not temporary)
    except BaseException:
        # Ctrl-C or any one-line failure: a directory made for this run goes with it.
        if temporary:
            shutil.rmtree(trace_dir, ignore_errors=True)
        raise
    print(report)
    return 0


def _read_earlier(args) -> str:
    """The newest profile SGLang's profiler wrote into --trace-dir, judged without a server."""
    from sglang_mixgraph.advise import capture
    from sglang_mixgraph.advise.server import AdviseError, ServerFacts

    trace_dir = Path(args.trace_dir).expanduser().resolve()
    profiles = capture.recorded_profiles(trace_dir)
    if not profiles:
        raise AdviseError(
            f"no SGLang trace in {trace_dir}: its profiler writes "
            "<profile_id>-TP-<rank>...trace.json.gz there"
        )
    profile_id, traces = profiles[0]
    config = None
    if args.model_path:
        config = _model_config(args.model_path)
    facts = ServerFacts.offline(len(traces), args.model_path, config)
    profile = {
        "source": "recorded",
        "trace_dir": str(trace_dir),
        "profile_id": profile_id,
        "traces": [str(p) for p in traces],
        "profiles_in_dir": len(profiles),
        "ranks_expected": len(traces),
        "steps_requested": None,
        "stopped_early": None,
        "load_log": None,
    }
    return _judge(args, facts, traces, profile)


def _model_config(path: str) -> dict:
    from sglang_mixgraph.advise.server import AdviseError

    p = Path(path).expanduser()
    p = p if p.is_file() else p / "config.json"
    try:
        config = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise AdviseError(f"cannot read {p}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(config, dict):
        raise AdviseError(f"{p} is not a model config (a JSON object)")
    return config


def _profile_and_judge(args, server, facts, trace_dir: Path, *, keep_log: bool) -> str:
    """Profile (after the load's warm-up), read every rank's trace and judge."""
    from sglang_mixgraph.advise import capture

    profile_id = capture.new_profile_id()
    body = capture.profile_request(trace_dir, args.steps, args.stack, profile_id)
    load = log = None
    try:
        if args.load:
            burst = capture.Load(extra=tuple(shlex.split(args.load_args)))
            load, log = capture.start_load(server.url, burst, trace_dir)
            # The client's warm-up requests are not the burst: profile the main run only.
            capture.wait_for_main_run(load, log, args.timeout)
        capture.start_profile(server, body)
        got = capture.collect(
            server,
            trace_dir,
            profile_id,
            facts.expected_traces,
            args.timeout,
            load,
            log,
            keep_log=keep_log,
            with_stack=args.stack,
        )
    finally:
        if load is not None:
            capture.stop_load(load)
    profile = {
        "source": "live",
        "trace_dir": str(trace_dir),
        "profile_id": profile_id,
        "traces": [str(p) for p in got.traces],
        "ranks_expected": facts.expected_traces,
        "steps_requested": args.steps,
        "stopped_early": got.stopped,
        "load_log": str(log) if log else None,
    }
    return _judge(args, facts, got.traces, profile)


def _judge(args, facts, traces: list[Path], profile: dict) -> str:
    """Read every rank's trace and judge: the report's text (or strict JSON)."""
    from sglang_mixgraph.advise.report import report_json, report_text
    from sglang_mixgraph.advise.server import AdviseError
    from sglang_mixgraph.advise.summary import kind_rows
    from sglang_mixgraph.advise.verdicts import Inputs, all_verdicts

    ranks = [_read_rank(p, profile["profile_id"]) for p in traces]
    steps = [s for r in ranks for s in r.steps]
    if not steps:
        if facts.url is None:
            raise AdviseError(f"the traces in {profile['trace_dir']} hold no forward step")
        raise AdviseError(
            "the server ran no forward step while it was profiled: there were no steps to "
            "profile (send it traffic, or use --load)"
        )
    gpu = next((r.gpu for r in ranks if r.gpu is not None), None)
    model = problem = None
    if facts.deepseek_v4:
        model, problem = _model_layers(args.model_path or facts.model_path)
    verdicts = all_verdicts(Inputs(facts, gpu, steps, model, problem))
    rows = kind_rows(steps, facts)
    profile |= {
        "ranks_read": len(ranks),
        "steps": len(steps),
        "with_stack": all(r.with_stack for r in ranks),
    }
    report = report_json(facts, gpu, profile, verdicts, rows)
    if not args.json:
        return report_text(report, verdicts, rows)
    try:
        return json.dumps(report, indent=1, allow_nan=False)
    except ValueError:  # a NaN or infinity the traces slipped past their reader
        raise AdviseError(
            "the traces give a figure that is not a number (NaN or infinity); no JSON is "
            "printed rather than invalid JSON"
        ) from None


def _interrupted(signum: int, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM and SIGHUP clean up as Ctrl-C does


def cmd_advise(args: argparse.Namespace) -> int:
    from sglang_mixgraph.advise.server import AdviseError

    if problem := _argument_problem(args):
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    handled = (signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _interrupted) for sig in handled}
    try:
        return advise(args)
    except AdviseError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        # The load client and a temporary trace directory are gone by now (finally blocks).
        print(f"{PROG}: interrupted; nothing it started is left running", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
