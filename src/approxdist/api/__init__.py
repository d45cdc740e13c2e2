"""The public Python API for users' own models, data and loops (beside `DataParallel`).

- `pipeline`: `Pipeline`, pipeline parallelism driven one mini-batch at a time.
"""

from approxdist.api.pipeline import Pipeline

__all__ = ["Pipeline"]
