"""SGLang general-plugin entry point (`sglang.srt.plugins` group, name `mixgraph`).

`sglang.srt.plugins.load_plugins()` calls `register()` in every SGLang process
(main, schedulers, DP controller, detokenizer) and then applies the hooks.
It logs and swallows ordinary exceptions from a plugin (`load_plugins` itself),
so a patch that cannot apply raises `SystemExit` here: startup must stop. Nothing else may
escape `register()`: an exception would be swallowed there and leave the server unpatched
without a word. A flag name that upstream's envs already defines is therefore not an error:
the patch owning it defers to upstream and says so (registry.evaluate), the rest loads.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("sglang_mixgraph")

# Which patches are active, said once per process where the server log shows it. SGLang loads
# plugins before it configures logging (launch_server: load_plugins, then prepare_server_args'
# basicConfig; scheduler, detokenizer, DP controller: load_plugins, then configure_logger), so
# a line logged in register() reaches no handler. The line is logged by an AFTER hook on the
# two functions that configure SGLang's root logger, the first time either returns in this
# process, or at once when the root logger already has a handler (a host that configured
# logging before loading plugins). The hooks only log; they change no argument or result.
# With no patch enabled nothing is hooked, so upstream stays untouched: the line is then logged
# only where a handler already exists (`doctor` always shows the states).
LOGGING_SETUP_TARGETS = (
    "sglang.srt.server_args.prepare_server_args",
    "sglang.srt.utils.common.configure_logger",
)
_announcement: str | None = None
_announced_pid: int | None = None
_hooks_registered = False


def announce() -> bool:
    """Log the active-patches line unless this process already did; True when it logged."""
    global _announced_pid
    if _announcement is None or _announced_pid == os.getpid():
        return False
    if not logger.isEnabledFor(logging.INFO):  # a later setup at INFO may still show it
        return False
    _announced_pid = os.getpid()
    logger.info("%s", _announcement)
    return True


def _after_logging_setup(result, *args, **kwargs) -> None:
    announce()
    return None  # AFTER hook: the result stays upstream's


def _announce_after_logging_setup(line: str, *, any_enabled: bool) -> None:
    global _announcement, _hooks_registered
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _announcement = line
    if any_enabled and not _hooks_registered:
        _hooks_registered = True
        for target in LOGGING_SETUP_TARGETS:
            HookRegistry.register(target, _after_logging_setup, HookType.AFTER)
    if logging.getLogger().handlers:
        announce()


def register() -> None:
    from sglang_mixgraph import counters
    from sglang_mixgraph.flags import FlagValueError
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import PatchCheckError, announcement, install

    try:
        counters.INTERVAL_FLAG.get()  # strict: a bad value stops startup like a patch flag
        if counters.INTERVAL_FLAG.deferred:
            logger.warning(
                "sglang-mixgraph: sglang defines %s itself, so SGLang reads it; the activity "
                "counters log every %s s (their default). Set %s as SGLang documents it.",
                counters.INTERVAL_FLAG.name,
                counters.INTERVAL_FLAG.default,
                counters.INTERVAL_FLAG.name,
            )
        statuses = install(all_patches())
    except (PatchCheckError, FlagValueError) as e:
        logger.error("sglang-mixgraph: %s", e)
        raise SystemExit(f"sglang-mixgraph: startup stopped.\n{e}") from None
    _announce_after_logging_setup(
        announcement(statuses), any_enabled=any(s.enabled for s in statuses)
    )
