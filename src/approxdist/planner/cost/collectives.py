"""All-reduce time of each of our algorithms in alpha-beta-gamma terms (Thakur et al. 2005).

Thakur, Rabenseifner and Gropp (IJHPCA 2005) cost a collective as the sum, over the steps
on its critical path, of alpha per message, beta per byte sent and gamma per byte added.
`allreduce_steps` lists those steps for our implementations (comm/collectives), counted as
the code moves them, for N ranks and n fp32 values:

| algorithm | steps (each: messages, wire bytes, fp32 bytes added) |
|---|---|
| ring | N-1 reduce-scatter steps of one chunk c = ceil(n/N), each added; N-1 all-gather steps of c |
| brb | ceil(log2 N) steps up the binomial tree (whole vector, added), as many down |
| brd | log2 p exchanges of the whole vector, each added (p: largest power of two <= N) |
| vhd | log2 p halving steps of n/2, n/4, ... n/p (added), log2 p gathering steps of n/p ... n/2 |
| native | gloo's ring: 2 (N-1) messages of c (fp32, fp16 or bf16 values), N-1 added |

brd and vhd fold a world that is not a power of two (`fold.py`): one step before the
core (the odd rank's vector, added) and one after (the result, one message). A step's
message is cut in segments as `Wire.segments` cuts it (the algorithm's `segment_bytes`:
4 MiB for ring, 1 MiB otherwise, unless given): each segment is one message paying alpha,
and with a codec each carries its own header (`CodecCost.wire_bytes`). Chunks and blocks
are `bounds` of the vector; a step costs its largest piece. With a lossy codec each step
also encodes what it sends and decodes what it adds or lands, plus the owner's one
`share` (encode, and decode of its own copy when the codec is lossy); the raw fp32 path
codes nothing. Then, on a `LinkLevel` with `ranks` busy ranks,

    T = load(ranks) x sum over steps (alpha m + beta w + gamma a + e E + d D)

(m messages, w wire bytes, a fp32 bytes added, E / D fp32 bytes encoded / decoded, e / d
the codec's seconds per byte). Pipelining of segments across steps is not credited: this
is the un-overlapped critical path of the textbook formulas, e.g. ring with N | n:
2 (N-1) alpha + 2 (N-1)/N n beta + (N-1)/N n gamma. `auto` is the fastest of our
algorithms (`native` only for exact fp32, as `Auto` decides).
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.comm.collectives.auto import MODEL_CANDIDATES
from approxdist.comm.collectives.base import bounds, ceil_log2, largest_power_of_two
from approxdist.comm.collectives.registry import ALGORITHMS
from approxdist.errors import ConfigError
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.links import LinkLevel

#: bytes per value of what `native` sums for each cast it takes (`native.CASTS`)
NATIVE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
FP32 = CodecCost.of("fp32")


@dataclass(frozen=True)
class Step:
    """One step on the critical path: messages, wire bytes, fp32 bytes added, coded."""

    messages: int = 0
    wire_bytes: int = 0
    reduce_bytes: int = 0
    encode_bytes: int = 0
    decode_bytes: int = 0

    def time(self, level: LinkLevel, codec: CodecCost) -> float:
        """The step's CPU work (stretched by shared cores' load by the caller)."""
        return (self.messages * level.alpha_s + self.wire_bytes * level.beta_s_per_byte
                + self.reduce_bytes * level.gamma_s_per_byte + codec.encode_s(self.encode_bytes)
                + codec.decode_s(self.decode_bytes))

    def link_time(self, level: LinkLevel) -> float:
        """The step's wait on an emulated link (not stretched by load)."""
        return self.messages * level.link_alpha_s + self.wire_bytes * level.link_beta_s_per_byte


def total(steps: list[Step]) -> Step:
    """The sums of every term over `steps`."""
    return Step(*(sum(getattr(s, k) for s in steps) for k in
                  ("messages", "wire_bytes", "reduce_bytes", "encode_bytes", "decode_bytes")))


