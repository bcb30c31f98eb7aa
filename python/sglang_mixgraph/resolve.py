"""Resolve SGLang server arguments as `python -m sglang.launch_server` would, without starting anything.

Same parser and resolution pipeline: `prepare_server_args` then `ServerArgs.resolve_once()`
(sglang.launch_server, sglang.srt.server_args), after `load_plugins()` as every SGLang
process does, and with the target GPU described to SGLang by `target_gpu.described_gpu`.
The caller's process must have selected the described GPU before anything imports
`sglang.srt` (`select_described_platform()`), which `plan` and the tests' conftest do.

Everything `plan` checks before and around that lives here too, so that a user's mistake
gives one line naming it instead of a traceback, a usage screen or a silent default:

- `prepare_argv`: parses the server arguments with SGLang's own argument definitions first
  (unknown option, bad value), applies them on top of a reference deployment when no
  `--model-path` is given, refuses sizes that would make SGLang build enormous CUDA-graph
  size lists (`MAX_PLAN_SIZE`, `MAX_PLAN_LIST`), a `--model-path` that does not exist, a
  config.json that is not a JSON object and a DeepSeek-V4 `compress_ratios` whose length
  matches no layer count (`_check_config_json`);
- `invalid_environment`: SGLang variables whose value SGLang would ignore with a warning;
- `plugin_load_status`: whether SGLang would load this plugin at all (`SGLANG_PLUGINS`);
- `model_class_problem`: a model architecture SGLang has no model class for;
- `explain_failure`: a resolution error in words (failed asserts show their condition).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import errno
import linecache
import logging
import os
import re
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_mixgraph import target_gpu
from sglang_mixgraph.target_gpu import DEFAULT_GPU, PLATFORM_PLUGIN_NAME, GpuSpec

# The entry point SGLang's plugin loader finds us by (pyproject.toml).
PLUGIN_NAME = "mixgraph"
PLUGIN_GROUP = "sglang.srt.plugins"

# Ceilings on what `plan` accepts. SGLang builds a prefill CUDA-graph size list with one entry
# per 512 tokens up to the chunked prefill size or --cuda-graph-max-bs-prefill
# (sglang.srt.arg_groups.cuda_graph_hook `generate_prefill_cuda_graph_batch_sizes`), and a
# decode list up to --cuda-graph-max-bs-decode (one entry per size with
# --disable-cuda-graph-padding); 10^11 tokens is a list of 195 million entries. No deployment
# captures graphs anywhere near these sizes.
MAX_PLAN_SIZE = 1 << 21  # 2,097,152 tokens (or requests) per size
MAX_PLAN_LIST = 8192  # entries in an explicit size list
_SIZE_DESTS = ("chunked_prefill_size", "cuda_graph_max_bs_prefill", "cuda_graph_max_bs_decode")
_LIST_DESTS = ("cuda_graph_bs_prefill", "cuda_graph_bs_decode")


class PlanInputError(ValueError):
    """An input `plan` cannot plan (server arguments, environment, files); the message is one line."""

    exit_code = 1


class ServerArgumentError(PlanInputError):
    """SGLang's argument parser rejects the server arguments (argparse's exit code)."""

    exit_code = 2


# ---------------------------------------------------------------- the described GPU

_user_platform_env: str | None = None
_platform_selected = False


def select_described_platform(gpu: str = DEFAULT_GPU) -> None:
    """Describe `gpu` to SGLang in this process. Call before anything imports `sglang.srt`.

    SGLang picks its platform once per process (sglang.srt.platforms `_resolve_platform`),
    by SGLANG_PLATFORM when set. The GPU itself is held in this process only
    (`target_gpu.select`); SGLANG_PLATFORM alone describes nothing in another process.
    """
    global _user_platform_env, _platform_selected
    target_gpu.select(gpu)
    if not _platform_selected:
        _user_platform_env = os.environ.get("SGLANG_PLATFORM")
        _platform_selected = True
    os.environ["SGLANG_PLATFORM"] = PLATFORM_PLUGIN_NAME


@contextlib.contextmanager
def _users_platform_variable() -> Iterator[None]:
    """SGLANG_PLATFORM as the user set it, for SGLang's plugin loader.

    `load_plugins` skips the general plugins of packages that ship a platform plugin other
    than the one SGLANG_PLATFORM selects (sglang.srt.plugins `_get_excluded_dists`); with the
    user's value it decides exactly as in the user's own launch.
    """
    if not _platform_selected:
        yield
        return
    ours = os.environ.get("SGLANG_PLATFORM")
    if _user_platform_env is None:
        os.environ.pop("SGLANG_PLATFORM", None)
    else:
        os.environ["SGLANG_PLATFORM"] = _user_platform_env
    try:
        yield
    finally:
        if ours is None:
            os.environ.pop("SGLANG_PLATFORM", None)
        else:
            os.environ["SGLANG_PLATFORM"] = ours


@contextlib.contextmanager
def quiet_import_warnings() -> Iterator[None]:
    """Hide what SGLang's layer and kernel modules warn at import about the machine we run on.

    On a machine without a GPU they warn that a quantization method or Triton is not supported
    (for example sglang.srt.layers.quantization.awq at import) or that the CUDA architecture is
    unknown (sglang.kernels.jit.utils.arch); that is about this machine, not the described GPU.
    """
    kernels = logging.getLogger("sglang.kernels")  # "Cannot detect CUDA architecture." at import
    level = kernels.level
    kernels.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", category=UserWarning, module=r"sglang\.(srt\.layers|kernels|jit_kernel)\."
            )
            yield
    finally:
        kernels.setLevel(level)


# ---------------------------------------------------------------- does SGLang load the plugin?


@dataclass(frozen=True)
class PluginLoad:
    loaded: bool
    reason: str  # one line: why SGLang loads or skips this plugin


def plugin_load_status() -> PluginLoad:
    """Whether SGLang's `load_plugins` would run this plugin, in the current environment.

    The same three decisions as sglang.srt.plugins `load_plugins_by_group`: the entry point
    must be installed, named by the SGLANG_PLUGINS allowlist when that is set, and not come
    from a package excluded by SGLANG_PLATFORM (`_get_excluded_dists`).
    """
    from importlib.metadata import entry_points

    from sglang.srt.environ import envs
    from sglang.srt.plugins import _get_excluded_dists

    ours = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if not ours:
        return PluginLoad(
            False,
            f"the entry point {PLUGIN_NAME!r} (group {PLUGIN_GROUP}) is not installed; "
            "install the package (pip install -e .) so that SGLang finds the plugin",
        )
    allowlist = envs.SGLANG_PLUGINS.get()
    if allowlist:
        names = {x.strip() for x in allowlist.split(",") if x.strip()}
        if PLUGIN_NAME not in names:
            return PluginLoad(
                False,
                f"excluded by the allowlist SGLANG_PLUGINS={allowlist!r}, which does not name "
                f"{PLUGIN_NAME!r}: SGLang does not load the plugin",
            )
    dist = ours[0].dist.name if ours[0].dist else None
    if dist is not None and dist in _get_excluded_dists():
        return PluginLoad(
            False,
            f"excluded by SGLANG_PLATFORM={os.environ.get('SGLANG_PLATFORM')!r}: SGLang skips the "
            f"general plugins of every package that ships an unselected platform plugin, and "
            f"{dist} ships {PLATFORM_PLUGIN_NAME!r} (used only by plan)",
        )
    return PluginLoad(
        True, "SGLang loads the plugin" + (f" (SGLANG_PLUGINS={allowlist!r})" if allowlist else "")
    )


_plugin_load: PluginLoad | None = None


def load_plugins() -> PluginLoad:
    """SGLang's `load_plugins()`, as the user's launch would run it; says whether we were loaded."""
    global _plugin_load
    from sglang.srt import plugins

    with _users_platform_variable():
        if _plugin_load is None:
            _plugin_load = plugin_load_status()
        plugins.load_plugins()
    return _plugin_load


# ---------------------------------------------------------------- server arguments


class _RaisingParser(argparse.ArgumentParser):
    """SGLang's argument parser, raising instead of printing its usage screen and exiting."""

    def error(self, message: str):
        raise ServerArgumentError(" ".join(message.split()))


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = _RaisingParser(prog="sglang serve")  # as sglang.srt.server_args prepare_server_args
    ServerArgs.add_cli_args(parser)
    for action in parser._actions:
        if action.dest == "model_path":
            action.required = False  # decided below: ours to supply or to demand
    return parser


