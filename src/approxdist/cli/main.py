"""Entry point of `approxdist`: builds the subcommand parsers and maps domain errors to exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from approxdist.cli import (
    analyze_cmd,
    bench,
    cluster_cmd,
    evaluate_cmd,
    experiment_cmd,
    inspect_cmd,
    plan_cmd,
    report_cmd,
    schedule_cmd,
    simulate_cmd,
    train_cmd,
)
from approxdist.errors import ApproxDistError
from approxdist.version import __version__

#: each module has `register(subparsers)` that adds its parser and sets `func`
SUBCOMMANDS = (train_cmd, bench, inspect_cmd, schedule_cmd, plan_cmd, simulate_cmd, analyze_cmd,
               experiment_cmd, report_cmd, evaluate_cmd, cluster_cmd)


class Parser(argparse.ArgumentParser):
    """argparse with bad input as one line (`approxdist train: error: ...`), exit 2: the
    usage block is what `--help` is for. Sub-commands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="approxdist",
        description="Distributed training where what crosses the network is tunable and measured.",
    )
    parser.add_argument("--version", action="version", version=f"approxdist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list:
        args_list = ["train"]  # the main job: `approxdist` alone trains the default run
    parser = build_parser()
    args = parser.parse_args(args_list)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ApproxDistError as exc:
        print(f"approxdist: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("approxdist: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of our output went away (`approxdist schedule show ... | head`): stop
        # quietly; point stdout at /dev/null so the interpreter's final flush cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
