"""A user's own model: `--model package.module:function`, any function returning blocks.

The function is imported (the current directory is searched after `sys.path`, as
`python -m` would) and called with `model.args` as keyword arguments, plus
`input_shape` (per-sample, e.g. (3, 32, 32)) and `classes` when its signature names
them. It must return an `nn.Sequential` of blocks (a list of modules is wrapped in one),
each block taking and returning one tensor, so every parallel mode can cut it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from approxdist.errors import ModelError


def is_factory(name: str) -> bool:
    return ":" in name


def resolve_factory(spec: str) -> Callable[..., Any]:
    """The function `spec` = `package.module:function` names; `ModelError` if it cannot be had."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ModelError(f"model {spec!r} must look like package.module:function, "
                         f"e.g. --model mymodels.nets:small_cnn")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure becomes one clear line
        raise ModelError(f"model factory {spec!r}: cannot import {module_name!r} "
                         f"({type(exc).__name__}: {exc}); put its folder on PYTHONPATH or run "
                         f"from the folder that holds it") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ModelError(f"model factory {spec!r}: module {module_name!r} has no function "
                         f"{attr!r}; name a function that returns an nn.Sequential")
    return fn


def build_from_factory(spec: str, args: Mapping[str, Any], input_shape: tuple[int, ...],
                       classes: int) -> nn.Sequential:
    """Call the factory and check that it returned a sequence of blocks."""
    fn = resolve_factory(spec)
    kwargs = dict(args)
    params = _parameters(fn)
    for key, value in (("input_shape", input_shape), ("classes", classes)):
        if key in params and key not in kwargs:
            kwargs[key] = value
    try:
        made = fn(**kwargs)
    except TypeError as exc:
        raise ModelError(f"model factory {spec!r} refused the arguments {sorted(kwargs)} "
                         f"({exc}); set its arguments with --set model.args.NAME=VALUE") from None
    if isinstance(made, (list, tuple)) and made and all(isinstance(m, nn.Module) for m in made):
        made = nn.Sequential(*made)
    if not isinstance(made, nn.Sequential) or len(made) == 0:
        got = type(made).__name__ if not isinstance(made, nn.Sequential) else "an empty one"
        raise ModelError(f"model factory {spec!r} returned {got}, not an nn.Sequential of "
                         f"blocks; return nn.Sequential(block_1, ..., block_n)")
    return made


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()
