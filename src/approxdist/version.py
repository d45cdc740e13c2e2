"""The package's version, one place: the root re-exports it, `approxdist --version` prints it."""

__version__ = "0.1.0"
