"""The experiment presets by name; an unknown name lists the valid ones (STYLE practice 4)."""

from __future__ import annotations

from approxdist.errors import ConfigError
from approxdist.experiments import catalog
from approxdist.experiments.base import Preset
from approxdist.registry import Registry

PRESETS: Registry[Preset] = Registry("experiment", ConfigError)


def _register_all() -> None:
    """Import the preset modules (lazily: they import torch-heavy code) and register them."""
    from approxdist.experiments.compressors import PRESET as COMPRESSORS
    from approxdist.experiments.link_check import PRESET as LINK_CHECK
    from approxdist.experiments.seed000_bandwidth import PRESET as BANDWIDTH
    from approxdist.experiments.seed000_ber import PRESET as BER
    from approxdist.experiments.seed000_bits import PRESET as BITS
    from approxdist.experiments.seed000_histogram import PRESET as HISTOGRAM
    from approxdist.experiments.seed001_allreduce import PRESET as ALLREDUCE
    from approxdist.experiments.seed001_scaling import PRESET as SCALING
    from approxdist.experiments.seed002_async import PRESET as ASYNC
    from approxdist.experiments.seed002_hybrid import PRESET as HYBRID
    from approxdist.experiments.seed003_largebatch import PRESET as LARGEBATCH
    from approxdist.experiments.seed003_ps import PRESET as PS
    from approxdist.experiments.seed003_tp import PRESET as TP
    from approxdist.experiments.seed004_adaprec import PRESET as ADAPREC
    from approxdist.experiments.transformer_wire import PRESET as TRANSFORMER_WIRE

    for preset in (BITS, BER, BANDWIDTH, HISTOGRAM, LINK_CHECK, TRANSFORMER_WIRE, ALLREDUCE,
                   SCALING, HYBRID, ASYNC, LARGEBATCH, PS, TP, ADAPREC, COMPRESSORS):
        if preset.name not in PRESETS:
            PRESETS.add(preset.name, preset)


def get_preset(name: str) -> Preset:
    """The preset called `name`; `ConfigError` listing the valid names otherwise."""
    catalog.listing(name)  # an unknown name fails here, before the modules are imported
    _register_all()
    return PRESETS.get(name)


def preset_names() -> list[str]:
    """Every preset's name, sorted, from the catalog (no preset module is imported)."""
    return catalog.names()
