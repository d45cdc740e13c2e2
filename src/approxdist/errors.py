"""Domain exceptions: each message quotes the bad value and says what to do."""

from __future__ import annotations


class ApproxDistError(Exception):
    """Base of every error a user can act on; the CLI prints it on one line and exits 2."""


class ConfigError(ApproxDistError):
    """A config value, key, file or override is invalid."""


class DataError(ApproxDistError):
    """A data set is missing, malformed or asked for in an impossible way."""


class ModelError(ApproxDistError):
    """A model name or model option is invalid for the given input."""


class SpecError(ApproxDistError):
    """A codec, channel or link spec string is malformed."""


class CodecError(ApproxDistError):
    """A payload cannot be decoded (truncated, wrong codec, corrupted header)."""


class LaunchError(ApproxDistError):
    """Workers could not be started, or one of them failed."""


class ClusterError(ApproxDistError):
    """A namespaced test cluster cannot be made, found, run on or removed."""


class CommError(ApproxDistError):
    """A transfer or collective failed: mismatched peers, dead peer, timeout.

    `peer` is the global rank of the other end when one is known (a dead peer), so
    that a caller who knows the topology can say where that rank sat.
    """

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


def unknown_name(kind: str, name: str, valid: list[str] | tuple[str, ...]) -> str:
    """The standard message for an unknown registry name."""
    return f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}"
