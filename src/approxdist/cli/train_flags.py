"""The flags of `approxdist train` beyond the common ones (pipeline, data parallelism,
parameter server, tensor parallelism) and the config keys each sets: the flag layer of a
run's config (flags override the config file, `--set` overrides flags)."""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.config.pipeline import COMM_THREADS, FUSE_CHOICES
from approxdist.errors import ConfigError
from approxdist.topology import parse_ints
from approxdist.train.mode import Mode, modes

#: the [pipeline] keys that have a flag of the same name (--microbatches -> pipeline.microbatches)
PIPELINE_FLAGS = ("stages", "split", "balance", "microbatches", "schedule", "recompute",
                  "fuse_accumulation", "placement", "replicas", "comm_threads")

#: data-parallel flags (argparse dest) -> [dp] key (docs/data_parallel.md)
DP_FLAGS = {"dp_reducer": "reducer", "algorithm": "algorithm", "bucket_mb": "bucket_mb",
            "threads": "threads", "chunk_kb": "chunk_kb", "overlap": "overlap",
            "early_forward": "early_forward", "find_unused": "find_unused",
            "calibration": "calibration"}

#: flags of the wires (config/wire.py): flag -> wire.<traffic>.<key>; a mode may send a
#: gradient-wire flag to its own gradient wire (`Mode.flag_keys`: --codec -> wire.push.codec)
WIRE_FLAGS = {"codec": "wire.grad.codec", "error_feedback": "wire.grad.error_feedback",
              "codec_rule": "wire.grad.rules", "codec_times": "wire.grad.times",
              "fwd_codec": "wire.fwd.codec", "bwd_codec": "wire.bwd.codec",
              "fwd_channel": "wire.fwd.channel", "bwd_channel": "wire.bwd.channel",
              "pull_codec": "wire.pull.codec", "push_channel": "wire.push.channel",
              "pull_channel": "wire.pull.channel"}

#: flag -> config key; flags override the config file, `--set` overrides flags
FLAG_KEYS = {
    "parallel": "train.parallel", "world_size": "train.world_size", "mesh": "train.mesh",
    "epochs": "train.epochs", "device": "train.device", "out": "train.out",
    "seed": "train.seed", "model": "model.name", "dataset": "data.dataset",
    "data_dir": "data.data_dir", "link": "comm.link", "batch_size": "data.batch_size",
    "lr": "optim.lr", "trace": "train.trace", "tensorboard": "train.tensorboard",
    **{name: f"pipeline.{name}" for name in PIPELINE_FLAGS},
    **{flag: f"dp.{key}" for flag, key in DP_FLAGS.items()},
    **WIRE_FLAGS,
    "tp": "tp.size", "tp_plan": "tp.plan",
    "servers": "ps.servers", "workers": "ps.workers", "ps_mode": "ps.mode",
    "staleness_lr": "ps.staleness_lr", "tolerate_worker_loss": "ps.tolerate_worker_loss",
    "straggler": "train.stragglers", "bind_cores": "train.bind_cores",
    "phase_steps": "adaprec.phase_steps", "speculate_steps": "adaprec.speculate_steps",
    "signal": "adaprec.signal", "overhead_budget": "adaprec.overhead_budget",
}

#: the keys that say how many ranks a run has (directly or through its mesh)
WORLD_KEYS = ("train.world_size", "train.mesh", "pipeline.stages", "pipeline.replicas",
              "ps.servers", "ps.workers")

#: flags whose name is not `--` + their key's dest with dashes
FLAG_NAMES = {"overlap": "--no-overlap", "codec_rule": "--codec-rule"}