def _option(parser: argparse.ArgumentParser, dest: str) -> str:
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return "--" + dest.replace("_", "-")


@dataclass
class ServerArgv:
    argv: list[str]  # what SGLang's parser gets
    on_reference: bool  # the user's arguments were applied on top of the reference deployment
    user_argv: list[str]


def prepare_argv(user_argv: list[str], reference_argv: list[str] | None = None) -> ServerArgv:
    """Check the server arguments before SGLang resolves them; raise PlanInputError.

    Without `--model-path` (and a reference given), the arguments are appended to
    `reference_argv`: argparse keeps the last value of an option, so each one given replaces
    the reference's value.
    """
    with quiet_import_warnings():
        parser = _sglang_parser()
    argv = list(user_argv)
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        try:
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        except Exception as e:  # a missing file, bad YAML: the user's input, said in one line
            raise PlanInputError(f"--config: {' '.join(str(e).split())}") from None
    ns = parser.parse_args(argv)
    on_reference = False
    if ns.model_path is None:
        if reference_argv is None:
            raise ServerArgumentError("the following arguments are required: --model-path/--model")
        argv = list(reference_argv) + argv
        ns = parser.parse_args(argv)
        on_reference = True
    _check_sizes(parser, ns)
    _check_model_path(ns.model_path)
    return ServerArgv(argv=argv, on_reference=on_reference, user_argv=list(user_argv))


