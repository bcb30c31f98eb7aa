"""A module whose import raises, in a fresh process: a kernel library that will not load.

``broken_import_env(directory, module, error)`` writes a ``sitecustomize.py`` into
``directory`` and returns the environment that makes a fresh Python process run it: a
meta-path finder placed first answers for ``module`` with a loader whose module body raises
``error`` (as ``ctypes.CDLL`` raises OSError for a shared library it cannot open). Nothing else
is touched, so the rest of SGLang imports as installed. Used by the tests that load the plugin
through SGLang's loader and run ``doctor`` with such a module.
"""

from __future__ import annotations

import os
from pathlib import Path

_SITECUSTOMIZE = """\
import importlib.abc, importlib.util, sys

class _RaisingLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise {error}

class _BrokenFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != {module!r}:
            return None
        return importlib.util.spec_from_loader(name, _RaisingLoader())

sys.meta_path.insert(0, _BrokenFinder())
"""


def broken_import_env(directory: Path, module: str, error: str) -> dict[str, str]:
    """The environment under which importing `module` raises `error` (a Python expression such
    as ``OSError('libx.so: cannot open shared object file')``) in a fresh process."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(error=error, module=module))
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(directory)] + ([path] if path else []))}
