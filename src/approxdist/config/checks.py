"""The checks every config section's values go through, each one `ConfigError` line naming `section.key`."""

from __future__ import annotations

from approxdist.errors import ConfigError


def positive(section: str, name: str, value: float, hint: str = "") -> None:
    """`section.name` must be > 0 (`hint`: what the value means, added to the message)."""
    if value <= 0:
        raise ConfigError(f"{section}.{name} = {value!r} must be > 0{hint}")


def non_negative(section: str, name: str, value: float) -> None:
    """`section.name` must be >= 0."""
    if value < 0:
        raise ConfigError(f"{section}.{name} = {value!r} must be >= 0")


def one_of(section: str, name: str, value: str, valid: tuple[str, ...]) -> None:
    """`section.name` must be one of `valid`; the message lists them."""
    if value not in valid:
        raise ConfigError(f"{section}.{name} = {value!r} is not one of: {', '.join(valid)}")
