"""Parameter server's pure parts: byte-balanced sharding, mode strings, the server rules
(sync, async, SSP bound, N+b drops) with scripted arrivals, the push order a step logs,
roles, and bad input."""

from __future__ import annotations

import math

import pytest

from approxdist.api.param_server_args import wire_formats
from approxdist.config.loader import build_config
from approxdist.errors import ConfigError
from approxdist.param_server import Roles, ServerRules, parse_mode, shard_by_bytes
from approxdist.param_server.node import check_backend
from approxdist.param_server.sharding import shard_bytes
from approxdist.param_server.steplog import StepLog
from approxdist.train.check import check_parts


def test_sharding_covers_every_tensor_once_and_balances_bytes() -> None:
    sizes = [4000, 40, 3000, 30, 2000, 20, 1000, 10]
    shards = shard_by_bytes(sizes, 3)
    assert sorted(i for s in shards for i in s) == list(range(len(sizes)))
    loads = shard_bytes(sizes, shards)
    assert max(loads) - min(loads) <= max(sizes) - min(sizes)
    assert loads == [4000, 3030, 3070] or max(loads) <= 4000  # LPT: nothing worse than a greedy
    assert shard_by_bytes(sizes, 1) == (tuple(range(len(sizes))),)
    assert shard_by_bytes([8, 8], 2) == ((0,), (1,))


def test_sharding_rejects_more_servers_than_tensors() -> None:
    with pytest.raises(ConfigError, match=r"--servers 3.*only 2 parameter.*--servers 2"):
        shard_by_bytes([4, 4], 3)


@pytest.mark.parametrize("text,kind,bound,backup", [
    ("sync", "sync", 0.0, 0), ("async", "async", math.inf, 0), ("ssp:2", "ssp", 2.0, 0),
    ("ssp:0", "ssp", 0.0, 0), ("backup:1", "backup", 0.0, 1)])
def test_modes_parse(text: str, kind: str, bound: float, backup: int) -> None:
    mode = parse_mode(text, workers=3)
    assert (mode.kind, mode.bound, mode.backup, mode.spec) == (kind, bound, backup, text)
    assert mode.any_source == (kind != "sync")


@pytest.mark.parametrize("text,match", [
    ("fast", "not one of: sync, async"), ("ssp:-1", "not one of"), ("ssp:x", "not one of"),
    ("backup:3", "b = 3 backup workers.*use b <= 2"), ("backup:0", "not one of"),
    ("sync:1", "not one of")])
