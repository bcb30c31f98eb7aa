"""Install patches the way the plugin does (our registry + SGLang's ``HookRegistry``), and take
them out again: the tests' and the benchmarks' one way to run a patch.

``installed(patches, env)`` sets the environment, runs ``registry.install`` +
``HookRegistry.apply_hooks`` and, on exit, restores every binding the hooks replaced: the
class attributes, the defining module's function and the ``from X import f`` copies that
``HookRegistry`` propagates into other modules. Tests see upstream untouched afterwards.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable


def _bindings(targets: Iterable[str]) -> list[tuple[object, str, object]]:
    from sglang_mixgraph.registry import resolve_target

    saved = []
    for target in targets:
        owner, attr, raw = resolve_target(target)
        saved.append((owner, attr, raw))
        if isinstance(owner, type):
            continue
        for mod in list(sys.modules.values()):
            if mod is owner or mod is None:
                continue
            try:
                items = list(vars(mod).items())
            except TypeError:
                continue
            saved += [(mod, name, value) for name, value in items if value is raw]
    return saved


@contextlib.contextmanager
def installed(patches, env: dict[str, str | None]):
    """Install ``patches`` with ``env`` set (None: unset); yields the install statuses."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mixgraph.registry import install

    old_env = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    saved = _bindings({h.target for p in patches for h in p.hooks})
    old_hooks = {k: list(v) for k, v in HookRegistry._hooks.items()}
    old_patched = set(HookRegistry._patched)
    try:
        statuses = install(tuple(patches))
        HookRegistry.apply_hooks()
        yield statuses
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
