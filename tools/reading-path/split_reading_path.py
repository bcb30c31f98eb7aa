"""The mixed split's reading path: the files a reader opens to know what the patch does at run
time, with their line counts.

Method: start from every module of ``patches/mixed_split/``; follow each ``sglang_mixgraph``
import it makes (module-level and function-local, ``from pkg import module`` resolved to the
module), transitively, but those under ``if TYPE_CHECKING:``, which never run (an annotation's type,
such as the view the split's fallbacks read, ``planner.split_view``); leave out the runtime
foundation (the package's top-level modules:
flags, counters, fallback, registry, upstream_attrs, ...), which every patch reads alike, and
the packages' ``__init__`` files other than the patch's own. Lines are physical lines
(``wc -l``). ``--with-foundation`` counts the foundation modules reached too.

    python tools/reading-path/split_reading_path.py [--with-foundation]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sglang_mixgraph"
START = "sglang_mixgraph.patches.mixed_split"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside an ``if TYPE_CHECKING:`` block (``typing.TYPE_CHECKING``
    too): imports that only a type checker follows."""
    found = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        named = getattr(test, "id", None) or getattr(test, "attr", None)
        if isinstance(node, ast.If) and named == "TYPE_CHECKING":
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package modules a module's source imports anywhere in it, at run time."""
    is_package = path.name == "__init__.py"
    base_package = name if is_package else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = base_package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return {m for m in found if m in modules and m != name}


def is_foundation(name: str) -> bool:
    """A top-level module of the package (the runtime foundation every patch reads alike)."""
    return name.count(".") == 1


def reading_path(with_foundation: bool = False) -> dict[str, int]:
    """``{path relative to the package: lines}`` of the split's reading path."""
    modules = _modules()
    todo = [m for m in modules if m == START or m.startswith(START + ".")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += _imports(modules[name], name, modules)
    kept = {
        m
        for m in seen
        if (with_foundation or not is_foundation(m))
        and m != "sglang_mixgraph"
        and (modules[m].name != "__init__.py" or m == START)
    }
    return {
        str(modules[m].relative_to(PACKAGE)): len(modules[m].read_text().splitlines())
        for m in sorted(kept)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--with-foundation", action="store_true")
    args = parser.parse_args()
    path = reading_path(args.with_foundation)
    for name, lines in sorted(path.items()):
        print(f"{lines:6d}  {name}")
    print(f"{sum(path.values()):6d}  total over {len(path)} files")


if __name__ == "__main__":
    main()