def add_pipeline_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pipeline (--parallel pipeline|hybrid; docs/pipeline.md, "
                             "docs/hybrid.md)")
    g.add_argument("--stages", type=int, help="pipeline stages, one per rank (default: world size)")
    g.add_argument("--replicas", metavar="R|R0,R1,...",
                   help="--parallel hybrid: ranks per stage, one count for all (2) or one per "
                        "stage (3,1); micro-batches go round robin to a stage's replicas")
    g.add_argument("--placement", metavar="R0,R1,...",
                   help="the ranks in stage-major order, e.g. 2,0,1 puts stage 0 on rank 2 "
                        "(default 0,1,2,...); `approxdist plan show` prints the topology")
    g.add_argument("--split", help="first block of stages 1, 2, ...: e.g. 3 or 3,7")
    g.add_argument("--balance", choices=["params", "time"], help="partition by cost instead")
    g.add_argument("--microbatches", type=int, help="micro-batches per mini-batch (default 4)")
    g.add_argument("--schedule", help="pipeline schedule: gpipe (default), 1f1b, or the "
                                      "asynchronous pipedream, pipedream-vsync, 2bw")
    g.add_argument("--fwd-codec", help="wire format of activations, e.g. bits:s0e2+2m0")
    g.add_argument("--bwd-codec", help="wire format of gradients, e.g. bf16")
    g.add_argument("--fwd-channel", help="bit errors on activations, e.g. ber:1e-3@5")
    g.add_argument("--bwd-channel", help="bit errors on gradients")
    g.add_argument("--recompute", action="store_true", default=None,
                   help="keep only stage inputs, recompute the forward in backward (GPipe)")
    g.add_argument("--comm-threads", choices=COMM_THREADS,
                   help="who posts a stage's sends and receives: inline (default: the stage "
                        "itself), per-message (PipeDream), sa, sra (seed 002; docs/hybrid.md)")
    g.add_argument("--fuse-accumulation", choices=FUSE_CHOICES,
                   help="add nn.Linear weight gradients into .grad inside the GEMM: auto "
                   "(default: layers of 2^19+ weights), all, or off (autograd's own pass)")


def add_dp_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data parallel (--parallel dp; docs/data_parallel.md)")
    g.add_argument("--dp-reducer", choices=["approxdist", "plain"],
                   help="approxdist (default: buckets, overlap, codecs) or plain dist.all_reduce")
    g.add_argument("--algorithm", help="all-reduce: auto (default), ring, brb, brd, vhd, native")
    g.add_argument("--calibration", metavar="off|measure|PATH",
                   help="how the auto all-reduce picks: measure (default: this machine's "
                        "calibration, measured once and cached), off (the alpha-beta model) "
                        "or a file of approxdist bench allreduce --calibrate")
    g.add_argument("--codec", help="gradient wire format, e.g. bf16, fp8-e5m2, bits:s1e6m1, or "
                                   "adaprec:fp32,fp8-e5m2,table4,table1 (chosen during training; "
                                   "docs/adaprec.md)")
    g.add_argument("--phase-steps", type=int,
                   help="AdaPrec: steps between decisions (adaprec.phase_steps, default 40)")
    g.add_argument("--speculate-steps", type=int,
                   help="AdaPrec: steps each candidate trains speculatively, < --phase-steps "
                        "(adaprec.speculate_steps, default 8)")
    g.add_argument("--signal", choices=["soft", "accuracy"],
                   help="AdaPrec: validation signal (soft: mean probability of the true class)")
    g.add_argument("--overhead-budget", type=float,
                   help="AdaPrec: most share of the run's time speculation may take (0.5)")
    g.add_argument("--codec-rule", action="append", metavar="PATTERN=CODEC",
                   help="per-parameter codec, e.g. type:Conv2d.weight=fp8-e5m2 or *.bias=fp32, "
                        "or a named policy: policy:seed004, policy:fastest (repeatable, first "
                        "match wins; docs/adaprec.md)")
    g.add_argument("--codec-times", metavar="FILE",
                   help="`approxdist bench allreduce --json` rows the codec `fastest` picks "
                        "from (policy:fastest)")
    g.add_argument("--error-feedback", action="store_true", default=None,
                   help="keep what a lossy codec dropped and add it to the next step")
    g.add_argument("--bucket-mb", type=float, help="gradient bucket size in MiB (default 1)")
    g.add_argument("--threads", type=int, help="communication threads (default 2)")
    g.add_argument("--chunk-kb", type=float, help="fragment size over threads, KiB (default 0 = off)")
    g.add_argument("--no-overlap", dest="overlap", action="store_false", default=None,
                   help="reduce after backward instead of during it")
    g.add_argument("--early-forward", action="store_true", default=None,
                   help="update each bucket as it arrives; next forward waits per layer")
    g.add_argument("--find-unused", action="store_true", default=None,
                   help="leave .grad None for parameters no rank used (one extra small all-reduce)")


