"""A failed resolution in one line: what SGLang raised, in words (`explain_failure`).

A failed assert shows its condition and the values it read (from the frame that raised, as
the source says it); a file-system error of this machine (a read-only HOME, a full disk) says
which path and what to point elsewhere (`environment_problem`); anything else gives its type,
message and the function that raised it.
"""

from __future__ import annotations

import ast
import errno
import linecache
import os
import types
from typing import Any

# ---------------------------------------------------------------- errors in words

_ENVIRONMENT_ERRNOS = {
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.ENOTDIR,
    errno.ENOSPC,
    errno.EDQUOT,
}


def environment_problem(exc: BaseException) -> str | None:
    """A file-system error of this machine (read-only HOME, full disk), in words; else None."""
    if not isinstance(exc, OSError) or exc.errno not in _ENVIRONMENT_ERRNOS or not exc.filename:
        return None
    path = os.path.abspath(str(exc.filename))
    text = f"cannot write {path}: {exc.strerror}"
    home = os.path.expanduser("~")
    cache = os.path.abspath(
        os.path.expanduser(os.environ.get("SGLANG_CACHE_DIR", "~/.cache/sglang"))
    )
    if path == home or path.startswith(home.rstrip(os.sep) + os.sep) or path.startswith(cache):
        text += (
            f". SGLang and torch keep their caches under SGLANG_CACHE_DIR (now {cache}); point "
            f"SGLANG_CACHE_DIR at a writable directory or make HOME ({home}) writable"
        )
    return text


def _last_frame(exc: BaseException) -> tuple[types.FrameType, int] | None:
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame, tb.tb_lineno


def _where(frame: types.FrameType) -> str:
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"


def _simple_value(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str)) and len(repr(value)) <= 60


def _names_in(expr: ast.AST) -> list[str]:
    """The dotted names (a, a.b.c) an expression reads, outermost first, without duplicates."""
    out: list[str] = []

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def visit(node: ast.AST) -> None:
        name = dotted(node)
        if name is not None:
            if name not in out:
                out.append(name)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(expr)
    return out


def _lookup(frame: types.FrameType, dotted: str) -> Any:
    head, *rest = dotted.split(".")
    if head in frame.f_locals:
        value = frame.f_locals[head]
    elif head in frame.f_globals:
        value = frame.f_globals[head]
    else:
        raise LookupError(head)
    for attr in rest:
        value = getattr(value, attr)
    return value


def _describe_assertion(exc: AssertionError) -> str:
    message = " ".join(str(exc).split())
    last = _last_frame(exc)
    if last is None:
        return f"an SGLang check failed: {message or 'AssertionError'}"
    frame, lineno = last
    condition, values = None, []
    try:
        filename = frame.f_code.co_filename
        tree = ast.parse("".join(linecache.getlines(filename)))
        node = next(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Assert) and n.lineno <= lineno <= (n.end_lineno or n.lineno)
        )
        condition = ast.unparse(node.test)
        for name in _names_in(node.test):
            try:
                value = _lookup(frame, name)
            except Exception:
                continue
            if _simple_value(value):
                values.append(f"{name}={value!r}")
    except (StopIteration, SyntaxError, ValueError, OSError):
        pass
    text = "SGLang requires " + (
        f"`{condition}`" if condition else "a condition that does not hold"
    )
    if values:
        text += f", which does not hold ({', '.join(values[:6])})"
    if message:
        text += f": {message}"
    return f"{text} [{_where(frame)}]"


def explain_failure(exc: BaseException) -> str:
    """One line saying why resolution failed."""
    env = environment_problem(exc)
    if env is not None:
        return env
    if isinstance(exc, AssertionError):
        return _describe_assertion(exc)
    detail = " ".join(str(exc).split()) or type(exc).__name__
    last = _last_frame(exc)
    where = f" [{_where(last[0])}]" if last is not None else ""
    return f"the server arguments do not resolve: {type(exc).__name__}: {detail}{where}"
