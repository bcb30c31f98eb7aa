"""advise names the patches' flags through their `Flag` objects, never by a literal of its own:
no string in advise's code (docstrings aside) spells an SGLang environment variable, and the
check sees one added to a real module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sglang_mixgraph

PACKAGE = Path(sglang_mixgraph.__file__).parent
ADVISE = sorted((PACKAGE / "advise").glob("*.py")) + [PACKAGE / "cli" / "advise.py"]


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and its functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def flag_literals(source: str) -> list[str]:
    """Every string constant (an f-string's parts too) naming an `SGLANG_` variable, but
    docstrings."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "SGLANG_" in node.value
        and id(node) not in skip
    ]


def test_advise_spells_no_flag_name():
    assert {p.name: flag_literals(p.read_text()) for p in ADVISE} == {p.name: [] for p in ADVISE}
    # the check sees a name written out, plain or in an f-string, and leaves docstrings alone
    verdicts = (PACKAGE / "advise" / "verdicts.py").read_text()
    assert "SGLANG_" in ast.get_docstring(ast.parse(verdicts))
    for line in ('FLAG = "SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1"', 'f"SGLANG_OPT_X={1}"'):
        assert flag_literals(verdicts + f"\n{line}\n"), line


def test_a_setting_is_named_by_its_flag_and_checked_against_it():
    from sglang_mixgraph.advise.verdicts import _setting
    from sglang_mixgraph.patches.graph_config import PREFILL_BUCKETS

    assert _setting(PREFILL_BUCKETS, "auto") == f"{PREFILL_BUCKETS.name}=auto"
    with pytest.raises(ValueError):
        _setting(PREFILL_BUCKETS, "sometimes")
