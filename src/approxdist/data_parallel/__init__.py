"""Data parallelism: gradient averaging across replicas (seed 001), low-precision wires (004).

`DataParallel` (module.py; its backward pass in backward.py) is the DDP-like wrapper on
approxdist's link layer;
`PlainAllReduce` (plain.py) is the one-flat-`dist.all_reduce` baseline;
`ddp_hook.py` lends our codecs and algorithms to torch's DDP as a comm hook.
"""

from approxdist.data_parallel.module import DataParallel

__all__ = ["DataParallel"]
