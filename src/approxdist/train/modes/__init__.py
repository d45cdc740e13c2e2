"""The parallel modes' records, one module per family; importing this package registers
them in `train.mode.MODES` under the names of `train.parallel`."""

from approxdist.train.modes import (  # noqa: F401  (registers)
    data_parallel,
    param_server,
    pipeline,
    tensor,
)
