"""approxdist: distributed training where what crosses the network is tunable and measured."""

from approxdist.version import __version__

__all__ = ["DataParallel", "ParameterServer", "Pipeline", "TensorParallel", "__version__",
           "ddp_hook"]


def __getattr__(name: str) -> object:
    """`approxdist.DataParallel`, `approxdist.Pipeline`, `approxdist.ParameterServer`,
    `approxdist.TensorParallel`, `approxdist.ddp_hook` without importing torch at
    `import approxdist`."""
    if name == "DataParallel":
        from approxdist.data_parallel.module import DataParallel

        return DataParallel
    if name == "Pipeline":
        from approxdist.api.pipeline import Pipeline

        return Pipeline
    if name == "ParameterServer":
        from approxdist.api.param_server import ParameterServer

        return ParameterServer
    if name == "TensorParallel":
        from approxdist.api.tensor_parallel import TensorParallel

        return TensorParallel
    if name == "ddp_hook":
        from approxdist.data_parallel.ddp_hook import ddp_hook

        return ddp_hook
    raise AttributeError(f"module 'approxdist' has no attribute {name!r}")
