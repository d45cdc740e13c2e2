"""Gradient compressors the field compares against (PowerSGD, top-k, random-k, QSGD, TernGrad,
sign methods): a pure core, one module each, chosen by spec string (docs/compressors.md)."""

from approxdist.comm.compressors.base import Compressor, Gathered, Summed, run_alone
from approxdist.comm.compressors.spec import (
    COMPRESSORS,
    DEFAULT_COMPRESSORS,
    Where,
    check_compressor,
    compressor_specs_help,
    get_compressor,
    is_compressor,
)

__all__ = ["COMPRESSORS", "DEFAULT_COMPRESSORS", "Compressor", "Gathered", "Summed", "Where",
           "check_compressor", "compressor_specs_help", "get_compressor", "is_compressor",
           "run_alone"]
