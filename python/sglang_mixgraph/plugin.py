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

logger = logging.getLogger("sglang_mixgraph")


def register() -> None:
    from sglang_mixgraph import counters
    from sglang_mixgraph.flags import FlagValueError
    from sglang_mixgraph.patches import all_patches
    from sglang_mixgraph.registry import PatchCheckError, install

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
        install(all_patches())
    except (PatchCheckError, FlagValueError) as e:
        logger.error("sglang-mixgraph: %s", e)
        raise SystemExit(f"sglang-mixgraph: startup stopped.\n{e}") from None
