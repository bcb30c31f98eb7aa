"""What `ab run` checks on disk before anything starts (`--dry-run` included): one line each.

The run directory: it either does not exist yet and can be created (the nearest existing
parent is a writable directory, not a file), or it is a writable directory that is empty (but
for the lock of a run that stopped before writing) or one `ab run` wrote (it holds
`run.json`); a file, or a directory of other files, is refused instead of failing later with
a traceback or mixing outputs into it.

The configuration's paths, as the processes this tool starts will see them (relative paths
are relative to the directory the tool runs in):
- `[sweep] dataset_path` (read by bench_serving here) and `[gsm8k] data_path` (read by the
  eval here) must exist, when the sweep or the eval runs; the GSM8K file must read as SGLang's
  eval reads it (`sglang.utils.read_jsonl`: UTF-8 JSON lines, `#` lines skipped) with a
  `question` and an `answer` on every line and more lines than `num_shots`; for the datasets
  `random` and `sharegpt` the dataset file must load as bench_serving's ShareGPT loader loads
  it (`sharegpt_problem`), with a conversation for every prompt of a cell;
- `[server] model_path` must be an existing directory when it is written as a local path
  (absolute, or starting with `.` or `~`) and an arm launches without `[server] command`: a
  Hugging Face id (`org/name`) is not checked, and a command (a container, `srun`) may see
  another filesystem; under `--dry-run` a path that is not on this machine is previewed
  (arm_plans.py warns);
- `[server] command`'s first word, and `launch_python`, when an arm runs them without a launch
  prefix (after a prefix the wrapper decides what they mean); the prefixes themselves are
  checked by `server.launch_problems`.
With `--offline` (`[run] offline`), every fetch the run would make (network.py) is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang_mixgraph.ab.config import Config, launch_command, launch_prefix
from sglang_mixgraph.ab.network import SHAREGPT_DATASETS, fetches, local_path
from sglang_mixgraph.ab.results import RUN_FILE
from sglang_mixgraph.ab.rundir import LOCK_FILE
from sglang_mixgraph.ab.server import executable_problem


def run_dir_problem(run_dir: Path) -> str | None:
    where = f"run directory {run_dir}"
    if run_dir.exists() or run_dir.is_symlink():
        if not run_dir.is_dir():
            return f"{where}: exists and is not a directory"
        if not os.access(run_dir, os.W_OK | os.X_OK):
            return f"{where}: not writable"
        run_file = run_dir / RUN_FILE
        if run_file.exists():
            return None if run_file.is_file() else f"{where}: {RUN_FILE} is not a file"
        if any(p.name != LOCK_FILE for p in run_dir.iterdir()):
            return (
                f"{where}: holds files but no {RUN_FILE}, so `ab run` did not write it; "
                "give a new or empty directory, or one of an earlier run"
            )
        return None
    parent = run_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{where}: cannot be created, {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{where}: cannot be created, {parent} is not writable"
    return None


def gsm8k_data_problem(path: str, num_shots: int) -> str | None:
    """Why SGLang's GSM8K eval could not use the file at `path` (None: it can)."""
    where = f"[gsm8k] data_path {path!r}"
    try:
        text = Path(path).expanduser().read_bytes().decode("utf-8")
    except OSError as e:
        return f"{where}: cannot read ({e.strerror})"
    except UnicodeDecodeError as e:
        return f"{where}: not UTF-8 text (byte at offset {e.start})"
    questions = 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            continue  # as read_jsonl does
        if not line.strip():
            return f"{where}: line {number} is empty; the eval reads every line as JSON"
        try:
            item = json.loads(line)
        except ValueError as e:
            return f"{where}: line {number} is not JSON ({e.msg}); the eval reads JSON lines"
        missing = [
            key
            for key in ("question", "answer")
            if not isinstance(item, dict) or not isinstance(item.get(key), str)
        ]
        if missing:
            return f"{where}: line {number} has no {missing[0]!r} text; each line needs both"
        questions += 1
    if questions <= num_shots:
        return (
            f"{where}: {questions} questions; num_shots = {num_shots} takes that many as "
            "examples and needs at least one more to ask"
        )
    return None


