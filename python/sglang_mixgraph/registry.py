"""Patch registry: what each patch hooks upstream, checked against the installed sglang.

A patch names every upstream target by dotted path, with the kind of object and the
parameters its hook needs. Before anything is registered with SGLang's `HookRegistry`
(sglang.srt.plugins.hook_registry), every target of every enabled patch is resolved and
checked: the needed parameters must be there, in place, and any other parameter must be
optional and accepted by the hook (`**kwargs`), so an added optional keyword is compatible.
A patch the user switched on explicitly that cannot apply stops the whole install (never
half-applied); a patch that is only on by default warns once, loudly, and stays off.
Disabled patches are never resolved at all. A patch one of whose flags upstream's envs already
defines defers to upstream: it stays off, its targets are never resolved, and one warning line
per process says which patch, which flag and what to set (`deferral_message`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_mixgraph.flags import Flag, FlagValueError

if TYPE_CHECKING:
    from sglang_mixgraph.core.capture_effects import CaptureEffect

logger = logging.getLogger(__name__)

PINNED_SGLANG = "0.5.23"
# A module-level graph break: upstream's ``eager_on_graph`` object around a function, whose
# signature is the function's.
EAGER_BREAK = "eager_on_graph break"
KINDS = ("function", "method", "classmethod", "staticmethod", EAGER_BREAK)
DEFERRED = "deferred to upstream"
IMPORT_FAILED = "its module does not import"


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
    # The parameters the hook passes on or reads, as `describe_signature` writes them
    # ("self, x, *, y"); the target may have more, if they are optional.
    signature: str
    hook_type: HookType
    fn: Callable[..., Any]

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.target}: kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class DoctorLine:
    """A fact of the installed SGLang that `doctor` reports beside the patches, for a patch
    that depends on it: its key in the JSON report, its label in the text, and its reading."""

    key: str
    label: str
    read: Callable[[], str]


@dataclass(frozen=True)
class Patch:
    """A patch; its first `switch_count` flags are its switches (each turns it on, and all of
    them at their off value leave it off); any further flag tunes it."""

    id: str
    summary: str
    flags: tuple[Flag, ...]
    hooks: tuple[Hook, ...]
    # Reads the flags; a patch is enabled when this returns True.
    is_enabled: Callable[[], bool]
    # For `plan`: given the planner's typed result (graph_plan.GraphPlan: the deployment facts,
    # the graph configuration), say what the patch would do there (act, or fall back and
    # why). None when the patch has nothing to add.
    explain: Callable[[Any], str] | None = None
    # For `plan`, while the patch is off: what each of its switches would do in the planned
    # deployment, by "FLAG=value". None: `explain` (else `summary`) for every switch.
    explain_if_on: Callable[[Any], dict[str, str]] | None = None
    # For `doctor`, which knows no deployment, while the patch is enabled: a warning about
    # what its switches set here would do (a line, or None where there is nothing to say).
    doctor_caveat: Callable[[], str | None] | None = None
    # For `doctor`: where the coefficients of the patch's cost model come from on this
    # machine's GPU (core.split_cost_model.calibration_info). None: the patch has no model.
    calibration: Callable[[], dict[str, Any]] | None = None
    # For `doctor`: a fact of the installed SGLang the patch depends on, reported beside the
    # patches. None: nothing to report.
    doctor_line: DoctorLine | None = None
    # For the planner: what the patch changes in a breakable capture's memory in this process
    # (reads its flags; core.capture_effects.CaptureEffect). The deployment facts read it from
    # every patch (planner.deployment_facts.capture_effects_of). None when it changes nothing.
    capture_effects: Callable[[], frozenset[CaptureEffect]] | None = None
    # Upstream attributes the hooks read besides their targets: (dotted path, expected type).
    reads: tuple[tuple[str, type], ...] = ()
    switch_count: int = 1
    # The catalogue entry `doctor` shows (a test keeps why, how and retired_by non-empty): why
    # upstream needs the patch, how it works, the upstream PR it mirrors where there is one
    # ("SGLang PR #<number>" and what it does), and the upstream change that makes it unnecessary.
    why: str = ""
    how: str = ""
    upstream_pr: str | None = None
    retired_by: str = ""
    # The reference page that explains the patch, relative to the repository root.
    docs_page: str = ""

    def __post_init__(self):
        if self.upstream_pr is not None and self.upstream_pr_number is None:
            raise ValueError(
                f"patch {self.id!r}: upstream_pr must name the PR by number "
                f"('SGLang PR #<number>'), got {self.upstream_pr!r}"
            )

    @property
    def upstream_pr_number(self) -> int | None:
        """The number of the upstream SGLang PR the patch mirrors, None where there is none."""
        found = re.search(r"\bPR #(\d+)\b", self.upstream_pr or "")
        return int(found.group(1)) if found else None

    @property
    def switches(self) -> tuple[Flag, ...]:
        return self.flags[: self.switch_count]

    def switch_off_text(self) -> str:
        """What to set to turn the patch off: every switch at its off value."""
        return " and ".join(f"{f.name}={f.off_value}" for f in self.switches)


@dataclass(frozen=True)
class TargetCheck:
    target: str
    expected: str
    found: str
    ok: bool
    why: str = ""  # what is incompatible, when not ok
    # The module on the target's path whose import raised, when that is why it is not ok.
    unimportable: str | None = None


@dataclass
class PatchStatus:
    patch: Patch
    flag_values: dict[str, str] = field(default_factory=dict)
    enabled: bool = False
    checks: list[TargetCheck] = field(default_factory=list)
    error: str | None = None
    # Set when a default-on patch met upstream drift: it stays off and says why.
    drift: str | None = None
    # Set when upstream's envs already defines one of the patch's flags: the patch stays off,
    # touches nothing, and says why (one line).
    deferred: str | None = None
    # With `deferred`: the user set the patch's switch to turn this plugin's patch on.
    requested: bool = False

    @property
    def state(self) -> str:
        if self.error is not None:
            return "cannot apply"
        if self.deferred is not None:
            return DEFERRED
        if self.drift is not None:
            return "off (upstream changed)"
        return "active" if self.enabled else "off"

    @property
    def reason(self) -> str | None:
        return self.error or self.deferred or self.drift


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


class TargetImportError(LookupError):
    """A module on a target's path exists but importing it raised (a kernel library that will
    not load, a dependency that is missing): the target cannot be reached."""

    def __init__(self, module: str, error: BaseException):
        detail = " ".join(str(error).split())
        super().__init__(
            f"importing {module} raised {type(error).__name__}" + (f": {detail}" if detail else "")
        )
        self.module = module


def _import_if_module(name: str) -> Any | None:
    """The module `name`, or None when there is no such module (the name is an attribute)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise TargetImportError(name, e) from None  # the module is there, a dependency is not
    except Exception as e:  # anything a module body raises: OSError from a CDLL, RuntimeError...
        raise TargetImportError(name, e) from None


