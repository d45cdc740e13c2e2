"""The trainer's engines, one module per parallel mode; importing this package registers them
in `train.engine.ENGINES` under the names of `train.parallel`."""

from approxdist.train.engines import param_server, pipeline, replicated  # noqa: F401  (registers)
