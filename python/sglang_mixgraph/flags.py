"""Our environment flags, registered in SGLang's `envs` so they read like upstream flags.

Upstream `EnvField.get()` (`sglang.srt.environ`) warns and falls back to the
default on a bad value. A patch switch must never silently turn itself off or on,
so our fields parse strictly: a bad value raises `FlagValueError` naming the
variable and the accepted values.

Fields are added to the `Envs` class after it was created: `EnvField.__set_name__`
only runs at class creation and asserts afterwards (`EnvField._allow_set_name`), so we
set `name` ourselves and `setattr` the field on `Envs`; `envs.<NAME>.get()` and
`exportable_env_vars()` then see it like any upstream flag.

A name that upstream's `Envs` already defines (SGLang shipped a flag of the same name, as the
upstream PR of the mixed split would) stays upstream's: our field is not put on `Envs`, the
`Flag` records upstream's field (`upstream_field`), reads as its default, and the patch that
owns it defers to upstream (`registry.evaluate`, state "deferred to upstream").
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from sglang.srt.environ import EnvField, Envs

_TRUE = ("1", "true", "yes", "y", "on")
_FALSE = ("0", "false", "no", "n", "off")


class FlagValueError(ValueError):
    """A flag holds a value outside its accepted set."""


class _StrictField(EnvField):
    accepted: tuple[str, ...] = ()
    # Added to the accepted values in the error message when they are a placeholder.
    accepted_help: str = ""

    def get(self) -> Any:
        value = os.getenv(self.name)
        if value is None or value == "":
            return self._resolve_default()
        try:
            return self.parse(value)
        except ValueError:
            raise FlagValueError(
                f"{self.name}={value!r} is not a valid value; accepted values: "
                f"{', '.join(self.accepted + ((self.accepted_help,) if self.accepted_help else ()))}"
                f" (unset means {self.default!r})"
            ) from None


class StrictEnvBool(_StrictField):
    accepted = _TRUE + _FALSE

    def parse(self, value: str) -> bool:
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(value)


class StrictEnvChoice(_StrictField):
    def __init__(self, default: str, choices: tuple[str, ...]):
        assert default in choices, (default, choices)
        super().__init__(default)
        self.accepted = choices

    def parse(self, value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in self.accepted:
            raise ValueError(value)
        return lowered


# The longest duration a seconds flag accepts: one day. A timer's wait is bounded by the
# platform (threading.Event.wait(1e10) raises OverflowError inside the thread that waits), and
# nothing of ours needs to wait longer.
MAX_SECONDS = 86400


class StrictEnvSeconds(_StrictField):
    """A duration in seconds: 0 (off), or a number from `minimum` to MAX_SECONDS (``60``,
    ``0.5``). The floor keeps a timer from waking so often that its thread spins."""

    accepted = ("<seconds>",)

    def __init__(self, default: int, minimum: float):
        super().__init__(default)
        self.minimum = minimum
        self.accepted_help = f"0, or a number from {minimum:g} to {MAX_SECONDS} (one day)"

    def parse(self, value: str) -> float:
        seconds = float(value.strip())  # ValueError for anything that is not a number
        if seconds != 0 and not (math.isfinite(seconds) and self.minimum <= seconds <= MAX_SECONDS):
            raise ValueError(value)
        return seconds


@dataclass(frozen=True)
class Flag:
    """One of our flags: its `envs` field plus the text README and `doctor` show."""

    name: str
    field: _StrictField
    doc: str
    off_value: str  # the value that leaves upstream behaviour in place
    # SGLang's own field of this name when upstream's envs already defines it: the variable is
    # then SGLang's, and we never read it as ours.
    upstream_field: EnvField | None = None

    @property
    def deferred(self) -> bool:
        return self.upstream_field is not None

    def get(self) -> Any:
        if self.upstream_field is not None:
            return self.field._resolve_default()
        return self.field.get()

    def requested_value(self) -> Any:
        """The variable as our parser reads it, deferred or not; None when unset or not one of
        our values (for a deferred flag: what a user who meant this plugin asked for)."""
        value = os.getenv(self.name)
        if value is None or value == "":
            return None
        try:
            return self.field.parse(value)
        except ValueError:
            return None

    def requests_on(self) -> bool:
        """Whether the variable asks for something other than the off value, in our terms."""
        value = self.requested_value()
        return value is not None and value != self.field.parse(self.off_value)

    @property
    def accepted(self) -> tuple[str, ...]:
        return self.field.accepted

    @property
    def default(self) -> Any:
        return self.field.default


FLAGS: dict[str, Flag] = {}


def _register(name: str, field: _StrictField, doc: str, off_value: str) -> Flag:
    existing = getattr(Envs, name, None)
    field.name = name
    if isinstance(existing, EnvField) and not isinstance(existing, _StrictField):
        # Upstream ships this name: leave its field in place (nothing of upstream is touched).
        flag = Flag(name=name, field=field, doc=doc, off_value=off_value, upstream_field=existing)
        FLAGS[name] = flag
        return flag
    setattr(Envs, name, field)
    flag = Flag(name=name, field=field, doc=doc, off_value=off_value)
    FLAGS[name] = flag
    return flag


def bool_flag(name: str, default: bool, doc: str) -> Flag:
    return _register(name, StrictEnvBool(default), doc, off_value="0")


def choice_flag(
    name: str, default: str, choices: tuple[str, ...], doc: str, *, off_value: str
) -> Flag:
    assert off_value in choices, (off_value, choices)
    return _register(name, StrictEnvChoice(default, choices), doc, off_value=off_value)


def seconds_flag(name: str, default: int, doc: str, *, minimum: float) -> Flag:
    """A duration flag; ``0`` is its off value, any other value at least ``minimum``."""
    return _register(name, StrictEnvSeconds(default, minimum), doc, off_value="0")
