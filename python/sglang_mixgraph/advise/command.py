"""The advise command behind its front (cli/advise.py): check the arguments, profile or read
the traces, judge, print.

`run` takes the parsed arguments. With `--url` it asks the server for its facts, profiles its
steps (after the load's warm-up, with `--load`) into `--trace-dir` (a temporary directory,
removed on any failure, without it) and judges every rank's trace; without `--url` it judges
the newest profile SGLang's profiler wrote into `--trace-dir`. Every failure is one line on
stderr: exit 2 for the command line, 1 when the server, its traces or its steps give no
answer, 130 when interrupted (SIGTERM and SIGHUP clean up as Ctrl-C does).
"""

from __future__ import annotations

import json
import lzma
import math
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

MAX_STEPS = 1000
MAX_TIMEOUT_S = 86400.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


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
    if args.server_log and not Path(args.server_log).expanduser().is_file():
        return f"--server-log {args.server_log} is not a file"
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
        "unprofiled": None,
        "served": None,
        "trace_dir": str(trace_dir),
        "profile_id": profile_id,
        "traces": [str(p) for p in traces],
        "profiles_in_dir": len(profiles),
        "ranks_expected": len(traces),
        "steps_requested": None,
        "stopped_early": None,
        "load_log": None,
    }
    scale, _ = _log_evidence(args, facts, profile_id, 0, None, load=False)
    return _judge(args, facts, traces, profile, scale)


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
    load = log = duration = None
    offset = 0  # without --load: the steps the server ran before the profile, from its log
    try:
        if args.load:
            burst = capture.Load(extra=tuple(shlex.split(args.load_args)))
            load, log = capture.start_load(server.url, burst, trace_dir)
            # The client's warm-up requests are not the burst: profile the main run only.
            capture.wait_for_main_run(load, log, args.timeout)
            if args.server_log:
                # Unprofiled steps of the burst first: the log times them to price the host.
                offset = _log_size(args.server_log)
                log_path = Path(args.server_log).expanduser()
                capture.wait_for_batches(load, log_path, offset, args.steps, args.timeout)
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
        if load is not None and args.server_log:
            # The burst to its end: with the client's duration it splits into its phases.
            duration = capture.wait_for_load_end(load, log, args.timeout)
    finally:
        if load is not None:
            capture.stop_load(load)
    profile = {
        "source": "live",
        "unprofiled": None,
        "served": None,
        "trace_dir": str(trace_dir),
        "profile_id": profile_id,
        "traces": [str(p) for p in got.traces],
        "ranks_expected": facts.expected_traces,
        "steps_requested": args.steps,
        "stopped_early": got.stopped,
        "load_log": str(log) if log else None,
    }
    scale, served = _log_evidence(args, facts, profile_id, offset, duration, load=args.load)
    return _judge(args, facts, got.traces, profile, scale, served)


def _log_size(path: str | None) -> int:
    from sglang_mixgraph.advise.server import AdviseError

    if not path:
        return 0
    try:
        return Path(path).expanduser().stat().st_size
    except OSError as e:
        raise AdviseError(f"cannot read --server-log {path}: {e.strerror or e}") from None


def _log_evidence(args, facts, profile_id: str, offset: int, duration, *, load: bool):
    """What the server's log (read once, from `offset`) says (docs/advise.md): the eager host
    without the profiler, a HostScale or the problem (a phrase) that left the host as
    profiled; and with --load the burst split into its prefill phase and the rest, a
    ServedShare or the problem. (None, None) without --server-log."""
    from sglang_mixgraph.advise.server import AdviseError
    from sglang_mixgraph.advise.server_log import HostScale, host_scale, served_share
    from sglang_mixgraph.core.prefill_log import read_tail

    if not args.server_log:
        return None, None
    if facts.dp_size > 1 or facts.attn_dp_size > 1:
        scale = "under data parallelism the log interleaves the ranks' batches"
        text = None
    else:
        try:
            text = read_tail(Path(args.server_log).expanduser(), offset)
        except OSError as e:
            raise AdviseError(
                f"cannot read --server-log {args.server_log}: {e.strerror or e}"
            ) from None
        scale = host_scale(text, profile_id)
    if not load:
        return scale, None
    if not isinstance(scale, HostScale):
        return scale, "no unprofiled host to price the profiled batches with"
    if duration is None:
        return scale, f"the load client printed no benchmark duration within {args.timeout:g} s"
    return scale, served_share(text, profile_id, scale, duration)


def _judge(args, facts, traces: list[Path], profile: dict, found=None, served=None) -> str:
    """Read every rank's trace and judge: the report's text (or strict JSON). `found` and
    `served` are `_log_evidence`'s answers, recorded in the profile as `unprofiled` and
    `served`."""
    from sglang_mixgraph.advise.report import report_json, report_text
    from sglang_mixgraph.advise.server import AdviseError
    from sglang_mixgraph.advise.server_log import HostScale, ServedShare
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
    scale = found if isinstance(found, HostScale) else None
    if found is not None:
        profile["unprofiled"] = scale.to_json() if scale else {"problem": found}
    share = served if isinstance(served, ServedShare) else None
    if served is not None:
        profile["served"] = share.to_json() if share else {"problem": served}
    verdicts = all_verdicts(Inputs(facts, gpu, steps, model, problem, scale, share))
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


def run(args, prog: str) -> int:
    """The command on parsed arguments: the report on stdout, or one line on stderr naming
    `prog`; the exit status (2 for the command line, 1 when there is no answer, 130 when
    interrupted)."""
    from sglang_mixgraph.advise.server import AdviseError

    if problem := _argument_problem(args):
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    handled = (signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _interrupted) for sig in handled}
    try:
        return advise(args)
    except AdviseError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        # The load client and a temporary trace directory are gone by now (finally blocks).
        print(f"{prog}: interrupted; nothing it started is left running", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
