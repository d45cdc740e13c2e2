"""A config against its mode and the parts it names, before any worker starts.

`check_parts(cfg)` runs before any worker starts (`approxdist train`'s preflight,
`approxdist experiment`) and again when a rank builds its trainer (under torchrun too):
the link spec, the mode's record (`train/mode.py`: the options it reads, its own rules
and parts, its mesh against the world, the batch share), the stragglers, the delay rule,
batch growth and core binding. Each error is one line naming the key, the value and what
would be valid.
"""

from __future__ import annotations

from collections.abc import Mapping

from approxdist.comm.netem import parse_link
from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.launch.affinity import check_policy
from approxdist.optim.delay import check_rule
from approxdist.train.mode import Mode, check_mode
from approxdist.train.parts import named
from approxdist.train.straggler import stragglers_of


def check_parts(cfg: Config, flag_of: Mapping[str, str] | None = None) -> Mode:
    """Raise `ConfigError` naming the first key whose value names no part, is not read by
    the run's mode (`flag_of` names the flag that set a key) or breaks the mode's rules;
    the mode's record."""
    if cfg.comm.link:
        named("comm.link", cfg.comm.link, lambda: parse_link(cfg.comm.link))
    mode = check_mode(cfg, flag_of)
    stragglers_of(cfg)
    check_rule(cfg.optim.delay_rule)
    _check_growth(cfg, mode)
    check_policy(cfg.train.bind_cores)  # binding needs Linux
    return mode


def _check_growth(cfg: Config, mode: Mode) -> None:
    """A growing batch changes an epoch's step count: modes that fix it up front refuse."""
    what = mode.fixed_steps(cfg) if cfg.optim.schedule == "grow" else None
    if what:
        raise ConfigError(f"optim.schedule = 'grow' changes the steps of each epoch, which "
                          f"{what} fixes when it starts; use another optim.schedule or "
                          f"data parallelism / a flushed pipeline schedule")


