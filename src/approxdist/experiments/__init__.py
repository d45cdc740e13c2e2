"""Named experiment presets reproducing the seed studies, with CSVs, plots and a report.

    from approxdist.experiments import Settings, run_experiment, render_report
    run_experiment("seed000-bits", Settings(out=Path("exp/bits"), size="quick"))
    render_report(Path("exp/bits"))          # plots + report.md again, from the CSVs

`preset_names()` lists the presets; an unknown name raises `ConfigError` listing them.
"""

from approxdist.experiments.base import SIZES, Preset, Settings
from approxdist.experiments.registry import get_preset, preset_names
from approxdist.experiments.runner import render_report, run_experiment

__all__ = ["SIZES", "Preset", "Settings", "get_preset", "preset_names", "render_report",
           "run_experiment"]