def _check_sizes(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    def too_large(what: str, value: int) -> PlanInputError:
        return PlanInputError(
            f"{what} {value} is larger than plan accepts (at most {MAX_PLAN_SIZE}): SGLang builds "
            f"a CUDA-graph size list up to it"
        )

    for dest in _SIZE_DESTS:
        value = getattr(ns, dest, None)
        if isinstance(value, int) and value > MAX_PLAN_SIZE:
            raise too_large(_option(parser, dest), value)
    lists = {_option(parser, d): getattr(ns, d, None) for d in _LIST_DESTS}
    for phase, settings in (getattr(ns, "cuda_graph_config", None) or {}).items():
        if isinstance(settings, dict):
            if isinstance(settings.get("max_bs"), int) and settings["max_bs"] > MAX_PLAN_SIZE:
                raise too_large(f"--cuda-graph-config {phase} max_bs", settings["max_bs"])
            lists[f"--cuda-graph-config {phase} bs"] = settings.get("bs")
    for what, values in lists.items():
        if not isinstance(values, (list, tuple)):
            continue
        if len(values) > MAX_PLAN_LIST:
            raise PlanInputError(
                f"{what} lists {len(values)} sizes; plan accepts at most {MAX_PLAN_LIST}"
            )
        big = [v for v in values if isinstance(v, int) and v > MAX_PLAN_SIZE]
        if big:
            raise too_large(what, max(big))


# SGLang's DeepSeek-V4 architectures (sglang.srt.configs.model_config `is_deepseek_v4`) and
# the compress ratios its layers accept (models.deepseek_v4 attention `__init__`,
# mem_cache.deepseek_v4_memory_pool `collect_sources_by_ratio`).
_DSV4_ARCHS = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")
_DSV4_RATIOS = (0, 1, 2, 4, 128)


def _check_config_json(config: Path) -> None:
    """The model's config.json is a JSON object, and a DeepSeek-V4 one is self-consistent.

    Not an object: SGLang's config loading calls `.get` on it and fails with an
    AttributeError deep inside (sglang.srt.utils.hf_transformers.config).

    DeepSeek-V4 `compress_ratios` (one entry per layer, then one per MTP layer): SGLang never
    checks its length. Shorter than `num_hidden_layers`, every layer past the list has no ratio
    (transformers' config validation or the layer's `config.compress_ratios[layer_id]` fails).
    Longer than `num_hidden_layers + num_nextn_predict_layers`, SGLang builds its layers from
    the first `num_hidden_layers` entries but counts every ratio-4 entry of the whole list as
    an indexer layer (`configs.model_config.get_num_indexer_layers`, which sizes the indexer
    top-k capturer), so the deployment would run with counts that match no model. Both are
    refused here in one line.
    """
    import json

    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PlanInputError(f"{config} is not valid JSON: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise PlanInputError(
            f"{config} holds a JSON {_json_kind(data)}, not an object: a model config.json is "
            '{"architectures": [...], ...}'
        )
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in _DSV4_ARCHS or "NextN" in str(arch):
        return
    layers, nextn = data.get("num_hidden_layers"), data.get("num_nextn_predict_layers", 0)
    ratios = data.get("compress_ratios")
    if not isinstance(layers, int) or not isinstance(nextn, int):
        return  # SGLang's config classes say what is wrong with these
    if not isinstance(ratios, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) for r in ratios
    ):
        raise PlanInputError(
            f"{config}: compress_ratios must be a list of integers, one per layer "
            f"(DeepSeek-V4), got {json.dumps(ratios)[:80]}"
        )
    bad = sorted({r for r in ratios[:layers] if r not in _DSV4_RATIOS})
    if bad:
        raise PlanInputError(
            f"{config}: compress_ratios holds {', '.join(map(str, bad))}; SGLang's DeepSeek-V4 "
            f"layers accept {', '.join(map(str, _DSV4_RATIOS))} and would fail building the model"
        )
    if len(ratios) < layers:
        raise PlanInputError(
            f"{config}: compress_ratios has {len(ratios)} entries for num_hidden_layers={layers}; "
            f"layers {len(ratios)}..{layers - 1} have no compress ratio and SGLang fails "
            "building the model"
        )
    if len(ratios) > layers + nextn:
        counted = sum(1 for r in ratios if r == 4)
        built = sum(1 for r in ratios[:layers] if r == 4)
        raise PlanInputError(
            f"{config}: compress_ratios has {len(ratios)} entries, more than num_hidden_layers="
            f"{layers} plus num_nextn_predict_layers={nextn}; SGLang would build {built} indexer "
            f"layers from the first {layers} but count {counted} (get_num_indexer_layers counts "
            "the whole list)"
        )


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?")


