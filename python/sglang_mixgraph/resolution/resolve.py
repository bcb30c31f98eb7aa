"""Resolve SGLang server arguments as `python -m sglang.launch_server` would, without starting anything.

Same parser and resolution pipeline: `prepare_server_args` then `ServerArgs.resolve_once()`
(sglang.launch_server, sglang.srt.server_args), after `load_plugins()` as every SGLang
process does, and with the target GPU described to SGLang by `target_gpu.described_gpu`.
The caller's process must have selected the described GPU before anything imports
`sglang.srt` (`select_described_platform()`), which `plan` and the tests' conftest do.

Here: the described platform, `plugin_load_status` (whether SGLang would load this plugin at
all, `SGLANG_PLUGINS`), `resolve` itself and `model_class_problem` (a model architecture
SGLang has no model class for), and `graph_plan_of` (the planner's report of a resolution).
What `plan` checks before resolving lives in `plan_inputs`, a failed resolution in words in
`errors`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_mixgraph import target_gpu
from sglang_mixgraph.core.capture_memory import CaptureEffect
from sglang_mixgraph.resolution.plan_inputs import quiet_import_warnings
from sglang_mixgraph.target_gpu import DEFAULT_GPU, PLATFORM_PLUGIN_NAME, GpuSpec

# The entry point SGLang's plugin loader finds us by (pyproject.toml).
PLUGIN_NAME = "mixgraph"
PLUGIN_GROUP = "sglang.srt.plugins"

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


# ---------------------------------------------------------------- resolution


@dataclass
class Resolution:
    gpu: GpuSpec
    server_args: Any  # sglang.srt.server_args.ServerArgs, resolved
    resolved: dict[str, Any]
    logs: list[logging.LogRecord] = field(default_factory=list)
    plugin: PluginLoad = field(default_factory=lambda: PluginLoad(True, "SGLang loads the plugin"))
    # What the plugin's patches declare they change in capture memory in this process (none
    # when SGLang does not load the plugin); the planner's facts take it.
    capture_effects: frozenset[CaptureEffect] = frozenset()

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
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.planner.deployment_facts import capture_effects_of

    return Resolution(
        gpu=spec,
        server_args=server_args,
        resolved=resolved,
        logs=collector.records,
        plugin=plugin,
        capture_effects=capture_effects_of(all_patches()) if plugin.loaded else frozenset(),
    )


def graph_plan_of(resolution: Resolution):
    """The planner's report (`graph_plan.GraphPlan`) of a finished resolution: its facts read
    once, for the GPU it was resolved for."""
    from sglang_mixgraph.bcg_rules import recorded
    from sglang_mixgraph.planner.deployment_facts import read_deployment
    from sglang_mixgraph.planner.graph_plan import graph_plan
    from sglang_mixgraph.planner.memory_fit import memory_fit
    from sglang_mixgraph.resolution.memory_inputs import read_memory_inputs
    from sglang_mixgraph.target_gpu import described_gpu

    with described_gpu(resolution.gpu.name):
        facts = read_deployment(resolution.server_args, capture_effects=resolution.capture_effects)
        inputs = read_memory_inputs(resolution.server_args)
        return graph_plan(
            facts,
            recorded(resolution.server_args),
            resolution.gpu,
            plugin_loaded=resolution.plugin.loaded,
            memory=memory_fit(inputs, resolution.gpu.memory_bytes, facts),
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
