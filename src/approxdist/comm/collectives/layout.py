"""Pure planning of all-gather, reduce-scatter and broadcast: who sends what to whom, in pieces.

Members are indices 0..n-1 of the group. Nothing here communicates; the algorithm
modules (`allgather_ring.py`, ...) perform what these functions describe, and the tests
replay a lossy reduce-scatter in one process from the same orders (`ring_sum_order`,
`direct_sum_order`).

* **Blocks and chunks**: an all-gather's member i contributes block i of the result; a
  reduce-scatter's input of n*k values is cut into chunks [i k, (i+1) k), chunk i
  summed at member i.
* **Segments**: a message of `numel` fp32 values moves in `segment_count` pieces of
  about `segment_bytes` fp32 bytes; encoded bytes (a payload forwarded as is) are cut
  into the same number of byte ranges, so both ends know every piece's size.
* **Ring**: member r sends to r+1 and receives from r-1 (mod n), n-1 steps.
* **Direct**: member r sends to r+1, r+2, ... and receives from r-1, r-2, ... in one step.
* **Tree**: a binomial tree rooted at the broadcast's root (BRB's tree, `brb.py`, on the
  members renumbered from the root).
"""

from __future__ import annotations

from approxdist.comm.collectives.base import bounds, segment_count
from approxdist.comm.collectives.brb import children, parent


def value_segments(numel: int, segment_bytes: int) -> list[tuple[int, int]]:
    """The value ranges a message of `numel` fp32 values moves in (`Wire.segments`' cut);
    a lossy codec encodes each range on its own."""
    return bounds(numel, segment_count(numel, segment_bytes))


def byte_segments(nbytes: int, numel: int, segment_bytes: int) -> list[tuple[int, int]]:
    """The byte ranges of a message of `nbytes` bytes carrying `numel` values: as many
    near-equal ranges as `segment_count` gives, empty ones dropped."""
    return [(a, b) for a, b in bounds(nbytes, segment_count(numel, segment_bytes)) if b > a]


def ring_gather_order(rank: int, n: int) -> list[int]:
    """Blocks member `rank` receives in the ring all-gather's steps 0..n-2 (from `rank`-1);
    in step s it sends the block it received in step s-1 (its own in step 0)."""
    return [(rank - s - 1) % n for s in range(n - 1)]


def ring_scatter_order(rank: int, n: int) -> list[int]:
    """Chunks whose partial sums member `rank` receives (and adds its own values to) in the
    ring reduce-scatter's steps 0..n-2; it sends its own chunk `rank`-1 in step 0 and in
    step s+1 what it added in step s. The last one is chunk `rank`: its result."""
    return [(rank - s - 2) % n for s in range(n - 1)]


def ring_sum_order(chunk: int, n: int) -> list[int]:
    """Members whose values make chunk `chunk`'s ring reduce-scatter, in the order added:
    chunk+1 starts it, each next member adds its own to the received partial sum, and
    member `chunk` adds last. n-1 partial sums cross the wire (each encoded once)."""
    return [(chunk + 1 + i) % n for i in range(n)]


def direct_peers(rank: int, n: int) -> tuple[list[int], list[int]]:
    """(members `rank` sends to, members it receives from), in posting order: its k-th send
    goes to rank+k, and its k-th receive comes from rank-k, whose k-th send it is."""
    return [(rank + k) % n for k in range(1, n)], [(rank - k) % n for k in range(1, n)]


def direct_sum_order(rank: int, n: int) -> list[int]:
    """Members whose values make chunk `rank`'s direct reduce-scatter, in the order added:
    its own (never encoded), then each received one (encoded once)."""
    return [rank] + direct_peers(rank, n)[1]


def tree(rank: int, root: int, n: int) -> tuple[int | None, list[int]]:
    """(parent, children) of member `rank` in the binomial tree rooted at member `root`;
    children farthest first (the largest subtree gets each piece first)."""
    virtual = (rank - root) % n
    up = parent(virtual)
    kids = [(c + root) % n for c in reversed(children(virtual, n))]
    return (None if up is None else (up + root) % n), kids