def _check_model_path(model_path: str) -> None:
    path = Path(os.path.expanduser(model_path))
    if path.exists():
        if path.is_dir() and not any((path / n).is_file() for n in ("config.json", "params.json")):
            if not any(path.glob("*.gguf")):
                raise PlanInputError(
                    f"--model-path {model_path} has no config.json (plan reads the model's config.json)"
                )
        if path.is_dir() and (path / "config.json").is_file():
            _check_config_json(path / "config.json")
        return
    looks_like_repo_id = (
        _REPO_ID.fullmatch(model_path) is not None
        and ".." not in model_path
        and "--" not in model_path
    )
    if not looks_like_repo_id:
        raise PlanInputError(
            f"--model-path {model_path} does not exist (give a local model directory with its "
            "config.json, or a Hugging Face repo id)"
        )


# ---------------------------------------------------------------- environment


def invalid_environment() -> list[str]:
    """One line per SGLang environment variable whose value SGLang would not accept.

    Upstream's `EnvField.get()` (sglang.srt.environ) warns and falls back to the default on a
    value its `parse` rejects, so a typo silently becomes the default. This plugin's flags are
    strict and say so themselves (flags.FlagValueError).
    """
    from sglang.srt.environ import EnvField, Envs

    from sglang_mixgraph.flags import FLAGS, FlagValueError
    from sglang_mixgraph.patches import all_patches

    all_patches()  # every patch's flags are registered in SGLang's envs
    problems = []
    for name, env_field in vars(Envs).items():
        if not isinstance(env_field, EnvField) or name not in os.environ:
            continue
        if name in FLAGS:
            try:
                FLAGS[name].get()
            except FlagValueError as e:
                problems.append(" ".join(str(e).split()))
            continue
        value = os.environ[name]
        try:
            env_field.parse(value)
        except NotImplementedError:
            continue
        except Exception as e:
            shown = "<hidden>" if getattr(env_field, "secret", False) else repr(value)
            default = env_field.default
            fallback = "" if callable(default) else f" {default!r}"
            problems.append(
                f"{name}={shown} is not a valid value ({' '.join(str(e).split())}); SGLang would "
                f"warn and use its default{fallback} instead"
            )
    return problems


# ---------------------------------------------------------------- resolution


