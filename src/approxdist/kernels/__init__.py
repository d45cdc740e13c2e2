"""Fused CPU kernels in plain C (bit-fields, Table-N, compressor codes), built once per machine, via ctypes.

Optional by design: without a C compiler (or with `APPROXDIST_KERNELS=off`) every caller
falls back to its torch implementation, which produces the same bits.
"""

from approxdist.kernels.build import KernelStatus, kernel_status, load_kernels

__all__ = ["KernelStatus", "kernel_status", "load_kernels"]
