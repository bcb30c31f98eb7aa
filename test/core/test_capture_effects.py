"""core.capture_effects: the effects a patch declares on capture memory, in a module of their
own so that declaring one does not import the capture-memory estimate."""

from __future__ import annotations

import ast
from pathlib import Path

import sglang_mixgraph
from sglang_mixgraph.core import capture_effects, capture_memory
from sglang_mixgraph.core.capture_effects import CaptureEffect

PACKAGE = Path(sglang_mixgraph.__file__).parent


def _imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_the_estimate_counts_the_same_effects_the_patches_declare():
    assert capture_memory.CaptureEffect is CaptureEffect
    assert {e.value for e in CaptureEffect} == {"indexer_logits_eager", "decode_tail_graphs"}


def test_the_declaring_patches_read_the_effects_without_the_estimate():
    """The patches that declare an effect import this module, not `core.capture_memory`."""
    declaring = [PACKAGE / "patches" / "live_width_indexer.py"]
    declaring.append(PACKAGE / "patches" / "mixed_split" / "__init__.py")
    for path in declaring:
        imported = _imported(path)
        assert capture_effects.__name__ in imported, path
        assert capture_memory.__name__ not in imported, path