@dataclass
class Resolution:
    gpu: GpuSpec
    server_args: Any  # sglang.srt.server_args.ServerArgs, resolved
    resolved: dict[str, Any]
    logs: list[logging.LogRecord] = field(default_factory=list)
    plugin: PluginLoad = field(default_factory=lambda: PluginLoad(True, "SGLang loads the plugin"))
    # A fact of this process the planner is told (graph_plan.Deployment.indexer_logits_eager):
    # the plugin is loaded and its live-width indexer acts in breakable captures.
    indexer_logits_eager: bool = False

    def messages(self, logger_prefix: str = "") -> list[str]:
        return [r.getMessage() for r in self.logs if r.name.startswith(logger_prefix)]


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def resolve(argv: list[str], gpu: str = DEFAULT_GPU) -> Resolution:
    """Parse and resolve `argv` (launch_server arguments) for a deployment on `gpu`.

    Errors are SGLang's own (argparse's SystemExit, ValueError, AssertionError, ...);
    `explain_failure` puts them in words.
    """
    from sglang_mixgraph.target_gpu import described_gpu

    with quiet_import_warnings():
        # The platform first (with our SGLANG_PLATFORM), then the plugins as the user's launch
        # loads them, then the resolution modules while the device probes still see this machine.
        from sglang.srt.platforms import current_platform  # noqa: F401  (resolves the platform)

        plugin = load_plugins()
        target_gpu.import_resolution_modules()
    collector = _Collector()
    # On SGLang's package logger and ours, not the root: resolution may reconfigure root
    # handlers. Our patches log to "sglang_mixgraph" while SGLang resolves.
    loggers = [logging.getLogger("sglang"), logging.getLogger("sglang_mixgraph")]
    previous_levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(collector)
        lg.setLevel(logging.INFO)
    try:
        with described_gpu(gpu) as spec:
            from sglang.srt.server_args import prepare_server_args

            server_args = prepare_server_args(list(argv))
            server_args.resolve_once()
            resolved = server_args.resolved_dict()
    finally:
        for lg, level in zip(loggers, previous_levels, strict=False):
            lg.removeHandler(collector)
            lg.setLevel(level)
    from sglang_mixgraph.patches import live_width_indexer

    return Resolution(
        gpu=spec,
        server_args=server_args,
        resolved=resolved,
        logs=collector.records,
        plugin=plugin,
        indexer_logits_eager=plugin.loaded and live_width_indexer.acts_in_captures(),
    )


# ---------------------------------------------------------------- model class


def sglang_model_architectures() -> set[str]:
    """The architectures SGLang has a model class for, read from its sources without importing them.

    sglang.srt.models.registry `import_model_classes` imports every module of
    `sglang.srt.models` (and SGLANG_EXTERNAL_MODEL_PACKAGE) and keys each `EntryClass` by its
    class name, skipping modules named in SGLANG_DISABLED_MODEL_ARCHS. Importing them all takes
    tens of seconds and fails for some modules on a machine without a GPU, so we read the
    `EntryClass = ...` statements instead.
    """
    import importlib.util

    from sglang.srt.environ import envs

    packages = ["sglang.srt.models"]
    external = envs.SGLANG_EXTERNAL_MODEL_PACKAGE.get()
    if external:
        packages.append(external)
    disabled = set(envs.SGLANG_DISABLED_MODEL_ARCHS.get())
    entry = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\([^)]*\)|[\w.]+)", re.M)
    names: set[str] = set()
    for package in packages:
        spec = importlib.util.find_spec(package)
        for directory in (spec.submodule_search_locations or []) if spec else []:
            for module in Path(directory).glob("*.py"):
                if module.stem in disabled:
                    continue
                for m in entry.finditer(module.read_text(encoding="utf-8", errors="replace")):
                    body = re.sub(r"#[^\n]*", "", m.group(1))
                    names.update(i.rsplit(".", 1)[-1] for i in re.findall(r"[A-Za-z_][\w.]*", body))
    return names


