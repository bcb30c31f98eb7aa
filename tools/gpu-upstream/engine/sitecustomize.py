"""Start-up of every Python process of an end-to-end ``sglang.Engine`` run on the GPU machine.

Put this folder first on ``PYTHONPATH`` (test/gpu_e2e/run_e2e.py does, for its phase
processes; SGLang's scheduler and detokenizer processes inherit it). Python then loads this
``sitecustomize`` instead of the shim's, so this one:

1. runs the shim's ``sitecustomize.py`` (tools/gpu-upstream/shim: the stub finder, CUTLASS headers);
2. installs the Engine-only stand-ins of ``engine_standins.py`` and makes stub calls loud;
3. imports each module named in ``MIXGRAPH_E2E_STARTUP`` (comma-separated, from ``PYTHONPATH``)
   and calls its ``install()`` (the harness's step log).

The folder also holds ``sglang_kernel-0.4.10.dist-info`` (metadata only): SGLang's start-up
checks the installed ``sglang_kernel`` version before it starts an Engine.
``MIXGRAPH_NO_STUBS=1`` skips all of it, as it skips the shim.
"""

import importlib
import os
import runpy

if os.environ.get("MIXGRAPH_NO_STUBS") != "1":
    _here = os.path.dirname(os.path.abspath(__file__))
    runpy.run_path(
        os.path.join(_here, "..", "shim", "sitecustomize.py"), run_name="gpu_upstream_shim"
    )

    import engine_standins

    engine_standins.install()
    for _name in filter(None, os.environ.get("MIXGRAPH_E2E_STARTUP", "").split(",")):
        _module = importlib.import_module(_name.strip())
        if hasattr(_module, "install"):
            _module.install()
