"""The tools' scripts as modules for their tests: loaded by file under their own name, so the
scripts that import each other by name (`import slice_arms`) find one another, and dataclasses
find their module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load(name: str, folder: str = "rank-slice"):
    """tools/<folder>/<name>.py, executed afresh and registered under `name`."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
