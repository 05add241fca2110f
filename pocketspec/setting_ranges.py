"""The range of each numeric setting, declared beside the setting and checked in one place.

A settings field (pocketspec/settings.py) names its flag and range with `in_range(...)` as
its dataclass metadata. `parse_setting` turns what a person typed into a value of that
range or a one-line UserError naming the flag; the CLI's option types call it
(apps/flags.py), so no bound is written twice. Every value must be finite: nan and inf
compare false against any bound, so they are refused before the bounds are looked at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pocketspec.errors import UserError


@dataclass(frozen=True)
class Range:
    flag: str
    low: float
    high: float
    is_integer: bool = False
    is_low_open: bool = False  # low itself is refused (top-p: above 0)
    also: tuple[float, ...] = ()  # values allowed outside [low, high], e.g. 0 for greedy
    meaning: str = ""  # what the `also` values mean

    def describe(self) -> str:
        kind = "a whole number" if self.is_integer else "a number"
        if self.is_low_open:
            text = f"{kind} above {_show(self.low)} and at most {_show(self.high)}"
        else:
            text = f"{kind} from {_show(self.low)} to {_show(self.high)}"
        if self.also:
            special = " or ".join(_show(value) for value in self.also)
            text = f"{special} ({self.meaning}) or {text}"
        return text

    def contains(self, value: float) -> bool:
        if value in self.also:
            return True
        is_above_low = value > self.low if self.is_low_open else value >= self.low
        return math.isfinite(value) and is_above_low and value <= self.high

    def parse(self, text) -> int | float:
        """The value of `text` (a string or a number) in this range, else UserError."""
        value = _number(text, self.is_integer)
        if value is None or not self.contains(value):
            raise UserError(f"{self.flag} must be {self.describe()}, got {_typed(text)}")
        return value


def _show(value: float) -> str:
    if float(value).is_integer() and abs(value) >= 2**20:
        exponent = math.log2(abs(value) + 1)
        if exponent.is_integer():
            return f"2**{int(exponent)} - 1"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _typed(text) -> str:
    return repr(text) if isinstance(text, str) else str(text)


def _number(text, is_integer: bool) -> int | float | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        value = text
    else:
        try:
            value = int(str(text).strip(), 10) if is_integer else float(str(text).strip())
        except ValueError:
            return None
    if is_integer and isinstance(value, float):
        return int(value) if value.is_integer() else None
    return value


def in_range(flag: str, low: float, high: float, **options) -> dict:
    """Dataclass field metadata: `field(default=..., metadata=in_range("--top-p", 0, 1, is_low_open=True))`."""
    return {"range": Range(flag, low, high, **options)}


def setting_range(settings_class, name: str) -> Range:
    for item in fields(settings_class):
        if item.name == name and "range" in item.metadata:
            return item.metadata["range"]
    raise KeyError(f"{settings_class.__name__}.{name} declares no range")


def parse_setting(settings_class, name: str, text):
    """`text` as the value of settings_class.name, checked against its declared range."""
    return setting_range(settings_class, name).parse(text)


def check_ranges(settings) -> None:
    """UserError naming the flag of the first field of `settings` that is out of its range."""
    for item in fields(settings):
        value = getattr(settings, item.name)
        if "range" in item.metadata and value is not None:
            item.metadata["range"].parse(value)