def test_bad_modes_name_the_value(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_mode(text, workers=3)


def test_sync_averages_one_gradient_per_worker_with_no_staleness() -> None:
    rules = ServerRules(parse_mode("sync", 3), 3)
    rules.begin_step()
    assert rules.arrive(0, 0).apply == () and rules.arrive(1, 0).apply == ()
    v = rules.arrive(2, 0)
    assert (v.apply, v.replies, v.staleness) == ((0, 1, 2), (0, 1, 2), (0, 0, 0))
    assert rules.step_done(100) and rules.version == 1


def test_async_applies_each_gradient_on_arrival_and_counts_staleness() -> None:
    rules = ServerRules(parse_mode("async", 2), 2)
    rules.begin_step()
    a = rules.arrive(0, 0)
    b = rules.arrive(1, 0)  # read version 0, one update since
    assert (a.apply, a.staleness, a.replies) == ((0,), (0,), (0,))
    assert (b.apply, b.staleness, b.replies) == ((1,), (1,), (1,))
    assert rules.step_done(100) and rules.version == 2


def _simulate(mode: str, workers: int, speeds: list[int], pushes: int) -> list[tuple[int, int]]:
    """Play a server against workers that each take `speeds[w]` ticks per step; the
    (lead, staleness) of every arrival."""
    rules = ServerRules(parse_mode(mode, workers), workers)
    ready = {w: speeds[w] for w in range(workers)}  # tick at which each worker pushes
    read = dict.fromkeys(range(workers), 0)
    done = dict.fromkeys(range(workers), 0)
    out, tick = [], 0
    while any(done[w] < pushes for w in range(workers)):
        tick += 1
        for w in sorted(ready):
            if ready[w] != tick:
                continue
            del ready[w]
            v = rules.arrive(w, read[w])
            done[w] += 1
            out.extend((v.lead, s) for s in v.staleness)
            for r in v.replies:
                read[r] = rules.version
                if done[r] < pushes:
                    ready[r] = tick + speeds[r]
    return out


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_keeps_every_worker_within_s_steps_of_the_slowest(bound: int) -> None:
    seen = _simulate(f"ssp:{bound}", 3, [1, 2, 7], pushes=20)
    assert len(seen) == 60
    assert max(lead for lead, _ in seen) == bound  # reached, never exceeded


def test_async_lets_a_fast_worker_run_ahead() -> None:
    seen = _simulate("async", 3, [1, 2, 7], pushes=20)
    assert max(lead for lead, _ in seen) > 3


def test_backup_uses_the_first_n_fresh_gradients_and_drops_late_ones() -> None:
    rules = ServerRules(parse_mode("backup:1", 3), 3)
    rules.begin_step()
    assert rules.arrive(2, 0).apply == ()
    v = rules.arrive(0, 0)
    assert (v.apply, v.replies, v.staleness) == ((0, 2), (0, 2), (0, 0)) and rules.step_done(100)
    rules.begin_step()
    late = rules.arrive(1, 0)  # computed on version 0, the server is at 1
    assert (late.keep, late.replies, late.apply) == (False, (1,), ())
    assert rules.dropped == 1 and not rules.step_done(100)
    assert rules.owed(steps=2) == 3


def test_backup_owes_one_push_per_worker_behind_the_epochs_last_update() -> None:
    """A 2-step epoch of N+b (N = 2 of 3) where worker 2 is dropped once and skips ahead."""
    rules = ServerRules(parse_mode("backup:1", 3), 3)
    rules.begin_step()
    rules.arrive(0, 0)
    rules.arrive(1, 0)  # update 1: workers 0 and 1 get version 1
    assert rules.owed(steps=2) == 3
    rules.begin_step()
    rules.arrive(0, 1)
    rules.arrive(1, 1)  # update 2 ends the epoch for workers 0 and 1
    assert rules.owed(steps=2) == 1  # worker 2 still pushes its step-0 gradient
    late = rules.arrive(2, 0)
    assert not late.keep and late.replies == (2,) and rules.replied == [2, 2, 2]
    assert rules.owed(steps=2) == 0  # worker 2 got version 2: it skips step 1
    rules.end_epoch()
    assert (rules.base, rules.owed(steps=2), rules.clocks) == (2, 3, [2, 2, 1])


def _feed(rules: ServerRules, log: StepLog, arrivals: list[tuple[int, int]]) -> None:
    for worker, read in arrivals:
        verdict = rules.arrive(worker, read)
        log.arrived(worker, read, verdict)
        if verdict.apply:
            log.updated(verdict)


def test_the_step_log_keeps_each_push_with_the_versions_read_and_applied_to() -> None:
    """N+b (N = 2 of 3: worker 2 kept until worker 0 comes, worker 1 late) and async: the
    order a replay follows, [worker, read, applied to], None for a dropped gradient."""
    rules, log = ServerRules(parse_mode("backup:1", 3), 3), StepLog()
    rules.begin_step()
    _feed(rules, log, [(2, 0), (0, 0), (1, 0)])
    assert log.order == [[2, 0, 0], [0, 0, 0], [1, 0, None]] and not log.waiting
    record = log.record(rules.version)
    assert (record["applied_from"], record["dropped_from"], record["staleness"]) == \
        ([0, 2], [1], [0, 0])
    rules, log = ServerRules(parse_mode("async", 2), 2), StepLog()
    rules.begin_step()
    _feed(rules, log, [(0, 0), (1, 0), (0, 1), (1, 2)])
    assert log.order == [[0, 0, 0], [1, 0, 1], [0, 1, 2], [1, 2, 3]]
    assert log.record(rules.version)["order"] == log.order and log.staleness == [0, 1, 1, 1]


def test_roles_and_their_errors() -> None:
    roles = Roles(2, 3)
    assert roles.world_size == 5 and roles.worker_rank(0) == 2 and roles.is_server(1)
    assert roles.describe(3) == "worker 1 (rank 3)" and roles.describe(0) == "server 0 (rank 0)"
    with pytest.raises(ConfigError, match="--servers 0 must be >= 1"):
        Roles(0, 2)
    with pytest.raises(ConfigError, match="--workers 0 must be >= 1"):
        Roles(1, 0)


def test_roles_on_named_ranks() -> None:
    """approxdist.ParameterServer(servers=[3], workers=[0, 2]): servers, then workers."""
    roles = Roles(1, 2, (3, 0, 2))
    assert [roles.server_rank(0), roles.worker_rank(0), roles.worker_rank(1)] == [3, 0, 2]
    assert [roles.is_server(r) for r in (0, 2, 3)] == [False, False, True]
    assert [roles.index(r) for r in (3, 0, 2)] == [0, 0, 1]
    assert roles.describe(2) == "worker 1 (rank 2)" and roles.describe(3) == "server 0 (rank 3)"


def test_the_api_s_messages_name_its_arguments() -> None:
    with pytest.raises(ConfigError, match=r"^mode='later' is not one of: sync, async"):
        parse_mode("later", 2, name="mode")
    with pytest.raises(ConfigError, match=r"^mode='backup:1': b = 1 .* \(add workers\)$"):
        parse_mode("backup:1", 1, name="mode")
    with pytest.raises(ConfigError, match=r"^servers=3: the model has only 2 parameter "
                                          r"tensor\(s\) to shard; use servers=2 or fewer$"):
        shard_by_bytes([4, 4], 3, name="servers")
    with pytest.raises(ConfigError, match=r"^mode='async' has the server .* NCCL cannot; use a "
                                          r"CPU model on a gloo process group, or mode='sync'$"):
        check_backend("async", True, "nccl", name="mode")


def _ps(servers: int = 1, workers: int = 2, wire: dict[str, object] | None = None,
        **ps: object) -> dict[str, dict[str, object]]:
    return {"train": {"parallel": "ps", "world_size": servers + workers},
            "data": {"batch_size": 24}, "ps": {"servers": servers, "workers": workers, **ps},
            "wire": wire or {}}


def test_config_errors_name_the_value_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"world_size = 4 but --servers 1 \+ --workers 2 make 3"):
        check_parts(build_config({**_ps(), "train": {"parallel": "ps", "world_size": 4}}))
    with pytest.raises(ConfigError, match="ps.workers = 0 must be >= 1"):
        build_config(_ps(workers=0))
    with pytest.raises(ConfigError, match="divisible by the number of workers"):
        check_parts(build_config({**_ps(workers=5), "data": {"batch_size": 24}}))
    with pytest.raises(ConfigError, match="--ps-mode 'later'"):
        check_parts(build_config(_ps(mode="later")))
    with pytest.raises(ConfigError, match="wire.pull.codec = 'fp5'"):
        check_parts(build_config(_ps(wire={"pull": {"codec": "fp5"}})))
    check_parts(build_config(_ps(mode="backup:1", wire={"push": {"codec": "bf16"}})))