def sharegpt_problem(path: str, dataset: str, prompts: int) -> str | None:
    """Why bench_serving's dataset `dataset` could not draw `prompts` prompts from the ShareGPT
    file at `path` (None: it can).

    What SGLang 0.5.23's loaders need, read from sglang.benchmark.datasets.random's
    sample_random_requests and sglang.benchmark.datasets.sharegpt's sample_sharegpt_requests
    (with sglang.benchmark.utils.is_file_valid_json): the whole file must load as JSON, else
    `random` downloads ShareGPT in its place (a failure offline, other prompts online) and
    `sharegpt` fails; it is a list of objects, of which those whose `conversations` (else
    `conversation`) holds two turns or more are used, each such turn an object with a `value`
    text; a cell draws at most one prompt per usable conversation (an empty first turn is
    skipped), so fewer of them than its prompts sends fewer requests than the cell counts.
    """
    where = f"[sweep] dataset_path {path!r}"
    try:
        text = Path(path).expanduser().read_bytes().decode("utf-8")
        data = json.loads(text)
    except OSError as e:
        return f"{where}: cannot read ({e.strerror})"
    except UnicodeDecodeError as e:
        return f"{where}: not UTF-8 text (byte at offset {e.start})"
    except (ValueError, RecursionError) as e:
        fallback = "download ShareGPT in its place" if dataset == "random" else "fail on it"
        why = str(e) if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        return (
            f"{where}: does not parse as JSON ({why}; truncated?); bench_serving's dataset "
            f"{dataset!r} would {fallback}"
        )
    if not isinstance(data, list):
        return f"{where}: a JSON {type(data).__name__}; ShareGPT is a list of conversations"
    usable = 0
    for index, entry in enumerate(data):
        turns = _sharegpt_turns(entry)
        if turns is None:
            return (
                f"{where}: entry {index} is no conversation (an object whose 'conversations' "
                "list has turns with a 'value' text); bench_serving would fail on it"
            )
        usable += bool(turns and turns[0])
    if usable < prompts:
        return (
            f"{where}: {usable} conversations of two turns or more to prompt from; a cell "
            f"sends up to {prompts} prompts, one per conversation"
        )
    return None


def _sharegpt_turns(entry: object) -> list[str] | None:
    """The texts of the first two turns of a ShareGPT entry; [] when it has fewer turns (the
    loader skips it); None when the loader would fail on it."""
    if not isinstance(entry, dict):
        return None
    turns = entry.get("conversations", entry.get("conversation", []))
    if not isinstance(turns, list):
        return None
    if len(turns) < 2:
        return []
    texts = [turn.get("value") if isinstance(turn, dict) else None for turn in turns[:2]]
    return texts if all(isinstance(t, str) for t in texts) else None


def offline_problems(config: Config, *, accuracy_only: bool = False) -> list[str]:
    """With `offline`, one line per fetch the run would make."""
    if not config.run.offline:
        return []
    return [
        f"offline run (--offline, [run] offline) needs network: {f.what}; set {f.avoid}"
        for f in fetches(config, accuracy_only=accuracy_only)
    ]


def config_path_problems(
    config: Config, *, accuracy_only: bool = False, dry_run: bool = False
) -> list[str]:
    problems = []
    sw, g, s = config.sweep, config.gsm8k, config.server
    if not accuracy_only and sw.dataset_path:
        if not Path(sw.dataset_path).expanduser().exists():
            problems.append(f"[sweep] dataset_path {sw.dataset_path!r}: no such file")
        elif sw.dataset in SHAREGPT_DATASETS:
            prompts = max(sw.prompts(point) for point in sw.points())
            if problem := sharegpt_problem(sw.dataset_path, sw.dataset, prompts):
                problems.append(problem)
    if g.enabled and g.data_path:
        if not Path(g.data_path).expanduser().is_file():
            problems.append(f"[gsm8k] data_path {g.data_path!r}: no such file")
        elif problem := gsm8k_data_problem(g.data_path, g.num_shots):
            problems.append(problem)
    launched = [a for a in config.arms if a.url is None]
    if not launched:
        return problems
    model = s.model_path
    if model and not s.command and local_path(model):
        path = Path(model).expanduser()
        # --dry-run previews without the model here: arm_plans warns that it cannot resolve
        if not path.is_dir() and not (dry_run and not path.exists()):
            problems.append(
                f"[server] model_path {model!r}: no such directory (a Hugging Face id, "
                "org/name, is not checked)"
            )
    unprefixed = [a for a in launched if not launch_prefix(config, a)]
    if unprefixed:
        command = launch_command(s, prefixed=False)
        if command:
            key = "command" if s.command else "launch_python"
            env = {**s.env, **unprefixed[0].env}
            problem = executable_problem(command[0], env)
            if problem:
                problems.append(f"[server] {key}: {problem}")
    return problems