def add_ps_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parameter server (--parallel ps; docs/param_server.md); "
                             "--codec and --error-feedback apply to the pushes")
    g.add_argument("--servers", type=int, help="server ranks holding parameter shards (default 1)")
    g.add_argument("--workers", type=int, help="worker ranks computing gradients; the world is "
                                               "servers + workers")
    g.add_argument("--ps-mode", help="sync (default), async, ssp:<s> (no worker more than s "
                                     "steps ahead) or backup:<b> (N+b: drop the b late ones)")
    g.add_argument("--pull-codec", help="wire format of the parameters workers pull (fp32)")
    g.add_argument("--push-channel", help="bit errors on pushed gradients, e.g. ber:1e-4@5")
    g.add_argument("--pull-channel", help="bit errors on pulled parameters")
    g.add_argument("--staleness-lr", action="store_true", default=None,
                   help="divide the learning rate by each applied gradient's staleness")
    g.add_argument("--tolerate-worker-loss", action="store_true", default=None,
                   help="go on without a dead worker (async, ssp, backup; local launcher "
                        "only): summary.json names it and the step it was lost at; "
                        "docs/param_server.md, Failures")


def add_tp_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tensor parallel (--parallel tensor; docs/tensor_parallel.md); "
                             "--fwd-codec/--bwd-codec/--fwd-channel/--bwd-channel apply to the "
                             "tp all-reduces, --codec to the replicas' gradients")
    g.add_argument("--tp", type=int, help="ranks each layer the plan names is split over "
                                          "(default 2); the world is tp x replicas")
    g.add_argument("--tp-plan", metavar="FILE|LAYER=STYLE,...",
                   help="which layers to split and how (colwise, rowwise, heads, channel_out, "
                        "channel_in, channel_norm), inline (0=colwise,2=rowwise) or a file of "
                        "'layer = style' lines; default: the model family's own plan")


#: flags holding a comma list of integers (parsed here, so a bad one is one line, exit 2)
INT_LISTS = ("placement", "replicas")


def flag_layer(args: argparse.Namespace, mode: Mode) -> dict[str, dict[str, Any]]:
    """The config values the flags set; `mode` may send a flag to another key
    (`--codec` sets a parameter server's `wire.push.codec`)."""
    layer: dict[str, dict[str, Any]] = {}
    for flag, key in FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if flag in INT_LISTS:
            value = list(parse_ints(value, f"--{flag}"))
        *tables, name = mode.flag_keys.get(flag, key).split(".")
        into: dict[str, Any] = layer
        for table in tables:
            into = into.setdefault(table, {})
        into[name] = value
    return layer


def flag_names(mode: Mode) -> dict[str, str]:
    """config key -> the flag that sets it in `mode` (for messages)."""
    out = {key: FLAG_NAMES.get(flag, "--" + flag.replace("_", "-"))
           for flag, key in FLAG_KEYS.items()}
    out.update({key: "--" + flag.replace("_", "-") for flag, key in mode.flag_keys.items()})
    return out


def check_flags(layer: dict[str, dict[str, Any]], mode: Mode) -> None:
    """A flag given for a key `mode` does not read is refused, even at its default value."""
    names = flag_names(mode)
    for key in keys_of(layer):
        if not mode.reads(key):
            users = [m for m in modes().names() if modes().get(m).reads(key)]
            raise ConfigError(f"{names.get(key, key)} sets {key}, which --parallel {mode.name} "
                              f"does not use; drop it"
                              + (f", or use --parallel {' or '.join(users)}" if users else ""))


def keys_of(layer: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key a layer sets, nested tables' keys dotted (`wire.grad.codec`)."""
    out = []
    for key, value in layer.items():
        if isinstance(value, dict) and (not prefix or prefix.startswith("wire")):
            out += keys_of(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out
