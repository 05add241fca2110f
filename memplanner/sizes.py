"""Byte sizes at the edges: parse "3.5GiB" from a person, print "1.23 GiB" back.

Every size inside memplanner is an int of bytes; only these two functions see units.
Decimal-looking suffixes (K, KB, M, MB, G, GB, T, TB) are read as binary (KiB, MiB,
GiB, TiB), the way memory is sold and reported by `free -h`: "3G" is 3 * 2**30 bytes.
"""

from __future__ import annotations

import math
import re

MAX_BYTES = 2**60  # an exbibyte
_UNIT_EXPONENTS = {"": 0, "b": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in "512MiB", "3GiB", "3.5G", "1500M", "123456" (units are binary: G = GiB).

    Raises ValueError with a one-line message naming the value when it is not a size.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size {text} is negative; give a number of bytes such as 3GiB")
        return text
    match = _SIZE_PATTERN.match(str(text))
    if match is None and _SIZE_PATTERN.match(str(text).strip().removeprefix("-")):
        raise ValueError(f"{text!r} is negative; write a size such as 512MiB or 3GiB")
    if match is None:
        raise ValueError(
            f"cannot read {text!r} as a size; write e.g. 512MiB, 3GiB, 3.5G, 1500M or 123456 (bytes)"
        )
    number, prefix, suffix = match.groups()
    if suffix.lower() == "i":  # "3Gi" without the B reads the same as 3GiB
        suffix = "ib"
    if not prefix and suffix.lower() not in ("", "b"):
        raise ValueError(f"cannot read {text!r} as a size: unit {suffix!r} needs K, M, G or T before it")
    if not prefix and not float(number).is_integer():  # "3.5": no one means three and a half bytes
        raise ValueError(f"{text!r} is a fraction of a byte: give a unit, e.g. {number}GiB or {number}MiB")
    num_bytes = float(number) * 1024 ** _UNIT_EXPONENTS[prefix.lower()]
    if num_bytes >= MAX_BYTES:  # also a number too long for a float, which reads as inf
        raise ValueError(f"{text!r:.40} is more memory than any machine has; write e.g. 3GiB")
    return int(round(num_bytes))


def format_bytes(num_bytes: int, *, round_up: bool = False) -> str:
    """'1.23 GiB', '512.00 MiB', '100 B': binary units, two decimals above one KiB.

    round_up: the last decimal rounded up, for a size the user may type back as a budget (a
    minimum shown rounded to nearest could be a few bytes short of itself)."""
    sign = "-" if num_bytes < 0 else ""
    value = float(abs(num_bytes))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            if round_up:
                value = math.ceil(value * 100) / 100
            return f"{sign}{value:.2f} {unit}"
    raise AssertionError("unreachable")


def kept_free_text(kept_free_bytes: int) -> str:
    """" + 48.00 MiB kept free" after a predicted peak (empty when nothing is kept free beside it)."""
    return f" + {format_bytes(kept_free_bytes)} kept free" if kept_free_bytes else ""


def round_up(value: int, multiple: int) -> int:
    """`value` rounded up to a whole number of `multiple`s."""
    return -(-value // multiple) * multiple