def model_class_problem(resolution: Resolution) -> tuple[str | None, str | None]:
    """(error, note) about the model class SGLang would load for this deployment.

    Follows sglang.srt.model_loader.utils `get_model_architecture`: an architecture of
    SGLang's own is used as is; otherwise SGLang falls back to its Transformers backend
    (`resolve_transformers_arch`), which raises when Transformers has no class either.
    """
    from sglang.srt.arg_groups.overrides import model_config_of

    model_config = model_config_of(resolution.server_args)
    archs = list(getattr(model_config.hf_config, "architectures", None) or [])
    impl = str(resolution.resolved.get("model_impl") or "auto").lower()
    if impl.endswith("mindspore"):
        return None, None
    if not archs:
        return (
            'the model\'s config.json names no architecture ("architectures"), so SGLang has no model class to load',
            None,
        )
    if "transformers" not in impl and any(a in sglang_model_architectures() for a in archs):
        return None, None
    with quiet_import_warnings():
        from sglang.srt.model_loader.utils import resolve_transformers_arch

    try:
        backend = resolve_transformers_arch(model_config, archs)
    except ValueError as e:
        return (
            f"SGLang has no model class for architecture {', '.join(archs)} and its Transformers "
            f"fallback has none either ({' '.join(str(e).split())}); launch_server would fail "
            "loading the model"
        ), None
    return (
        None,
        f"{', '.join(archs)} has no SGLang model class; SGLang would use its Transformers backend ({', '.join(backend)})",
    )


# ---------------------------------------------------------------- errors in words

_ENVIRONMENT_ERRNOS = {
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.ENOTDIR,
    errno.ENOSPC,
    errno.EDQUOT,
}


def environment_problem(exc: BaseException) -> str | None:
    """A file-system error of this machine (read-only HOME, full disk), in words; else None."""
    if not isinstance(exc, OSError) or exc.errno not in _ENVIRONMENT_ERRNOS or not exc.filename:
        return None
    path = os.path.abspath(str(exc.filename))
    text = f"cannot write {path}: {exc.strerror}"
    home = os.path.expanduser("~")
    cache = os.path.abspath(
        os.path.expanduser(os.environ.get("SGLANG_CACHE_DIR", "~/.cache/sglang"))
    )
    if path == home or path.startswith(home.rstrip(os.sep) + os.sep) or path.startswith(cache):
        text += (
            f". SGLang and torch keep their caches under SGLANG_CACHE_DIR (now {cache}); point "
            f"SGLANG_CACHE_DIR at a writable directory or make HOME ({home}) writable"
        )
    return text


def _last_frame(exc: BaseException) -> tuple[types.FrameType, int] | None:
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame, tb.tb_lineno


def _where(frame: types.FrameType) -> str:
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"


def _simple_value(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str)) and len(repr(value)) <= 60


def _names_in(expr: ast.AST) -> list[str]:
    """The dotted names (a, a.b.c) an expression reads, outermost first, without duplicates."""
    out: list[str] = []

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def visit(node: ast.AST) -> None:
        name = dotted(node)
        if name is not None:
            if name not in out:
                out.append(name)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(expr)
    return out


def _lookup(frame: types.FrameType, dotted: str) -> Any:
    head, *rest = dotted.split(".")
    if head in frame.f_locals:
        value = frame.f_locals[head]
    elif head in frame.f_globals:
        value = frame.f_globals[head]
    else:
        raise LookupError(head)
    for attr in rest:
        value = getattr(value, attr)
    return value


def _describe_assertion(exc: AssertionError) -> str:
    message = " ".join(str(exc).split())
    last = _last_frame(exc)
    if last is None:
        return f"an SGLang check failed: {message or 'AssertionError'}"
    frame, lineno = last
    condition, values = None, []
    try:
        filename = frame.f_code.co_filename
        tree = ast.parse("".join(linecache.getlines(filename)))
        node = next(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Assert) and n.lineno <= lineno <= (n.end_lineno or n.lineno)
        )
        condition = ast.unparse(node.test)
        for name in _names_in(node.test):
            try:
                value = _lookup(frame, name)
            except Exception:
                continue
            if _simple_value(value):
                values.append(f"{name}={value!r}")
    except (StopIteration, SyntaxError, ValueError, OSError):
        pass
    text = "SGLang requires " + (
        f"`{condition}`" if condition else "a condition that does not hold"
    )
    if values:
        text += f", which does not hold ({', '.join(values[:6])})"
    if message:
        text += f": {message}"
    return f"{text} [{_where(frame)}]"


def explain_failure(exc: BaseException) -> str:
    """One line saying why resolution failed."""
    env = environment_problem(exc)
    if env is not None:
        return env
    if isinstance(exc, AssertionError):
        return _describe_assertion(exc)
    detail = " ".join(str(exc).split()) or type(exc).__name__
    last = _last_frame(exc)
    where = f" [{_where(last[0])}]" if last is not None else ""
    return f"the server arguments do not resolve: {type(exc).__name__}: {detail}{where}"
