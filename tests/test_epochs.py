"""The epoch coordinator: memberships, orders, planned and unplanned changes, persistence."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.daemon.epochs import EpochCoordinator
from malletrain_core.errors import ValidationError
from malletrain_core.wire.orders import EpochError, Order


def seeded(seed: int = 1):
    rng = random.Random(seed)
    return lambda n: bytes(rng.getrandbits(8) for _ in range(n))


def coordinator(**kw) -> EpochCoordinator:
    kw.setdefault("random", seeded())
    return EpochCoordinator(**kw)


def run_all(co: EpochCoordinator, job: str, nodes, now: float) -> dict[str, Order]:
    """Every node checks in as running its order's epoch (after it started it)."""
    orders = {}
    for n in nodes:
        o = co.checkin(job, n, now, addr=f"10.0.0.{n[-1]}")
        if o.kind == "run":
            o2 = co.checkin(job, n, now, epoch=o.epoch, state="running", addr=f"10.0.0.{n[-1]}")
            assert o2.kind == "run" and o2.epoch == o.epoch
        orders[n] = o
    return orders


def start_two(co=None, now=0.0):
    co = co or coordinator()
    co.add_job("7", uid=1000, now=now)
    co.set_target("7", ["n1", "n2"], now)
    assert co.checkin("7", "n1", now, addr="10.0.0.1").kind == "wait"  # n2 not there yet
    orders = run_all(co, "7", ["n2", "n1"], now)
    return co, orders


def test_first_epoch_waits_for_every_target_node_then_runs():
    co, orders = start_two()
    ep = co.current("7")
    assert ep.number == 0 and ep.members == ("n1", "n2")
    assert {o.rank for o in orders.values()} == {0, 1}
    assert all(o.world == 2 and o.master == "10.0.0.1" and o.port == ep.port
               and o.rdzv_id == ep.rdzv_id for o in orders.values())


def test_first_epoch_starts_with_the_ready_nodes_after_the_join_timeout():
    co = coordinator(join_timeout_s=10)
    co.add_job("7", 1000, 0.0)
    co.set_target("7", ["n1", "n2"], 0.0)
    assert co.checkin("7", "n1", 5.0).kind == "wait"
    o = co.checkin("7", "n1", 10.0)
    assert o.kind == "run" and o.world == 1


def test_planned_shrink_checkpoints_first_then_starts_next_epoch():
    co, _ = start_two()
    co.set_target("7", ["n1"], 10.0)
    assert co.current("7").number == 0, "no restart before the checkpoint"
    assert co.draining("7") == {"n2"}
    o = co.checkin("7", "n1", 10.5, epoch=0, state="running")
    assert o.kind == "checkpoint" and o.request == 1 and o.epoch == 0
    # relayed: the launcher reports it and keeps running
    assert co.checkin("7", "n1", 11.0, epoch=0, state="running", ckpt_seen=1).kind == "run"
    co.acknowledge_checkpoint("7", epoch=1, now=11.5)  # wrong epoch: ignored
    assert co.current("7").number == 0
    co.acknowledge_checkpoint("7", epoch=0, now=12.0)
    ep = co.current("7")
    assert ep.number == 1 and ep.members == ("n1",)
    assert co.draining("7") == set()
    assert co.checkin("7", "n2", 12.5, epoch=0, state="running").kind == "stop"
    assert co.checkin("7", "n2", 13.0, state="idle").kind == "wait"
    stop = co.checkin("7", "n1", 12.5, epoch=0, state="running")
    assert stop.kind == "stop" and stop.epoch == 0
    run = co.checkin("7", "n1", 13.0, state="idle")
    assert (run.kind, run.epoch, run.rank, run.world) == ("run", 1, 0, 1)


def test_planned_change_goes_ahead_after_the_checkpoint_timeout():
    """No acknowledgement (rank 0 hung, or its report was lost): go ahead after the timeout."""
    co, _ = start_two(coordinator(checkpoint_timeout_s=30))
    co.set_target("7", ["n2"], 100.0)
    co.tick(129.0)
    assert co.current("7").number == 0
    co.tick(130.0)
    ep = co.current("7")
    assert ep.number == 1 and ep.members == ("n2",) and ep.master == "10.0.0.2"


def test_planned_grow_keeps_ranks_of_existing_members():
    co, _ = start_two()
    co.set_target("7", ["n1", "n2", "n3"], 20.0)
    assert co.checkin("7", "n3", 21.0, addr="10.0.0.3").kind == "wait"
    assert co.checkin("7", "n2", 21.0, epoch=0, state="running").kind == "run", "rank 1"
    assert co.checkin("7", "n1", 21.0, epoch=0, state="running").kind == "checkpoint"
    co.acknowledge_checkpoint("7", 0, 22.0)
    ep = co.current("7")
    assert ep.members == ("n1", "n2", "n3") and ep.number == 1
    assert co.checkin("7", "n3", 22.5).rank == 2