def resolve_target(path: str) -> tuple[Any, str, Any]:
    """Import the longest module prefix of `path`; return (owner, attribute name, raw attribute).

    Raises LookupError when something on the path is missing, and its TargetImportError when a
    module on it exists but its import raises: every failure is one the checks can report."""
    parts = path.split(".")
    module = None
    consumed = 0
    # Shortest prefix first: the first name that is no module ends the module part, and a module
    # whose import raises is named as the one that fails.
    for i in range(1, len(parts)):
        found = _import_if_module(".".join(parts[:i]))
        if found is None:
            break
        module, consumed = found, i
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
        raise LookupError(
            f"{getattr(owner, '__qualname__', owner)!r} has no attribute {attr!r}"
        ) from None
    return owner, attr, raw


def _is_eager_break(obj: Any) -> bool:
    return type(obj).__name__ == "_EagerOnGraphCallable" and inspect.isfunction(
        getattr(obj, "__wrapped__", None)
    )


def _kind_of(owner: Any, raw: Any) -> tuple[str, Callable[..., Any] | None]:
    if isinstance(raw, classmethod):
        return "classmethod", raw.__func__
    if isinstance(raw, staticmethod):
        return "staticmethod", raw.__func__
    if inspect.isfunction(raw):
        if _is_eager_break(inner := getattr(raw, "__wrapped__", None)):
            # SGLang's HookRegistry wrapper around a break: the hooks are applied (a check
            # after the plugin loaded, as `plan` makes), the target is still the break
            return EAGER_BREAK, inner.__wrapped__
        return ("method" if inspect.isclass(owner) else "function"), raw
    if _is_eager_break(raw):
        return EAGER_BREAK, raw.__wrapped__
    return type(raw).__name__, None


