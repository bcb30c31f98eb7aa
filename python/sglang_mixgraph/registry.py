"""Patch registry: what each patch hooks upstream, checked against the installed sglang.

A patch names every upstream target by dotted path, with the kind of object and
the signature it expects. Before anything is registered with SGLang's
`HookRegistry` (sglang/srt/plugins/hook_registry.py), every target of every
enabled patch is resolved and compared; one mismatch stops the whole install, so
a patch is never half-applied. Disabled patches are never resolved at all.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_mixgraph.flags import Flag, FlagValueError

logger = logging.getLogger(__name__)

PINNED_SGLANG = "0.5.23"
KINDS = ("function", "method", "classmethod", "staticmethod")


class PatchCheckError(RuntimeError):
    """An enabled patch cannot apply to the installed sglang, or a flag is invalid."""


def installed_sglang_version() -> str:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class Hook:
    """One hook: the upstream target, what we expect to find there, and our function."""

    target: str
    kind: str
    signature: str  # parameter list as `describe_signature` writes it, e.g. "self, x, *, y"
    hook_type: HookType
    fn: Callable[..., Any]

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.target}: kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class Patch:
    id: str
    summary: str
    flags: tuple[Flag, ...]
    hooks: tuple[Hook, ...]
    # Reads the flags; a patch is enabled when this returns True.
    is_enabled: Callable[[], bool]
    # For `plan`: given a resolve.Resolution, say what the patch would do there
    # (act, or fall back and why). None when the patch has nothing to add.
    explain: Callable[[Any], str] | None = None


@dataclass(frozen=True)
class TargetCheck:
    target: str
    expected: str
    found: str
    ok: bool


@dataclass
class PatchStatus:
    patch: Patch
    flag_values: dict[str, str] = field(default_factory=dict)
    enabled: bool = False
    checks: list[TargetCheck] = field(default_factory=list)
    error: str | None = None

    @property
    def state(self) -> str:
        if self.error is not None:
            return "cannot apply"
        return "active" if self.enabled else "off"


def describe_signature(fn: Callable[..., Any]) -> str:
    """Parameter names with `/`, `*`, `*args`, `**kwargs` markers; no defaults, no annotations."""
    parts: list[str] = []
    params = list(inspect.signature(fn, follow_wrapped=True).parameters.values())
    saw_kw_only_marker = False
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            saw_kw_only_marker = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            if not saw_kw_only_marker:
                parts.append("*")
                saw_kw_only_marker = True
            parts.append(p.name)
        else:
            parts.append(p.name)
        is_last_positional_only = p.kind is p.POSITIONAL_ONLY and (
            i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY
        )
        if is_last_positional_only:
            parts.append("/")
    return ", ".join(parts)


def _resolve(path: str) -> tuple[Any, str, Any]:
    """Import the longest module prefix of `path`; return (owner, attribute name, raw attribute)."""
    parts = path.split(".")
    module = None
    consumed = 0
    for i in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        consumed = i
        break
    if module is None:
        raise LookupError(f"no importable module in {path!r}")
    owner: Any = module
    for name in parts[consumed:-1]:
        if not hasattr(owner, name):
            raise LookupError(f"{owner.__name__} has no attribute {name!r}")
        owner = getattr(owner, name)
    attr = parts[-1]
    try:
        raw = inspect.getattr_static(owner, attr)
    except AttributeError:
        raise LookupError(f"{getattr(owner, '__qualname__', owner)!r} has no attribute {attr!r}") from None
    return owner, attr, raw


def _kind_of(owner: Any, raw: Any) -> tuple[str, Callable[..., Any] | None]:
    if isinstance(raw, classmethod):
        return "classmethod", raw.__func__
    if isinstance(raw, staticmethod):
        return "staticmethod", raw.__func__
    if inspect.isfunction(raw):
        return ("method" if inspect.isclass(owner) else "function"), raw
    return type(raw).__name__, None


def check_hook(hook: Hook) -> TargetCheck:
    expected = f"{hook.kind} ({hook.signature})"
    try:
        owner, _attr, raw = _resolve(hook.target)
    except (LookupError, ImportError) as e:
        return TargetCheck(hook.target, expected, f"missing: {e}", False)
    kind, fn = _kind_of(owner, raw)
    if fn is None:
        return TargetCheck(hook.target, expected, f"{kind} (not a function)", False)
    found = f"{kind} ({describe_signature(fn)})"
    return TargetCheck(hook.target, expected, found, found == expected)


def evaluate(patch: Patch) -> PatchStatus:
    """Read a patch's flags and, if it is enabled, check its targets; registers nothing."""
    status = PatchStatus(patch)
    try:
        for flag in patch.flags:
            status.flag_values[flag.name] = str(flag.get())
        status.enabled = bool(patch.is_enabled())
    except FlagValueError as e:
        status.error = str(e)
        return status
    if not status.enabled:
        return status
    status.checks = [check_hook(h) for h in patch.hooks]
    failed = [c for c in status.checks if not c.ok]
    if failed:
        flags = ", ".join(f"{k}={v}" for k, v in status.flag_values.items())
        lines = [
            f"patch {patch.id!r} ({flags}) cannot apply to the installed sglang "
            f"{installed_sglang_version()} (sglang-mixgraph pins sglang=={PINNED_SGLANG}):"
        ]
        for c in failed:
            lines.append(f"  target {c.target}: expected {c.expected}, found {c.found}")
        lines.append(
            f"  Install sglang=={PINNED_SGLANG}, or switch the patch off "
            f"({', '.join(f.name + '=' + f.off_value for f in patch.flags)})."
        )
        status.error = "\n".join(lines)
    return status


def install(patches: tuple[Patch, ...] | list[Patch]) -> list[PatchStatus]:
    """Check every enabled patch, then register all their hooks, or raise and register none."""
    statuses = [evaluate(p) for p in patches]
    errors = [s.error for s in statuses if s.error is not None]
    if errors:
        raise PatchCheckError("\n".join(errors))
    for s in statuses:
        if s.enabled:
            for h in s.patch.hooks:
                HookRegistry.register(h.target, h.fn, h.hook_type)
    active = [s.patch.id for s in statuses if s.enabled]
    logger.info(
        "sglang-mixgraph: %s",
        f"active patches: {', '.join(active)}" if active else "no patch enabled; upstream untouched",
    )
    return statuses
