"""Build and load the C kernels: one `cc` call per machine, cached by source and CPU.

The shared object lands in `$APPROXDIST_KERNEL_CACHE` (default
`~/.cache/approxdist/kernels`), named by a hash of the source, the compiler flags and the
CPU's feature flags, so a cache shared between different machines never hands one a
binary built for another's instruction set. Ranks that start together may each compile;
each writes a private temporary file and renames it into place, so none ever loads a
half-written library. A failed build is not an error: callers use their torch path, and
`kernel_status` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from approxdist.cache import cache_dir as approxdist_cache

#: compiled together into one library (public: the tests build variants of it)
SOURCES = ("bitfield.c", "table.c", "quantize.c", "topk.c", "bucket.c")
#: included by the sources: part of the cache key, not compiled on their own
_HEADERS = ("bitpack.h", "bytepack.h", "lookup.h", "ordered.h", "parallel.h", "traffic.h",
            "stream.h")
#: tried in order; -march=native is safe because the build runs on the machine that uses it;
#: -fopenmp puts the threads of a call on torch's OpenMP team (parallel.h), pthreads without
_FLAG_SETS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-march=native"), ("-O3",))
BASE_FLAGS = ("-shared", "-fPIC", "-std=c99", "-pthread")


@dataclass(frozen=True)
class KernelStatus:
    """Whether the kernels are in use here, and the library path and vector instruction set
    or the reason they are not."""

    available: bool
    detail: str


class _Loader:
    """Builds the library at most once per process (the loaded .so is process-wide anyway)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._lib: ctypes.CDLL | None = None
        self._status = KernelStatus(False, "not loaded yet")

    def get(self) -> tuple[ctypes.CDLL | None, KernelStatus]:
        with self._lock:
            if not self._done:
                self._lib, self._status = _build_and_load()
                self._done = True
            return self._lib, self._status


_LOADER = _Loader()


def load_kernels() -> ctypes.CDLL | None:
    """The kernel library, or None when it cannot be used here (see `kernel_status`)."""
    return _LOADER.get()[0]


def kernel_status() -> KernelStatus:
    return _LOADER.get()[1]


def cache_dir() -> Path:
    env = os.environ.get("APPROXDIST_KERNEL_CACHE")
    if env:
        return Path(env)
    return approxdist_cache() / "kernels"


def _build_and_load() -> tuple[ctypes.CDLL | None, KernelStatus]:
    if os.environ.get("APPROXDIST_KERNELS", "").lower() in ("0", "off", "no", "false"):
        return None, KernelStatus(False, "disabled by APPROXDIST_KERNELS=off; using torch ops")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, KernelStatus(False, "no C compiler (cc/gcc) on PATH; using torch ops. "
                                         "Install one (e.g. apt install gcc) for faster codecs")
    try:
        source = b"".join((Path(__file__).parent / name).read_bytes()
                          for name in SOURCES + _HEADERS)
        folder = cache_dir()
    except (OSError, RuntimeError) as exc:  # no source shipped, no home directory
        return None, KernelStatus(False, f"kernel source or cache folder unavailable ({exc}); "
                                         f"using torch ops. Set APPROXDIST_KERNEL_CACHE")
    errors: list[str] = []
    for flags in _FLAG_SETS:
        path = folder / f"approxdist-kernels-{_key(source, compiler, flags)}.so"
        try:
            if not path.exists():
                _compile(compiler, flags, path)
            lib = ctypes.CDLL(str(path))
            lib.ad_kernels_isa.restype = lib.ad_kernels_threads.restype = ctypes.c_char_p
            return lib, KernelStatus(True, f"{path}, {lib.ad_kernels_isa().decode()}, "
                                           f"{lib.ad_kernels_threads().decode()}")
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(f"{compiler} {' '.join(flags)}: {str(exc).strip()[:300]}")
    return None, KernelStatus(False, "kernel build failed; using torch ops. " + " | ".join(errors))


def _compile(compiler: str, flags: tuple[str, ...], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sources = [str(Path(__file__).parent / name) for name in SOURCES]
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *flags, *BASE_FLAGS, "-o", tmp, *sources],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise subprocess.SubprocessError(proc.stderr or f"exit code {proc.returncode}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _key(source: bytes, compiler: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256(source)
    h.update(" ".join((compiler, *flags, *BASE_FLAGS)).encode())
    h.update(platform.machine().encode())
    h.update(_cpu_flags().encode())
    return h.hexdigest()[:16]


def _cpu_flags() -> str:
    """The CPU's feature list (Linux); the processor name elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()