def _sections(params: list[inspect.Parameter]) -> tuple[list[str], list[str], bool, bool]:
    """(positional names in order, keyword-only names, has *args, has **kwargs)."""
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    return (
        positional,
        keyword,
        any(p.kind is p.VAR_POSITIONAL for p in params),
        any(p.kind is p.VAR_KEYWORD for p in params),
    )


def _needed(signature: str) -> tuple[list[str], list[str], bool, bool]:
    positional, keyword, star, starstar, kw_only = [], [], False, False, False
    for part in (x.strip() for x in signature.split(",") if x.strip()):
        if part == "/":
            continue
        if part == "*":
            kw_only = True
        elif part.startswith("**"):
            starstar = True
        elif part.startswith("*"):
            star, kw_only = True, True
        else:
            (keyword if kw_only else positional).append(part)
    return positional, keyword, star, starstar


def incompatibility(needed: str, target_fn: Callable[..., Any], hook_fn: Callable[..., Any]) -> str:
    """Why a hook that needs `needed` cannot wrap `target_fn`, or "" when it can."""
    params = list(inspect.signature(target_fn, follow_wrapped=True).parameters.values())
    positional, keyword, star, starstar = _sections(params)
    need_pos, need_kw, need_star, need_starstar = _needed(needed)
    if positional[: len(need_pos)] != need_pos:
        return f"positional parameters ({', '.join(positional)}) do not start with ({', '.join(need_pos)})"
    missing = [n for n in need_kw if n not in keyword and n not in positional]
    if missing:
        return f"keyword parameter(s) {', '.join(missing)} gone"
    if (need_star and not star) or (need_starstar and not starstar):
        return "*args/**kwargs the hook relies on are gone"
    known = set(need_pos) | set(need_kw)
    extra = [
        p for p in params if p.name not in known and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    _, _, hook_star, hook_starstar = _sections(list(inspect.signature(hook_fn).parameters.values()))
    # A parameter the hook does not name reaches upstream only through its *args / **kwargs.
    dropped = [
        p
        for p in extra
        if not (hook_starstar and p.kind is not p.POSITIONAL_ONLY)
        and not (hook_star and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    ]
    required = [p.name for p in dropped if p.default is p.empty]
    if required:
        return f"new required parameter(s) {', '.join(required)} that the hook does not pass on"
    if dropped:
        return f"new optional parameter(s) {', '.join(p.name for p in dropped)} that the hook does not pass on"
    return ""


def check_hook(hook: Hook) -> TargetCheck:
    expected = f"{hook.kind} with ({hook.signature})"
    try:
        owner, _attr, raw = resolve_target(hook.target)
    except TargetImportError as e:
        return TargetCheck(hook.target, expected, str(e), False, IMPORT_FAILED, e.module)
    except LookupError as e:
        return TargetCheck(hook.target, expected, f"missing: {e}", False, "target missing")
    kind, fn = _kind_of(owner, raw)
    if fn is None:
        return TargetCheck(
            hook.target, expected, f"{kind} (not a function)", False, "not a function"
        )
    found = f"{kind} ({describe_signature(fn)})"
    if kind != hook.kind:
        return TargetCheck(hook.target, expected, found, False, f"a {kind}, not a {hook.kind}")
    why = incompatibility(hook.signature, fn, hook.fn)
    return TargetCheck(hook.target, expected, found, not why, why)


def check_attribute(path: str, expected: type) -> TargetCheck:
    """An upstream attribute a hook reads: it must be there and of the expected type."""
    wanted = expected.__name__
    try:
        owner, attr, _raw = resolve_target(path)
    except TargetImportError as e:
        return TargetCheck(path, wanted, str(e), False, IMPORT_FAILED, e.module)
    except LookupError as e:
        return TargetCheck(path, wanted, f"missing: {e}", False, "attribute missing")
    found = type(getattr(owner, attr)).__name__
    ok = isinstance(getattr(owner, attr), expected)
    return TargetCheck(path, wanted, found, ok, "" if ok else f"a {found}, not a {wanted}")


def target_checks(patch: Patch) -> list[TargetCheck]:
    """Every hook target and every attribute the hooks read, checked read-only."""
    return [check_hook(h) for h in patch.hooks] + [check_attribute(p, t) for p, t in patch.reads]


def switched_on_explicitly(patch: Patch) -> bool:
    return any(os.environ.get(f.name, "") != "" for f in patch.switches)


_version_warned = False


def warn_if_not_pinned() -> None:
    """One warning per process when the installed sglang is not the pinned one."""
    global _version_warned
    found = installed_sglang_version()
    if found != PINNED_SGLANG and not _version_warned:
        _version_warned = True
        logger.warning(
            "sglang-mixgraph is built for sglang==%s but sglang %s is installed; every hook target "
            "is checked below, and patches that cannot apply say so.",
            PINNED_SGLANG,
            found,
        )


def _who_reads(switch: Flag) -> str:
    """What becomes of the value of a switch the user set while its patch defers to upstream."""
    if switch.deferred:
        return (
            f"SGLang's own field of that name (envs.{switch.name}) reads the value, and this "
            "plugin's patch stays off"
        )
    return (
        "SGLang defines no flag of that name and this plugin's patch stays off, so nothing acts "
        "on the value"
    )


def deferral_message(patch: Patch, requested: bool) -> str:
    """One line: which patch defers, for which flag(s) SGLang defines itself, what to set.

    With `requested`, also what becomes of each switch the user set to turn the patch on: the
    variable is read only by a field of its own name (flags.Flag.upstream_field), never passed
    to another flag."""
    names = [f.name for f in patch.flags if f.deferred]
    shown = " and ".join(names)
    line = (
        f"patch {patch.id!r} defers to upstream: sglang {installed_sglang_version()} defines "
        f"{shown} itself, so SGLang reads {'them' if len(names) > 1 else 'it'} and the patch stays "
        f"off (nothing of it is installed)."
    )
    if requested:
        for switch in (f for f in patch.switches if f.requests_on()):
            line += (
                f" You set {switch.name}={os.environ.get(switch.name)!r} to turn this plugin's "
                f"patch on: {_who_reads(switch)}."
            )
    return line + (
        f" Set {shown} as SGLang documents it to use SGLang's own feature, or install "
        f"sglang=={PINNED_SGLANG} to use this plugin's patch."
    )


def _what_fixes(failed: list[TargetCheck]) -> str:
    """What makes failed targets apply: the pinned sglang for upstream drift; for a module whose
    import raised, making it import (installing another sglang would not help)."""
    modules = sorted({c.unimportable for c in failed if c.unimportable is not None})
    drifted = any(c.unimportable is None for c in failed)
    fixes = [f"install sglang=={PINNED_SGLANG}"] if drifted else []
    if modules:
        fixes.append(f"make {', '.join(modules)} import (the error above)")
    return " and ".join(fixes)


def evaluate(patch: Patch) -> PatchStatus:
    """Read a patch's flags and, if it is enabled, check its targets; registers nothing."""
    status = PatchStatus(patch)
    if any(f.deferred for f in patch.flags):
        # The variable is SGLang's: never read it as ours, never check or touch a target.
        for flag in patch.flags:
            status.flag_values[flag.name] = (
                "(SGLang's own flag)"
                if flag.deferred
                else os.environ.get(flag.name) or str(flag.default)
            )
        status.requested = any(f.requests_on() for f in patch.switches)
        status.deferred = deferral_message(patch, status.requested)
        return status
    try:
        for flag in patch.flags:
            status.flag_values[flag.name] = str(flag.get())
        status.enabled = bool(patch.is_enabled())
    except FlagValueError as e:
        status.error = str(e)
        return status
    if not status.enabled:
        return status
    status.checks = target_checks(patch)
    failed = [c for c in status.checks if not c.ok]
    if not failed:
        return status
    flags = ", ".join(f"{k}={v}" for k, v in status.flag_values.items())
    lines = [
        f"patch {patch.id!r} ({flags}) cannot apply to the installed sglang "
        f"{installed_sglang_version()} (sglang-mixgraph pins sglang=={PINNED_SGLANG}):"
    ]
    for c in failed:
        lines.append(f"  target {c.target}: expected {c.expected}, found {c.found} ({c.why})")
    fix = _what_fixes(failed)
    if switched_on_explicitly(patch):
        lines.append(
            f"  {fix[0].upper()}{fix[1:]}, or switch the patch off ({patch.switch_off_text()})."
        )
        status.error = "\n".join(lines)
    else:
        lines.append(
            f"  It is on by default only, so it stays off and SGLang runs as upstream. "
            f"{fix[0].upper()}{fix[1:]} to use it, or set {patch.switch_off_text()} to silence this."
        )
        status.drift = "\n".join(lines)
        status.enabled = False
    return status


# The patches this process's installs evaluated, by id: a hook asks them what they declare
# (`evaluated_patches`) without importing the patch catalogue it is part of.
_evaluated: dict[str, Patch] = {}


def evaluated_patches() -> tuple[Patch, ...]:
    """The patches `install` evaluated in this process (enabled or not), latest by id."""
    return tuple(_evaluated.values())


def install(patches: tuple[Patch, ...] | list[Patch]) -> list[PatchStatus]:
    """Check every enabled patch, then register all their hooks, or raise and register none."""
    warn_if_not_pinned()
    statuses = [evaluate(p) for p in patches]
    errors = [s.error for s in statuses if s.error is not None]
    if errors:
        raise PatchCheckError("\n".join(errors))
    _evaluated.update((p.id, p) for p in patches)
    for s in statuses:
        if s.deferred is not None:
            logger.warning("sglang-mixgraph: %s", s.deferred)
        if s.drift is not None:
            logger.warning("sglang-mixgraph: %s", s.drift)
    for s in statuses:
        if s.enabled:
            for h in s.patch.hooks:
                HookRegistry.register(h.target, h.fn, h.hook_type)
    return statuses


def announcement(statuses: list[PatchStatus]) -> str:
    """The one line a process logs about what the plugin does in it: patches and their flags."""

    def flags(s: PatchStatus) -> str:
        return ", ".join(f"{k}={v}" for k, v in s.flag_values.items())

    active = [f"{s.patch.id} ({flags(s)})" for s in statuses if s.enabled]
    rest = [f"{s.patch.id} ({s.state})" for s in statuses if not s.enabled]
    body = (
        f"active patches: {'; '.join(active)}" if active else "no patch enabled; upstream untouched"
    )
    return (
        f"sglang-mixgraph: {body}"
        + (f"; not active: {', '.join(rest)}" if rest else "")
        + f" (sglang {installed_sglang_version()})"
    )
