"""approxdist: distributed training where what crosses the network is tunable and measured."""

__version__ = "0.1.0"

__all__ = ["DataParallel", "__version__"]


def __getattr__(name: str) -> object:
    """`approxdist.DataParallel` without importing torch at `import approxdist`."""
    if name == "DataParallel":
        from approxdist.data_parallel.engine import DataParallel

        return DataParallel
    raise AttributeError(f"module 'approxdist' has no attribute {name!r}")
