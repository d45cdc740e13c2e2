"""The public Python API for users' own models, data and loops (beside `DataParallel`).

- `pipeline`: `Pipeline`, pipeline parallelism driven one mini-batch at a time;
- `param_server`: `ParameterServer`, servers holding the parameters and the optimiser,
  workers stepping one mini-batch at a time;
- `tensor_parallel`: `TensorParallel`, a model split within its layers.
"""

from approxdist.api.param_server import ParameterServer
from approxdist.api.pipeline import Pipeline
from approxdist.api.tensor_parallel import TensorParallel

__all__ = ["ParameterServer", "Pipeline", "TensorParallel"]