def test_push_compressors_are_checked_in_one_line() -> None:
    check_parts(build_config(_ps(mode="async", wire={"push": {"codec": "signsgd"}})))
    with pytest.raises(ConfigError, match=r"^wire.push.codec = 'powersgd:2': PowerSGD needs a "
                                          r"second round trip each step .* \(--parallel dp\)$"):
        check_parts(build_config(_ps(wire={"push": {"codec": "powersgd:2"}})))
    with pytest.raises(ConfigError, match=r"^push_codec='powersgd:1': PowerSGD needs"):
        wire_formats("powersgd:1", "fp32", "", "")
    with pytest.raises(ConfigError, match=r"^push_codec='qsgd:4': a compressor with a push "
                                          r"channel.*drop the channel"):
        wire_formats("qsgd:4", "fp32", "ber:1e-3@5", "")
    with pytest.raises(ConfigError, match=r"^push_codec='topk:2': topk ratio '2'"):
        wire_formats("topk:2", "fp32", "", "")
    with pytest.raises(ConfigError, match=r"^push_codec='fp33': unknown codec spec"):
        wire_formats("fp33", "fp32", "", "")
    formats = wire_formats("TopK:0.01", "bf16", "", "")
    assert (formats.compressor, formats.push_spec, formats.pull.spec) == \
        ("topk:0.01", "topk:0.01", "bf16")
    assert wire_formats("bf16", "fp32", "", "").push_spec == "bf16"


