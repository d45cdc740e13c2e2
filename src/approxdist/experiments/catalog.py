"""Every experiment preset as `experiment list`, its report and docs/experiments.md name it.

One entry a preset: its study, what of it the preset reproduces, its title, a one-line
summary and its expected run times, read without importing the preset's module (which
imports torch and the trainer); the module (`experiments/<name>.py`, dashes as underscores)
holds how the preset runs and reports (`base.Preset`) and takes its entry here by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.errors import ConfigError, unknown_name


@dataclass(frozen=True)
class Listing:
    """One preset as listed; `quick` and `full` are the expected times of those sizes on 2
    cores, each starting with a duration ("~2 min (8 runs x 4 epochs, 1 seed)")."""

    name: str
    study: str  # the key of its study in `experiments.studies`, e.g. "seed000"
    title: str
    reproduces: str  # what of the study, e.g. "section 4.3, Figs. 3-4"
    summary: str  # one line for `experiment list`
    quick: str
    full: str

    @property
    def run_time(self) -> dict[str, str]:
        """Size -> expected time: the sizes a user runs (`smoke` only checks the machinery)."""
        return {"quick": self.quick, "full": self.full}


CATALOG: tuple[Listing, ...] = (
    # seed 000: approximate transfers between pipeline stages
    Listing("seed000-bits", "seed000",
            title="Accuracy of seed 000's bit-field wire formats (Figs. 3-4)",
            reproduces="section 4.3, Figs. 3-4",
            summary="train/test accuracy per epoch: fp32, the six bit-field schemes, bits:auto4",
            quick="~2.5 min (8 runs x 4 epochs, 1 seed)", full="~25 min (8 schemes x 3 seeds x 10 epochs)"),
    Listing("seed000-ber", "seed000",
            title="Accuracy vs protected top bits under bit errors (Fig. 2)",
            reproduces="section 4.2, Fig. 2",
            summary="accuracy vs protected top bits of fp32 activations at bit-error rates 1e-5, 1e-4",
            quick="~1.5 min (5 runs x 4 epochs, rate 1e-5, 1 seed)",
            full="~14 min (2 rates x 5 protections + reference, 3 seeds, 10 epochs)"),
    Listing("seed000-bandwidth", "seed000",
            title="Time per epoch vs link bandwidth (Table 1)",
            reproduces="section 4.5, Table 1",
            summary="time per epoch and per-step compute/transfer vs emulated link bandwidth",
            quick="~2 min (3 links x 3 wire formats, 1 epoch each)",
            full="~7.5 min (8 links x 3 wire formats, 3 epochs each)"),
    Listing("seed000-histogram", "seed000",
            title="Exponent histogram of the transferred activations (Fig. 5)",
            reproduces="section 4.4, Fig. 5",
            summary="8-bit exponent histogram of the values crossing the cut; scheme coverage",
            quick="~20 s (4 epochs, one process)", full="~40 s (10 epochs)"),
    Listing("link-emulation-check", "seed000",
            title="In-process link emulation against the kernel's traffic shaper (tc)",
            reproduces="the tc-shaped links of Table 1 (a check of our emulator against them, not a figure "
                       "of the study)",
            summary="all-reduce / exchange times and a training epoch at 10 Mbit/s-1 Gbit/s through --link "
                    "and through tc on namespaced hosts (root)",
            quick="~2 min (10 and 100 Mbit/s)", full="~10 min (10 Mbit/s-1 Gbit/s)"),
    Listing("transformer-wire", "seed000",
            title="What each wire format costs a transformer (validation loss)",
            reproduces="the wire formats of section 4.3, applied to a transformer (not a figure of the "
                       "study)",
            summary="gpt-tiny on stdlib-text: validation loss of bf16, fp16, fp8, table4 on activations, "
                    "activation gradients and weight gradients vs fp32",
            quick="~6 min (18 runs x 1 epoch, 1 seed)", full="~30 min (18 runs x 2 epochs x 3 seeds)"),

    # seed 001: all-reduce algorithms and data-parallel scaling
    Listing("seed001-allreduce", "seed001",
            title="All-reduce time vs message size per algorithm",
            reproduces="section 3.2, Table 1 (BRB / BRD / VHD and the hybrid by size)",
            summary="all-reduce time vs size for native, ring, brb, brd, vhd, auto on N = 2 and 4",
            quick="~1 min (4 sizes up to 16 MiB, two runs per world)",
            full="~3 min (8 sizes up to 64 MiB, two runs per world)"),
    Listing("seed001-scaling", "seed001",
            title="Data-parallel speed-up s(N,b) (seed 001, eq. 1)",
            reproduces="sections 5.2.1 and 6.1, eq. (1), Fig. 6",
            summary="measured speed-up s(N,b) for N = 1, 2, 4 and two per-node batch sizes",
            quick="~1 min (b = 32, 8)", full="~1.5 min (b = 64, 16; 10 steps)"),

    # seed 002: hybrid pipeline x data parallelism, asynchronous schedules
    Listing("seed002-hybrid", "seed002",
            title="Bottlenecks of hybrid pipeline x data-parallel training (PipeDream)",
            reproduces="section 4.2's timeline analysis and Table 4 (impl-SA / impl-SRA)",
            summary="time per step and its split over phases for DP, a 4-stage pipeline, 3+1 and 2x2 "
                    "hybrids, with each communication-thread strategy",
            quick="~3 min (3 repeats x 2 models x 13 runs of 10 steps)",
            full="~8 min (5 repeats x 2 models x 13 runs of 16 steps)"),
    Listing("seed002-async", "seed002",
            title="Asynchronous and zero-bubble pipeline schedules: PipeDream, 2BW, ZB-H1, ZB-H2, ZB-V vs "
                  "GPipe and 1F1B",
            reproduces="section 7, the related schedules (PipeDream, PipeDream-2BW, GPipe)",
            summary="samples/s, accuracy at the same epochs, time to accuracy, where the step goes "
                    "(bubble, extra compute) and weight memory of GPipe, 1F1B-flush, ZB-H1, ZB-H2, ZB-V, "
                    "PipeDream and 2BW",
            quick="~1.5 min (9 runs x 1 seed x 4 epochs, MNIST-1D)",
            full="~12 min (9 runs x 3 seeds x 10 epochs, MNIST-1D)"),

    # seed 003: the basic strategies and their pitfalls
    Listing("seed003-largebatch", "seed003",
            title="Large batches: linear scaling with warm-up, batch growth vs rate decay",
            reproduces="the large-batch problem (Goyal et al. 2017; Smith et al. 2018)",
            summary="accuracy and time to accuracy vs global batch, unscaled and with linear scaling + "
                    "warm-up; step decay vs batch growth with their noise scale",
            quick="~1 min (10 runs x 1 seed x 8 epochs, MNIST-1D, 2 ranks)",
            full="~3 min (14 runs x 3 seeds x 10 epochs)"),
    Listing("seed003-ps", "seed003",
            title="Parameter server vs all-reduce: sync, async, SSP, N+b and stragglers",
            reproduces="synchronous vs asynchronous updates, parameter server vs peer-to-peer, staleness "
                       "and N+b workers",
            summary="time per epoch, time to accuracy, final accuracy, bytes and staleness of all-reduce, "
                    "sync PS (S = 1 and S = W), async, SSP and N+b, without / with a persistent / with "
                    "random stragglers; sync PS vs all-reduce time per step",
            quick="~5 min (19 runs x 1 seed x 3 epochs, MNIST-1D)",
            full="~25 min (25 runs x 3 seeds x 10 epochs, MNIST-1D)"),
    Listing("seed003-tp", "seed003",
            title="Wire formats inside a layer: tensor-parallel activations and gradients",
            reproduces="the split within a layer and by channel, with seed 000's question of what an "
                       "approximate transfer costs asked there",
            summary="tp = 2 on gpt-tiny and a channel-split CNN: accuracy of bf16, fp8, 8- and 4-bit "
                    "bit-fields and Table-4 on the forward or backward tp wire, with and without error "
                    "feedback, vs the same formats on a pipeline cut; step time at 100 Mbit/s",
            quick="~3 min (2 tasks x 17 runs x 1 seed, + 6 link runs)",
            full="~2 h (2 tasks x 32 runs x 3 seeds, + 6 link runs)"),

    # seed 004: adaptive communication precision
    Listing("seed004-adaprec", "seed004",
            title="AdaPrec and seed 004's precision policies for data-parallel gradients",
            reproduces="its CaffeNet results (float, fp8, Table-N, Fastest, the benchmark rule, AdaPrec)",
            summary="final accuracy and wall time of float, fp8, Table-1, Table-4, Fastest, the seed004 "
                    "rule and AdaPrec (with a poison candidate), 4 ranks, slow link",
            quick="~2 min (8 runs x 1 seed x 4 epochs, MNIST-1D, 4 ranks)",
            full="~15 min (8 runs x 3 seeds x 12 epochs)"),
    Listing("compressors", "seed004",
            title="Gradient compressors against fp32, bf16 and 4 bits: time to accuracy",
            reproduces="the gradient compressors the field compares against, beside its low-precision "
                       "gradient wires (not a figure of the study)",
            summary="PowerSGD, top-k, random-k, QSGD, TernGrad, sign+ef, signSGD vs fp32, bf16 and 4 bits "
                    "+ EF: time to accuracy at 100 Mbit/s and 1 Gbit/s, MNIST-1D and gpt-tiny, 2 ranks; "
                    "each paper's claim with a verdict",
            quick="~5 min (2 tasks x 2 links x 10 wires, 1 seed)",
            full="~35 min (2 tasks x 2 links x 10 wires x 3 seeds, 12 and 4 epochs)"),
)


def listing(name: str) -> Listing:
    """The entry of preset `name`; `ConfigError` listing the valid names otherwise."""
    for entry in CATALOG:
        if entry.name == name:
            return entry
    raise ConfigError(unknown_name("experiment", name, names()))


def names() -> list[str]:
    """Every preset's name, sorted."""
    return sorted(entry.name for entry in CATALOG)