def test_target_restored_before_checkpoint_cancels_the_change():
    co, _ = start_two()
    co.set_target("7", ["n1"], 10.0)
    co.set_target("7", ["n1", "n2"], 11.0)
    assert co.checkin("7", "n1", 11.5, epoch=0, state="running").kind == "run"
    co.acknowledge_checkpoint("7", 0, 12.0)
    assert co.current("7").number == 0


def test_preemption_restarts_survivors_at_once():
    co, _ = start_two()
    co.set_target("7", ["n1"], 50.0, lost=["n2"])
    ep = co.current("7")
    assert ep.number == 1 and ep.members == ("n1",), "no checkpoint wait on a lost peer"
    assert co.checkin("7", "n1", 50.5, epoch=0, state="running").kind == "stop"
    assert co.checkin("7", "n1", 51.0).kind == "run"


def test_failed_worker_restarts_epoch_without_silent_launchers():
    co, _ = start_two(coordinator(failure_settle_s=5))
    co.checkin("7", "n1", 20.0, epoch=0, state="running")
    # n2's node died silently; n1's torchrun exits because its peer is gone
    o = co.checkin("7", "n1", 21.0, epoch=0, state="exited", rc=1)
    assert o.kind == "wait" and co.current("7").number == 0, "waits to learn who survived"
    co.tick(25.9)
    assert co.current("7").number == 0
    co.tick(26.0)
    ep = co.current("7")
    assert ep.number == 1 and ep.members == ("n1",)
    o = co.checkin("7", "n1", 26.1, epoch=0, state="exited", rc=1)
    assert (o.kind, o.epoch, o.world) == ("run", 1, 1)


def test_failed_worker_restarts_at_once_when_every_launcher_answered():
    co, _ = start_two(coordinator(failure_settle_s=5))
    co.checkin("7", "n1", 21.0, epoch=0, state="exited", rc=1)
    o = co.checkin("7", "n2", 21.5, epoch=0, state="running")
    ep = co.current("7")
    assert ep.number == 1 and set(ep.members) == {"n1", "n2"}
    assert o.kind == "stop" and o.epoch == 0
    assert co.checkin("7", "n2", 21.6, epoch=0, state="exited", rc=1).kind == "run"
    assert co.state("7").failures == 1, "one failed epoch counts once"


def test_survivors_of_a_failed_epoch_are_stopped_while_it_settles():
    co = coordinator(failure_settle_s=5)
    co.add_job("7", 1, 0.0)
    co.set_target("7", ["n1", "n2", "n3"], 0.0)
    run_all(co, "7", ["n1", "n2", "n3"], 0.0)
    co.checkin("7", "n3", 10.0, epoch=0, state="exited", rc=1)
    o = co.checkin("7", "n1", 10.5, epoch=0, state="running")
    assert o.kind == "stop" and co.current("7").number == 0
    co.tick(15.0)
    assert set(co.current("7").members) == {"n1", "n3"}


def test_stale_launcher_reports_are_ignored():
    co, _ = start_two()
    co.set_target("7", ["n1"], 10.0, lost=["n2"])  # epoch 1 = {n1}
    # n2's old launcher is still alive and reports a failed epoch-0 worker: no new restart
    o = co.checkin("7", "n2", 11.0, epoch=0, state="exited", rc=1)
    assert o.kind == "wait" and co.current("7").number == 1
    # a launcher still running epoch 0 is told to stop
    assert co.checkin("7", "n2", 11.5, epoch=0, state="running").kind == "stop"
    assert co.current("7").number == 1


def test_training_finished_orders_exit():
    co, _ = start_two()
    assert co.checkin("7", "n2", 30.0, epoch=0, state="exited", rc=0).kind == "exit"
    assert co.finished("7")
    o = co.checkin("7", "n1", 30.1, epoch=0, state="running")
    assert o.kind == "exit" and o.rc == 0


def test_repeated_failures_end_the_job():
    co = coordinator(max_failures=2)
    co.add_job("9", 0, 0.0)
    co.set_target("9", ["a1"], 0.0)
    for i in range(3):
        o = co.checkin("9", "a1", 1.0 + i)
        assert o.kind == "run"
        o = co.checkin("9", "a1", 1.5 + i, epoch=o.epoch, state="exited", rc=1)
    assert o.kind == "exit" and o.rc == 1


