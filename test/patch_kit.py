"""Install one patch in this process the way the plugin does, and take it out again.

``registry.install`` + SGLang's ``HookRegistry.apply_hooks`` with the given flag values; on exit
every class or module attribute the patch's hooks replaced is restored, with the registry and
the environment.
"""

from __future__ import annotations

import contextlib
import os

from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_mixgraph.registry import _resolve, install


@contextlib.contextmanager
def installed(patch, env: dict[str, str]):
    old_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    saved = []
    for hook in patch.hooks:
        owner, attr, raw = _resolve(hook.target)
        saved.append((owner, attr, raw))
    old_hooks = {k: list(v) for k, v in HookRegistry._hooks.items()}
    old_patched = set(HookRegistry._patched)
    try:
        statuses = install((patch,))
        HookRegistry.apply_hooks()
        yield statuses[0]
    finally:
        for owner, attr, raw in saved:
            setattr(owner, attr, raw)
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(old_hooks)
        HookRegistry._patched.clear()
        HookRegistry._patched.update(old_patched)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
