"""No comment, docstring or message of the package cites upstream by file and line number.

Line numbers are wrong at the next SGLang release; a module and function name survives it
(line numbers, where useful, belong in a docs table that names the version). A citation is a
`name.py:<line>` (also broken over a line), a `name.py <line>` / `name.py`` <line>`, a bare
line range such as `195-202`, or `line <n>`.
"""

from __future__ import annotations

import re
from pathlib import Path

import sglang_mixgraph

PACKAGE = Path(sglang_mixgraph.__file__).parent

_CITATION = re.compile(
    r"\.py`*:\s*\d"  # model_runner.py:1234
    r"|\.py`*\s+\d+\b"  # ``dequant_k_cache.py`` 27-98
    r"|(?<![\d.-])\d{2,5}-\d{2,5}(?![\d-])"  # a bare range of lines: 195-202 (not a date)
    r"|\blines?\s+\d",  # line 456
    re.IGNORECASE,
)
_BROKEN_FILE_CITATION = re.compile(r"\.py`*:\s*$")  # model_runner.py:<newline> 1234
_LEADING_NUMBER = re.compile(r"^[\s#`\"'(]*\d")


def citations(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    hits = []
    for i, line in enumerate(lines):
        if _CITATION.search(line):
            hits.append(line.strip())
        elif _BROKEN_FILE_CITATION.search(line) and i + 1 < len(lines):
            if _LEADING_NUMBER.match(lines[i + 1]):
                hits.append(line.strip())
    return hits


def test_no_line_number_citations_of_upstream():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for hit in citations(path):
            found.setdefault(rel, []).append(hit)
    assert not found, f"cite upstream by module and function name, not line: {found}"


CITES = [
    "# see model_runner.py:1234",
    "(``sglang/srt/arg_groups/cuda_graph_hook.py:",  # the line number on the next line
    "``dequant_k_cache.py`` 27-98",
    "the DSV4 rule (195-202) holds",
    "upstream does this at line 456",
]
CLEAN = [
    "`sglang.srt.arg_groups.memory_hook.reserve_for_graph_mb`",
    "measured on 2026-11-30",
    "GLM-5 and DeepSeek-V4, 584-byte cache, 2^21 tokens",
]


def test_the_detector_finds_citations_and_only_them(tmp_path):
    cites = tmp_path / "cites.py"
    cites.write_text("\n".join(CITES[:2] + ["# 170-255) rest"] + CITES[2:]) + "\n")
    assert citations(cites) == [c.strip() for c in CITES[:2]] + ["# 170-255) rest"] + CITES[2:]
    clean = tmp_path / "clean.py"
    clean.write_text("\n".join(CLEAN) + "\n")
    assert citations(clean) == []