def test_any_source_modes_are_refused_on_nccl() -> None:
    with pytest.raises(ConfigError, match="--ps-mode async.*NCCL cannot.*--device cpu"):
        check_backend("async", True, "nccl")
    check_backend("sync", False, "nccl")
    check_backend("async", True, "gloo")


def test_ssp_releases_the_held_workers_when_the_slowest_dies() -> None:
    rules = ServerRules(parse_mode("ssp:1", 3), 3)
    rules.begin_step()
    assert rules.arrive(0, 0).replies == (0,)
    assert rules.arrive(1, 1).replies == (1,)
    assert rules.arrive(0, 2).replies == ()  # 2 pushes ahead of worker 2: held
    assert rules.held == [0]
    assert rules.lose(2) == (0,)  # the slowest was the dead one: worker 0 may go on
    assert rules.live == [0, 1] and not rules.short and not rules.held
    assert rules.arrive(1, 3).lead == 0  # the lead now counts from the live workers only


def test_a_lost_worker_owes_nothing_and_ends_the_step_early() -> None:
    rules = ServerRules(parse_mode("async", 2), 2)
    rules.begin_step()
    for _ in range(3):  # worker 0 pushes its 3 steps; worker 1 pushes once, then dies
        rules.arrive(0, rules.version)
    rules.arrive(1, rules.version)
    assert rules.owed(steps=3) == 2 and rules.step_done(3)  # this step had its 2 pushes
    assert not rules.owes(0, steps=3) and rules.owes(1, steps=3)
    rules.begin_step()
    assert not rules.step_done(3)
    rules.lose(1)
    assert rules.owed(steps=3) == 0 and rules.step_done(3)  # nothing more is coming
    assert not rules.owes(1, steps=3)
    rules.end_epoch()
    assert rules.owed(steps=3) == 3  # the next epoch expects worker 0's steps only


def test_backup_keeps_n_and_is_short_below_it() -> None:
    rules = ServerRules(parse_mode("backup:1", 3), 3)  # N = 2
    rules.lose(2)
    assert rules.needed == 2 and not rules.short
    rules.begin_step()
    rules.arrive(0, 0)
    v = rules.arrive(1, 0)
    assert v.apply == (0, 1) and rules.step_done(5)
    assert rules.owed(steps=1) == 0  # the dead worker owes no push
    rules.lose(1)
    assert rules.short  # one worker left, each update needs 2


def test_async_is_short_only_without_workers() -> None:
    rules = ServerRules(parse_mode("async", 2), 2)
    rules.lose(0)
    assert not rules.short
    rules.lose(1)
    assert rules.short and rules.live == []
