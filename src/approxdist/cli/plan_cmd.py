"""`approxdist plan`: choose a plan (`plan_solve`), profile a model (`plan_profile`), show a mesh.

    approxdist plan --profile alexnet.txt --world-size 4 --link bw=8gbit --json plan.json
    approxdist plan profile --model resnet20 --microbatch-size 32 --json prof.json
    approxdist plan show --stages 3 --replicas 2,1,1
    approxdist plan show --mesh pp=2,dp=2,tp=2
    approxdist plan show plan.json
    approxdist plan validate --quick --json validate.json

`plan show` prints a mesh of named axes (ranks -> stage, replica, shard, or a parameter
server's roles) and each rank's groups, no processes; from a plan file (docs/planner.md,
"Planning") it reads `world_size` and `stages` (replicas and optional ranks per stage) and
says what the plan was made for (`model`, `model_options`, `data`, `input_shape`,
`micro_batch_size`) where the file says it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from approxdist.cli import plan_profile, plan_solve, plan_validate
from approxdist.cli.groups import command
from approxdist.config.loader import to_dict
from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.planner.plan_file import read_plan_object
from approxdist.topology import Mesh, from_plan, parse_ints, parse_mesh, parse_replicas, render


def register(sub: Any) -> None:
    p = command(sub, "plan", help="choose a partition plan; show a topology or plan file",
                doc=plan_solve.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="actions: show (a topology or plan file), profile (a model's blocks into a "
                       "profile file), validate (predicted vs measured step times)")
    kinds = p.add_subparsers(dest="plan_action", metavar="ACTION")
    plan_solve.add_flags(p)
    p.set_defaults(func=lambda args: plan_solve.run(args) if args.model or args.profile
                   else _help(p))
    show = command(kinds, "show", help="print a mesh (or a plan file's) as a grid", doc=__doc__)
    show.add_argument("file", nargs="?", help="a plan file (JSON) to read the mesh from")
    show.add_argument("--mesh", help="named axes and their sizes, e.g. pp=2,dp=2, tp=2,dp=2, "
                                     "pp=2,dp=3/1 (ragged) or role=2,dp=1/3 (a parameter "
                                     "server: 1 server, 3 workers)")
    show.add_argument("--stages", type=int, help="pipeline stages (default 1)")
    show.add_argument("--replicas", help="ranks per stage: one count for all, or one per stage "
                                         "(e.g. 2,1,1; default 1)")
    show.add_argument("--placement", help="global ranks in stage-major order (stage 0's "
                                          "replicas first; default 0,1,2,...)")
    show.set_defaults(func=run_show)
    plan_profile.register(kinds)
    plan_validate.register(kinds)


def mesh_from(args: argparse.Namespace) -> Mesh:
    """The mesh the arguments describe: a plan file, --mesh, or --stages/--replicas; any
    but a plan file placed by --placement."""
    if args.file:
        if args.stages is not None or args.replicas or args.placement or args.mesh:
            raise ConfigError("give a plan file or --mesh/--stages/--replicas/--placement, "
                              "not both")
        return from_plan(read_plan_object(args.file))
    placement = parse_ints(args.placement, "--placement") if args.placement else None
    if args.mesh:
        if args.stages is not None or args.replicas:
            raise ConfigError(f"--mesh {args.mesh} says the stages and replicas; drop "
                              f"--stages/--replicas (or --mesh)")
        return parse_mesh(args.mesh, placement)
    stages = 1 if args.stages is None else args.stages
    replicas = parse_replicas(args.replicas) if args.replicas else 1
    return Mesh.stages(stages, replicas, placement)


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def run_show(args: argparse.Namespace) -> int:
    print(render(mesh_from(args)))
    if args.file:
        planned = planned_for(read_plan_object(args.file))
        if planned:
            print(planned)
    return 0


def planned_for(plan: dict[str, Any]) -> str:
    """`planned for: model mlp (depth=3, hidden=256), data digits, input [1, 8, 8] x
    micro-batch 16`, from the keys the plan file has (empty if none)."""
    parts = []
    if "model" in plan:
        options = plan.get("model_options") or {}
        listed = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(options.items()))
        parts.append(f"model {plan['model']}" + (f" ({listed})" if listed else ""))
    data = plan.get("data") or {}
    if data:
        where = f" in {data['data_dir']}" if data.get("data_dir") else ""
        default = to_dict(Config())["data"]
        rest = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(data.items())
                         if k not in ("dataset", "data_dir") and v != default.get(k))
        parts.append(f"data {data.get('dataset', 'digits')}{where}" +
                     (f" ({rest})" if rest else ""))
    if "input_shape" in plan:
        batch = plan.get("micro_batch_size")
        parts.append(f"input {plan['input_shape']}" + (f" x micro-batch {batch}" if batch else ""))
    return "planned for: " + ", ".join(parts) if parts else ""