def segment_sizes(values: int, segment_bytes: int) -> list[int]:
    """Values per segment of a `values`-long message, as `Wire.segments` cuts it."""
    if values <= 0:
        return []
    parts = max(1, -(-values * 4 // segment_bytes))
    return [b - a for a, b in bounds(values, parts)]


class _Counter:
    """Builds the steps of one algorithm for one codec and segment size."""

    def __init__(self, codec: CodecCost, segment_bytes: int) -> None:
        self.codec, self.segment_bytes = codec, segment_bytes
        self.coded = 0 if codec.raw else 4  # fp32 bytes coded per value
        self.self_decode = 0 if codec.lossless else self.coded  # `share` lands its own copy

    def send(self, values: int, *, add: bool, segmented: bool = True, encode: bool = True,
             extra_encode: int = 0, extra_decode: int = 0) -> Step:
        """A step sending `values` values (segmented or one message), received and either
        added or landed; `extra_*`: values a `share` codes in this step."""
        sizes = segment_sizes(values, self.segment_bytes) if segmented else \
            ([values] if values > 0 else [])
        return Step(len(sizes), sum(self.codec.wire_bytes(v) for v in sizes),
                    4 * values if add else 0,
                    self.coded * ((values if encode else 0) + extra_encode),
                    self.coded * values + self.self_decode * extra_decode)


def _ring(n: int, world: int, c: _Counter) -> list[Step]:
    chunk = -(-n // world)
    scatter = [c.send(chunk, add=True) for _ in range(world - 1)]
    # the owner shares its reduced chunk once; the all-gather forwards bytes unchanged
    gather = [c.send(chunk, add=False, encode=False, extra_encode=chunk if i == 0 else 0,
                     extra_decode=chunk if i == 0 else 0) for i in range(world - 1)]
    return scatter + gather


def _brb(n: int, world: int, c: _Counter) -> list[Step]:
    depth = ceil_log2(world)
    up = [c.send(n, add=True, segmented=False) for _ in range(depth)]
    down = [c.send(n, add=False, segmented=False, encode=False, extra_encode=n if i == 0 else 0,
                   extra_decode=n if i == 0 else 0) for i in range(depth)]
    return up + down


def _brd_core(n: int, p: int, c: _Counter) -> list[Step]:
    # both partners `share` each segment they send (encode, land their own copy), then add
    return [c.send(n, add=True, extra_decode=n) for _ in range(p.bit_length() - 1)]


def _vhd_core(n: int, p: int, c: _Counter) -> list[Step]:
    blocks = bounds(n, p)
    steps = []
    for j in range(p.bit_length() - 1):  # halving: send m = p / 2^(j+1) blocks, add as many
        steps.append(c.send(_largest_span(blocks, p >> (j + 1)), add=True))
    own = max(b - a for a, b in blocks)
    for j in range(p.bit_length() - 1):  # doubling: 2^j blocks' payloads in one message
        m = 1 << j
        groups = [blocks[i:i + m] for i in range(0, p, m)]
        values = max(sum(b - a for a, b in g) for g in groups)
        wire = max(_wire(c, g) for g in groups)
        steps.append(Step(1 if wire else 0, wire, 0, c.coded * (own if j == 0 else 0),
                          c.coded * values + c.self_decode * (own if j == 0 else 0)))
    return steps


def _wire(c: _Counter, blocks: list[tuple[int, int]]) -> int:
    """Wire bytes of blocks sent together: their values raw, else one payload per block."""
    if c.codec.raw:
        return 4 * sum(b - a for a, b in blocks)
    return sum(c.codec.wire_bytes(b - a) for a, b in blocks)


def _largest_span(blocks: list[tuple[int, int]], m: int) -> int:
    return max(blocks[i + m - 1][1] - blocks[i][0] for i in range(0, len(blocks), m))


def _folded(core: list[Step], n: int, world: int, c: _Counter) -> list[Step]:
    if world == largest_power_of_two(world):
        return core
    fold_in = c.send(n, add=True)  # the odd rank's vector, added by its even partner
    fold_out = c.send(n, add=False, segmented=False, encode=False, extra_encode=n,
                      extra_decode=n)  # the core rank shares its result with its partner
    return [fold_in, *core, fold_out]


def _native(n: int, world: int, codec: CodecCost) -> list[Step]:
    if codec.spec not in NATIVE_BYTES:
        raise ConfigError(f"all-reduce 'native' sums only {', '.join(NATIVE_BYTES)}, not codec "
                          f"{codec.spec!r}; price ring, brb, brd, vhd or auto instead")
    chunk = -(-n // world)
    nbytes = NATIVE_BYTES[codec.spec] * chunk
    return [Step(1, nbytes, 4 * chunk if i < world - 1 else 0) for i in range(2 * (world - 1))]


def allreduce_steps(algorithm: str, world: int, values: int, codec: CodecCost = FP32,
                    segment_bytes: int | None = None) -> list[Step]:
    """The critical-path steps of one all-reduce of `values` fp32 values on `world` ranks."""
    _check(algorithm, world, values)
    if algorithm == "auto":
        raise ConfigError("'auto' has no steps of its own; price it with allreduce_time, "
                          "which takes the fastest algorithm")
    if world == 1 or values == 0:
        return []
    if algorithm == "native":
        return _native(values, world, codec)
    seg = segment_bytes if segment_bytes is not None else ALGORITHMS.get(algorithm).segment_bytes
    if seg < 4:
        raise ConfigError(f"segment_bytes = {seg} must be >= 4 (one fp32 value)")
    c = _Counter(codec, seg)
    p = largest_power_of_two(world)
    if algorithm == "ring":
        return _ring(values, world, c)
    if algorithm == "brb":
        return _brb(values, world, c)
    core = _brd_core(values, p, c) if algorithm == "brd" else _vhd_core(values, p, c)
    return _folded(core, values, world, c)


def allreduce_time(level: LinkLevel, algorithm: str, world: int, values: int,
                   codec: CodecCost = FP32, segment_bytes: int | None = None,
                   busy: int | None = None) -> float:
    """Seconds of one all-reduce on `level` (`busy` ranks share loopback cores; default
    `world`); `auto` is the fastest candidate (`fastest`)."""
    if algorithm == "auto":
        return fastest(level, world, values, codec, segment_bytes, busy)[1]
    steps = allreduce_steps(algorithm, world, values, codec, segment_bytes)
    return (level.load(world if busy is None else busy) * sum(s.time(level, codec) for s in steps)
            + sum(s.link_time(level) for s in steps))


def fastest(level: LinkLevel, world: int, values: int, codec: CodecCost = FP32,
            segment_bytes: int | None = None, busy: int | None = None) -> tuple[str, float]:
    """(name, seconds) of the fastest of auto's candidates; ties go to the first listed."""
    names = list(MODEL_CANDIDATES) + (["native"] if codec.raw else [])
    times = [(allreduce_time(level, a, world, values, codec, segment_bytes, busy), i, a)
             for i, a in enumerate(names)]
    t, _, name = min(times)
    return name, t


def _check(algorithm: str, world: int, values: int) -> None:
    ALGORITHMS.get(algorithm)  # SpecError listing the valid names
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ConfigError(f"all-reduce world = {world!r} must be an integer >= 1 (ranks)")
    if isinstance(values, bool) or not isinstance(values, int) or values < 0:
        raise ConfigError(f"all-reduce values = {values!r} must be an integer >= 0 "
                          f"(fp32 values, bytes / 4)")
