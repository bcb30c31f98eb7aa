"""Environment checks of the arms before anything is launched.

An arm is mostly a set of environment variables, and a misspelt SGLang flag does nothing at
all: the server starts, the A/B measures two identical servers and reports noise as a
result. So every name that looks like an SGLang flag (prefix `SGLANG_` or `SGL_`) must be a
field of SGLang's flag registry (`sglang.srt.environ.Envs`), one of this plugin's flags
(registered in the same registry by `sglang_mixgraph.flags` when the patches are imported), or
listed in `[server] allow_env` for a variable SGLang reads outside its registry. Values are
checked the way SGLang and the plugin would parse them (`plan_inputs.invalid_environment`).
Other names (CUDA_*, NCCL_*, ...) pass unchecked: they are not ours to know.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterator

from sglang_mixgraph.ab.config import Config

FLAG_PREFIXES = ("SGLANG_", "SGL_")


def known_flag_names() -> set[str]:
    from sglang.srt.environ import EnvField, Envs

    from sglang_mixgraph import counters  # noqa: F401  (registers its flag)
    from sglang_mixgraph.patches import all_patches

    all_patches()  # each patch module registers its flags in Envs when imported
    return {name for name, value in vars(Envs).items() if isinstance(value, EnvField)}


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def env_problems(config: Config) -> list[str]:
    """One line per unknown flag name or invalid value, across the shared env and every arm."""
    from sglang_mixgraph.resolution.plan_inputs import invalid_environment, quiet_import_warnings

    with quiet_import_warnings():
        known = known_flag_names() | set(config.server.allow_env)
    problems = []
    scopes = [("[server] env", config.server.env)] + [
        (f"arm {arm.name!r}", arm.env) for arm in config.arms if arm.url is None
    ]
    for where, env in scopes:
        for name in env:
            if name.startswith(FLAG_PREFIXES) and name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
                hint = f"; did you mean {close[0]}?" if close else ""
                problems.append(
                    f"{where}: {name} is neither an SGLang flag (sglang.srt.environ) nor an "
                    f"sglang-mixgraph flag{hint} (a variable SGLang reads elsewhere: add it "
                    "to [server] allow_env)"
                )
        with _environment(env):
            for line in invalid_environment():
                if line.split("=", 1)[0] in env:
                    problems.append(f"{where}: {line}")
    return problems


def attached_env_note(config: Config) -> list[str]:
    """An attached server was started by someone else: its arm's env is a label, not applied."""
    return [
        f"arm {arm.name!r} is attached ({arm.url}); its env is not applied, only recorded"
        for arm in config.arms
        if arm.url is not None and arm.env
    ]
