"""Flag parsing shared by the commands: a clear CommandError for a bad value."""

from django.core.management.base import CommandError


def whole_number(name: str, value: str, minimum: int = 1) -> int:
    """``value`` as an int ≥ ``minimum``, or a CommandError naming ``--name``."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = minimum - 1
    if number < minimum:
        raise CommandError(f"--{name} must be a whole number ≥ {minimum}, not {value!r}.")
    return number
