"""Flag parsing shared by the commands: a clear CommandError for a bad value.

Every numeric flag has a range, checked before the value is used: a value
out of it (``--processes 10000000000``, ``--grace inf``, ``--older-than
99999999999d``) is a CommandError naming the flag and its range, never a
traceback (OverflowError from timedelta, an int too large for PostgreSQL)
nor an attempt to do it (forking that many processes).
"""

import math
import unicodedata

from django.core.management.base import CommandError


def whole_number(name: str, value: str, minimum: int = 1, maximum: int | None = None, also: str = "") -> int:
    """``value`` as an int from ``minimum`` to ``maximum``, or a CommandError
    naming ``--name`` (and ``also``, what else the flag takes)."""
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):  # also a string of more digits than int() accepts
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        bound = f"from {minimum} to {maximum}" if maximum is not None else f"≥ {minimum}"
        raise CommandError(
            f"--{name} must be a whole number {bound}{f' or {also}' if also else ''}, not {printable(value)!r}."
        )
    return number


def seconds(name: str, value: str, minimum: float, maximum: float) -> float:
    """``value`` as a finite number of seconds from ``minimum`` to ``maximum``
    (no inf, no nan), or a CommandError naming ``--name``."""
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and minimum <= number <= maximum):
        raise CommandError(
            f"--{name} must be a number of seconds from {minimum:g} to {maximum:g}, not {printable(value)!r}."
        )
    return number


def printable(text) -> str:
    """``text`` with every control or format character (terminal escape
    sequences, carriage returns, bidi overrides, …) written as a Python
    escape: row text printed to an operator's terminal cannot drive it."""
    text = str(text)
    return "".join(
        ch if ch != "\\" and not unicodedata.category(ch).startswith("C") else ascii(ch)[1:-1] for ch in text
    )
