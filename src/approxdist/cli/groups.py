"""Commands, with or without sub-actions (`approxdist plan show`, `schedule list`): one way to build them."""

from __future__ import annotations

import argparse
from typing import Any


def command(sub: Any, name: str, help: str, doc: str | None, **kwargs: Any) -> Any:
    """Add command `name` to the sub-parsers `sub`; its description is the first paragraph of
    `doc` (the docstring of the module that implements it)."""
    return sub.add_parser(name, help=help, description=doc.split("\n\n")[0] if doc else None,
                          **kwargs)


def command_group(sub: Any, name: str, help: str, description: str,
                  metavar: str = "ACTION") -> Any:
    """Add command `name` whose actions are added to the returned sub-parsers; the command
    alone prints its help and exits 2."""
    p = sub.add_parser(name, help=help, description=description)
    actions = p.add_subparsers(dest=f"{name}_action", metavar=metavar)
    p.set_defaults(func=lambda args: _help(p))
    return actions


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2
