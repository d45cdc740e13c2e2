"""Seed 002's timeline vocabulary: the phase names every rank records, and their classes.

Seed 002 (PipeDream bottleneck study) analyses each process's timeline in the phases
receive_for, run_for, send_for, receive_back, run_back, _sync and send_back. approxdist
uses the same names (gradient sync is `sync`) and adds codec work, the optimiser step,
data loading and explicit waits. Each phase belongs to one *class* that the bottleneck
analysis (`approxdist.analysis.bottleneck`) uses:

* `compute`: work of the rank itself (forward, backward, optimiser step, data loading);
* `comm`: communication work (codec encode/decode, posting sends and receives, the
  gradient all-reduce);
* `wait`: blocked on a peer or on a transfer;
* `step`: a container marking one training step (the analysis window);
* `transfer`: a completed link transfer reported by the link layer (bytes in args);
* `other`: anything else (neutral: counts as idle).

A span opened with an unknown name gets class `other` unless `cat=` names a class.
"""

from __future__ import annotations

RECEIVE_FOR = "receive_for"
RUN_FOR = "run_for"
SEND_FOR = "send_for"
RECEIVE_BACK = "receive_back"
RUN_BACK = "run_back"
SEND_BACK = "send_back"
SYNC = "sync"
ENCODE = "encode"
DECODE = "decode"
OPTIMIZER = "optimizer"
WAIT = "wait"
DATA = "data"
STEP = "step"

COMPUTE, COMM, WAITING, STEP_CLASS, TRANSFER, OTHER = (
    "compute", "comm", "wait", "step", "transfer", "other")
CLASSES = (COMPUTE, COMM, WAITING, STEP_CLASS, TRANSFER, OTHER)

#: the class of each phase of the vocabulary
PHASE_CLASS: dict[str, str] = {
    RUN_FOR: COMPUTE, RUN_BACK: COMPUTE, OPTIMIZER: COMPUTE, DATA: COMPUTE,
    RECEIVE_FOR: COMM, SEND_FOR: COMM, RECEIVE_BACK: COMM, SEND_BACK: COMM,
    SYNC: COMM, ENCODE: COMM, DECODE: COMM,
    WAIT: WAITING,
    STEP: STEP_CLASS,
}
PHASES = tuple(PHASE_CLASS)

#: colours of the timeline chart, one per phase (and per class as fallback)
PHASE_COLOURS: dict[str, str] = {
    RUN_FOR: "#4c78a8", RUN_BACK: "#1f3f73", OPTIMIZER: "#9467bd", DATA: "#8c8c8c",
    RECEIVE_FOR: "#f2a541", SEND_FOR: "#e45756", RECEIVE_BACK: "#f7c873",
    SEND_BACK: "#b22c2c", SYNC: "#54a24b", ENCODE: "#eeca3b", DECODE: "#d6a10f",
    WAIT: "#d9d9d9",
}
CLASS_COLOURS: dict[str, str] = {
    COMPUTE: "#4c78a8", COMM: "#e45756", WAITING: "#d9d9d9", TRANSFER: "#72b7b2",
    OTHER: "#bab0ac",
}


def phase_class(name: str, cat: str | None = None) -> str:
    """The class of a span: `cat` when it is a class name, else the phase's, else `other`."""
    if cat in CLASSES:
        return cat
    return PHASE_CLASS.get(name, OTHER)
