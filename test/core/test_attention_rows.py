"""core.attention_rows: the replayed attention break's row count, the one rule every patch
uses; it imports no SGLang."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import sglang_mixgraph
from sglang_mixgraph.core.attention_rows import batch_attention_rows, replay_attention_rows


@pytest.mark.parametrize(
    "non_padded, static_rows, rows",
    [(None, 16, 16), (13, 16, 13), (16, 16, 16), (0, 16, 0), (20, 16, 16), (None, 0, 0)],
)
def test_the_row_rule_is_the_breaks_slice(non_padded, static_rows, rows):
    """It counts what ``query[:global_num_token_non_padded_cpu]`` keeps of a bucket of
    ``static_rows`` rows (None keeps all of them)."""
    assert replay_attention_rows(non_padded, static_rows) == rows
    assert rows == torch.zeros(static_rows)[:non_padded].shape[0]
    batch = SimpleNamespace(
        input_ids=torch.zeros(static_rows), global_num_token_non_padded_cpu=non_padded
    )
    assert batch_attention_rows(batch) == rows


def test_a_batch_without_input_ids_has_no_rows():
    assert batch_attention_rows(SimpleNamespace(global_num_token_non_padded_cpu=5)) == 0


def test_no_patch_keeps_its_own_row_rule():
    """Every patch takes the replayed attention's rows from ``core.attention_rows``; none reads
    ``global_num_token_non_padded_cpu`` itself (a second rule is how the split planned 13 rows
    while the break saw 16)."""
    root = pathlib.Path(sglang_mixgraph.__file__).parent
    reads = re.compile(r"\.global_num_token_non_padded_cpu\b|[\"']global_num_token_non_padded_cpu")
    found = [
        p.relative_to(root).as_posix()
        for p in sorted(root.rglob("*.py"))
        if reads.search(p.read_text())
        and p.relative_to(root).as_posix() != "core/attention_rows.py"
    ]
    assert found == []


def test_the_row_rule_imports_no_sglang():
    code = (
        "import sys; import sglang_mixgraph.core.attention_rows; "
        "print([m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
