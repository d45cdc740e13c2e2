"""Keep freed heap memory in the process (glibc malloc), so training steps stop page-faulting.

glibc gives the top of its heap back to the OS once more than `M_TRIM_THRESHOLD` bytes
are free there, and serves allocations above `M_MMAP_THRESHOLD` with fresh `mmap`s that
are unmapped again on free. Both thresholds adapt upwards on their own, but a training
step that frees most of its activations at the end of backward can still have its heap
trimmed every step, and the next forward then faults the same pages in again (the kernel
zeroes each one). With `DataParallel` on ResNet-56 (batch 32, 2 ranks, CPU) that was
~10,000 minor faults and ~20 ms of system time per forward, 4 % of the step, where the
same forward without the engine faulted none (its parameter gradients, alive until the
next `zero_grad`, happened to pin the heap top; the engine frees them into its buckets
during backward). CPU training guides fix this with another allocator (jemalloc,
tcmalloc via `LD_PRELOAD`); `hold_freed_memory()` gets the same effect from glibc by
fixing both thresholds: nothing below `mmap_mb` is mmapped and up to `trim_mb` of free
heap stays in the process, to be reused by the next step.

Process-wide and idempotent. The launchers call it in every worker (`launch.spawn`,
`train.worker`) and `DataParallel` calls it on construction, so an engine used from a
user's own `torchrun` script gets it too. Elsewhere than glibc (musl, macOS) it does
nothing and says why.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc adapts to by itself (32 MiB on 64-bit)
MMAP_MB = 32
TRIM_MB = 512


def hold_freed_memory(trim_mb: int = TRIM_MB, mmap_mb: int = MMAP_MB) -> str:
    """Fix glibc's trim and mmap thresholds; "" when done, else why nothing changed."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"not glibc ({platform.system()} {platform.libc_ver()[0] or 'unknown libc'})"
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        return f"mallopt unavailable: {exc}"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for param, mb in ((M_MMAP_THRESHOLD, mmap_mb), (M_TRIM_THRESHOLD, trim_mb)):
        if mallopt(param, mb << 20) != 1:
            return f"mallopt({param}, {mb} MiB) refused"
    return ""