def test_ports_distinct_across_concurrent_jobs_and_fresh_per_epoch():
    co = coordinator(port_range=(30000, 30002))
    for job in ("a", "b"):
        co.add_job(job, 1, 0.0)
        co.set_target(job, ["x1"], 0.0)
        co.checkin(job, "x1", 0.0, addr="127.0.0.1")
    pa, pb = co.current("a").port, co.current("b").port
    assert pa != pb
    co.set_target("a", ["x1"], 1.0, lost=["x1"])
    co.checkin("a", "x1", 1.0, addr="127.0.0.1")
    pa2 = co.current("a").port
    assert pa2 not in (pa, pb)
    for job in ("c", "d"):
        co.add_job(job, 1, 2.0)
        co.set_target(job, ["x2"], 2.0)
    assert co.checkin("c", "x2", 2.0).kind == "run"
    o = co.checkin("d", "x2", 2.0)  # three ports, four jobs: d waits, saying why
    assert o.kind == "wait" and "widen" in o.reason and co.current("d") is None
    co.remove_job("a")
    assert co.checkin("d", "x2", 3.0).port == pa2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 2)), min_size=1, max_size=30))
def test_running_epochs_never_share_a_port(events):
    co = coordinator(port_range=(31000, 31003))
    for job in "abcd":
        co.add_job(job, 1, 0.0)
    for t, (job, n) in enumerate(events):
        nodes = [f"{job}{i}" for i in range(n)]
        co.set_target(job, nodes, float(t), lost=[f"{job}1"] if n == 1 else [])
        for node in nodes:
            co.checkin(job, node, float(t))
        ports = [co.current(j).port for j in "abcd" if co.current(j) is not None]
        assert len(ports) == len(set(ports))


def test_keys_are_per_job_from_the_random_source():
    co = coordinator()
    ka = co.add_job("a", 1, 0.0).key
    kb = co.add_job("b", 1, 0.0).key
    assert len(ka) == 32 and ka != kb
    assert co.add_job("a", 1, 0.0).key == ka, "re-adding keeps the key"
    co2 = EpochCoordinator(random=seeded())
    assert co2.add_job("a", 1, 0.0).key == ka, "deterministic with a seeded source"


def test_serialisation_round_trip_keeps_running_epochs():
    co, _ = start_two()
    co.set_target("7", ["n1"], 10.0)
    co.checkin("7", "n1", 10.5, epoch=0, state="running")
    data = json.loads(json.dumps(co.to_dict()))
    back = EpochCoordinator.from_dict(data, random=seeded(2))
    assert back.to_dict() == data
    assert back.key("7") == co.key("7")
    # the recovered coordinator carries on where the old one stopped
    back.acknowledge_checkpoint("7", 0, 11.0)
    co.acknowledge_checkpoint("7", 0, 11.0)
    assert back.current("7").members == co.current("7").members == ("n1",)
    assert back.current("7").number == 1


def test_launcher_from_a_forgotten_epoch_never_reuses_its_number():
    co = coordinator()
    co.add_job("7", 1, 0.0)
    co.set_target("7", ["n1"], 0.0)
    assert co.checkin("7", "n1", 0.0, epoch=4, state="running", ckpt_seen=3).kind == "stop"
    assert co.checkin("7", "n1", 1.0, ckpt_seen=3).epoch == 5
    co.checkin("7", "n1", 1.5, epoch=5, state="running", ckpt_seen=3)
    co.set_target("7", ["n1", "n2"], 2.0)
    co.checkin("7", "n2", 2.0)
    o = co.checkin("7", "n1", 2.5, epoch=5, state="running", ckpt_seen=3)
    assert o.kind == "checkpoint" and o.request == 4, "a request number the launcher will relay"


def test_bad_input_is_refused_with_one_line():
    co = coordinator()
    with pytest.raises(EpochError, match="unknown job"):
        co.checkin("nope", "n1", 0.0)
    co.add_job("1", 1, 0.0)
    with pytest.raises(ValidationError, match="state"):
        co.checkin("1", "n1", 0.0, state="dancing")
    with pytest.raises(ValidationError):
        EpochCoordinator(port_range=(100, 50))
    with pytest.raises(EpochError, match="not one this launcher knows"):
        Order.from_dict({"kind": "explode"})
    with pytest.raises(EpochError, match="incomplete"):
        Order.from_dict({"kind": "run", "epoch": 1})
    assert Order.from_dict(Order("run", 1, 0, 1, "h", 2, "id").to_dict()).port == 2
