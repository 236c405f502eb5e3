"""The epoch coordinator with launchers that rescale in place (live training processes)."""

from __future__ import annotations

import json

from malletrain_core.daemon.epochs import EpochCoordinator
from tests.test_epochs import coordinator


def start(nodes=("n1", "n2"), inplace=True, now=0.0):
    co = coordinator(join_wait_s=1.0)
    co.add_job("7", uid=1000, now=now)
    co.set_target("7", list(nodes), now)
    for n in nodes:
        co.checkin("7", n, now, addr=f"10.0.0.{n[-1]}", inplace=inplace)
    for n in nodes:
        o = co.checkin("7", n, now, addr=f"10.0.0.{n[-1]}", inplace=inplace)
        assert o.kind == "run"
        assert co.checkin("7", n, now, epoch=o.epoch, state="running", inplace=inplace).kind \
            == "run"
    assert co.current("7").path == "disk"  # the first epoch starts the processes
    return co


def running(co, node, epoch, now, inplace=True):
    return co.checkin("7", node, now, epoch=epoch, state="running", inplace=inplace)


def test_grow_in_place_needs_no_checkpoint_and_no_stop():
    co = start()
    co.set_target("7", ["n1", "n2", "n3"], 10.0)
    assert co.checkin("7", "n3", 10.5, addr="10.0.0.3", inplace=True).kind == "run"
    ep = co.current("7")
    assert ep.number == 1 and ep.members == ("n1", "n2", "n3")
    assert ep.path == "inplace" and not ep.abandon
    for rank, n in enumerate(["n1", "n2"]):
        o = running(co, n, 0, 11.0)     # still in epoch 0: told the new one, not stopped
        assert (o.kind, o.epoch, o.rank, o.world, o.abandon) == ("run", 1, rank, 3, None)
    assert co.checkin("7", "n3", 11.0, inplace=True).rank == 2


def test_planned_shrink_in_place_stops_only_the_leaver():
    co = start(("n1", "n2", "n3"))
    co.set_target("7", ["n1"], 10.0)
    ep = co.current("7")
    assert ep.number == 1 and ep.members == ("n1",) and ep.path == "inplace"
    assert not ep.abandon, "a planned shrink stops every member at the same step boundary"
    o = running(co, "n1", 0, 10.5)
    assert (o.kind, o.epoch, o.world) == ("run", 1, 1)
    assert running(co, "n2", 0, 10.5).kind == "stop"


def test_a_planned_leaver_is_released_only_once_its_process_left():
    """The next epoch starts without the leaver at once, but its node goes back to the batch
    system only when its launcher says the process left (at the step boundary): released
    earlier, its process is killed inside a step that the survivors are still in."""
    co = start(("n1", "n2", "n3"))
    co.set_target("7", ["n1", "n2"], 10.0)
    assert co.current("7").members == ("n1", "n2")
    assert co.draining("7") == {"n3"}  # still in epoch 0's step
    assert running(co, "n3", 0, 10.5).kind == "stop"
    assert co.draining("7") == {"n3"}
    co.checkin("7", "n3", 11.0, inplace=True)  # its launcher: the process left, idle now
    assert co.draining("7") == set()


def test_preemption_in_place_abandons_the_step_in_flight():
    co = start()
    running(co, "n1", 0, 49.0)
    co.set_target("7", ["n1"], 50.0, lost=["n2"])
    ep = co.current("7")
    assert ep.path == "inplace" and ep.abandon
    o = running(co, "n1", 0, 50.1)
    assert (o.kind, o.epoch, o.world, o.abandon) == ("run", 1, 1, True)
    assert Order_round_trip(o).abandon is True


def Order_round_trip(o):
    from malletrain_core.wire.orders import Order
    return Order.from_dict(json.loads(json.dumps(o.to_dict())))


def test_failed_worker_in_place_survivor_keeps_its_process():
    co = start()
    co.checkin("7", "n2", 20.0, epoch=0, state="exited", rc=1, inplace=True)
    o = running(co, "n1", 0, 20.5)
    assert o.kind == "run", "the survivor is not stopped"
    ep = co.current("7")
    assert ep.number == 1 and ep.path == "inplace" and ep.abandon
    o = running(co, "n1", 0, 20.6)
    assert (o.kind, o.epoch, o.abandon) == ("run", 1, True)
    # the failed node's launcher starts a fresh process that joins epoch 1 and gets the state
    assert co.checkin("7", "n2", 20.7, epoch=0, state="exited", rc=1, inplace=True).kind == "run"


def test_a_launcher_without_in_place_keeps_the_disk_path():
    co = start(inplace=False)
    co.set_target("7", ["n1"], 10.0)
    assert running(co, "n1", 0, 10.5, inplace=False).kind == "checkpoint"
    co.acknowledge_checkpoint("7", 0, 11.0)
    ep = co.current("7")
    assert ep.path == "disk"
    assert running(co, "n1", 0, 11.5, inplace=False).kind == "stop"


def test_path_survives_a_daemon_restart():
    co = start()
    running(co, "n1", 0, 49.0)
    co.set_target("7", ["n1"], 50.0, lost=["n2"])
    back = EpochCoordinator.from_dict(json.loads(json.dumps(co.to_dict())))
    ep = back.current("7")
    assert ep.path == "inplace" and ep.abandon
    assert back.state("7").launchers["n1"].inplace


def test_history_records_every_epoch_path_and_survives_a_restart():
    """Each epoch's number, world, path and abandon are kept (bounded) and persisted: what the
    daemon logs and the real-Slurm tests read."""
    from malletrain_core.daemon import epochs

    co = start()
    running(co, "n1", 0, 49.0)
    co.set_target("7", ["n1"], 50.0, lost=["n2"])
    hist = co.state("7").history
    assert [(h["epoch"], h["world"], h["path"], h["abandon"]) for h in hist] == \
        [(0, 2, "disk", False), (1, 1, "inplace", True)]
    back = EpochCoordinator.from_dict(json.loads(json.dumps(co.to_dict())))
    assert back.state("7").history == hist
    st = back.state("7")
    for i in range(epochs.HISTORY + 5):
        back._start(st, ["n1"], 60.0 + i)
    assert len(st.history) == epochs.HISTORY and st.history[-1]["epoch"] == st.epoch.number


def test_held_checkin_pushes_the_new_order_at_once():
    """A launcher that rescales in place keeps a check-in open; a preemption reaches it within
    the hold's polling period, not at its next poll."""
    import threading
    import time

    from malletrain_core.daemon.launchers import HOLD_POLL_S, LauncherService

    co = start()
    svc = LauncherService(co, wrap_key=lambda key, uid: "wrapped", report_addr="127.0.0.1:1",
                          clock=lambda: 100.0)
    args = {"job": "7", "node": "n1", "epoch": 0, "state": "running", "inplace": True}
    t0 = time.monotonic()
    quiet = svc.checkin(1000, {**args, "hold_s": 0.3})
    assert quiet["order"]["kind"] == "run" and quiet["order"]["epoch"] == 0
    assert time.monotonic() - t0 >= 0.3, "nothing new: the reply is held"
    got = {}

    def held():
        got["reply"] = svc.checkin(1000, {**args, "hold_s": 8})
        got["t"] = time.monotonic()

    th = threading.Thread(target=held)
    th.start()
    time.sleep(0.5)
    with svc.lock:
        co.set_target("7", ["n1"], 100.0, lost=["n2"])
        t_change = time.monotonic()
    th.join(10)
    order = got["reply"]["order"]
    assert (order["kind"], order["epoch"], order["world"], order["abandon"]) == \
        ("run", 1, 1, True)
    assert got["t"] - t_change < 5 * HOLD_POLL_S + 0.2
    # without hold_s (the restart path) nothing is held
    t0 = time.monotonic()
    svc.checkin(1000, {**args, "epoch": 1, "inplace": False})
    assert time.monotonic() - t0 < 0.2


def test_a_node_that_left_is_placed_again_only_once_its_new_process_is_ready():
    co = start()
    co.set_target("7", ["n1"], 10.0)
    assert running(co, "n2", 0, 10.5).kind == "stop"
    co.set_target("7", ["n1", "n2"], 11.0)
    assert co.current("7").members == ("n1",), "n2's next process is not ready yet"
    assert running(co, "n1", 1, 11.5).kind == "run"
    assert co.checkin("7", "n2", 12.0, inplace=True, ready=False).kind == "wait"
    assert co.current("7").members == ("n1",)
    o = co.checkin("7", "n2", 13.0, inplace=True, ready=True)
    assert (o.kind, o.rank, o.world) == ("run", 1, 2) and co.current("7").path == "inplace"
    # a member that reports not ready is not dropped from its epoch
    co.checkin("7", "n2", 13.5, inplace=True, ready=False)
    assert co.current("7").members == ("n1", "n2")


def test_a_ready_joiner_waits_join_wait_s_for_a_later_grant_then_joins_alone():
    co = start()
    co.set_target("7", ["n1", "n2", "n3"], 10.0)
    assert co.checkin("7", "n3", 10.0, inplace=True, ready=False).kind == "wait"
    assert co.checkin("7", "n3", 11.0, inplace=True, ready=True).kind == "run", \
        "every new node is ready: it joins at once"
    assert co.current("7").members == ("n1", "n2", "n3")
    run_epoch = co.current("7").number
    for n in ("n1", "n2", "n3"):
        running(co, n, run_epoch, 11.5)
    # two more grants, one after the other; n4 is ready first, n5 still imports
    co.set_target("7", ["n1", "n2", "n3", "n4"], 20.0)
    co.set_target("7", ["n1", "n2", "n3", "n4", "n5"], 20.4)
    co.checkin("7", "n5", 20.4, inplace=True, ready=False)
    assert co.checkin("7", "n4", 20.5, inplace=True, ready=True).kind == "wait"
    assert co.checkin("7", "n4", 21.3, inplace=True, ready=True).kind == "wait", \
        "within join_wait_s (1 s here) it waits for n5"
    o = co.checkin("7", "n4", 21.5, inplace=True, ready=True)
    assert (o.kind, o.world, o.rank) == ("run", 4, 3), "after 1 s it joins without n5"
    ep = co.current("7")
    assert ep.path == "inplace" and ep.members == ("n1", "n2", "n3", "n4")
    for n in ep.members:
        running(co, n, ep.number, 21.6)
    o = co.checkin("7", "n5", 23.0, inplace=True, ready=True)
    assert (o.kind, o.world) == ("run", 5), "the last new node ready: it joins at once"


def test_the_wait_counts_from_the_first_ready_check_in_and_anew_after_a_stop():
    co = start()
    co.set_target("7", ["n1", "n2", "n3", "n4"], 10.0)
    co.checkin("7", "n4", 10.0, inplace=True, ready=False)
    for t in (10.2, 10.6, 11.0):
        assert co.checkin("7", "n3", t, inplace=True, ready=True).kind == "wait"
    assert co.checkin("7", "n3", 11.2, inplace=True, ready=True).kind == "run"
    assert co.current("7").members == ("n1", "n2", "n3")
    ep = co.current("7").number
    for n in ("n1", "n2", "n3"):
        running(co, n, ep, 11.3)
    # n2 leaves (its process stops); granted again, its next process waits a second anew
    co.set_target("7", ["n1", "n3", "n4"], 12.0)
    assert running(co, "n2", ep, 12.1).kind == "stop"
    ep = co.current("7").number
    for n in ("n1", "n3"):
        running(co, n, ep, 12.2)
    co.set_target("7", ["n1", "n2", "n3", "n4"], 13.0)
    assert co.checkin("7", "n2", 13.5, inplace=True, ready=True).kind == "wait"
    assert co.checkin("7", "n2", 14.4, inplace=True, ready=True).kind == "wait"
    assert co.checkin("7", "n2", 14.5, inplace=True, ready=True).kind == "run"


def test_restart_path_launchers_still_wait_for_every_node_or_join_timeout_s():
    co = start(inplace=False)
    co.set_target("7", ["n1", "n2", "n3", "n4"], 10.0)
    co.checkin("7", "n3", 10.0, addr="10.0.0.3")
    assert co.current("7").members == ("n1", "n2"), "a grow on the restart path waits"
    co.checkin("7", "n3", 15.0, addr="10.0.0.3")
    assert co.current("7").members == ("n1", "n2")
    assert co.state("7").ckpt_requested_at is None


def test_the_first_epoch_starts_with_the_ready_nodes_after_join_wait_s():
    co = coordinator(join_wait_s=1.0)
    co.add_job("7", uid=1000, now=0.0)
    co.set_target("7", ["n1", "n2"], 0.0)
    co.checkin("7", "n2", 0.0, inplace=True, ready=False)
    assert co.checkin("7", "n1", 0.1, inplace=True, ready=True).kind == "wait"
    assert co.current("7") is None
    o = co.checkin("7", "n1", 1.2, inplace=True, ready=True)
    assert (o.kind, o.world) == ("run", 1) and co.current("7").path == "disk"


def test_join_wait_s_round_trips_and_is_checked():
    co = coordinator(join_wait_s=0.25)
    assert EpochCoordinator.from_dict(json.loads(json.dumps(co.to_dict()))).join_wait_s == 0.25
    import pytest

    from malletrain_core.errors import ValidationError
    with pytest.raises(ValidationError):
        coordinator(join_wait_s=-1.0)


def test_a_joiners_ready_check_in_wakes_the_members_held_check_ins(monkeypatch):
    """The joiner's check-in starts the epoch; the members' held check-ins are woken by it, not
    left to their polling period (made longer than the hold here, so only the wake-up can
    answer before the hold ends)."""
    import threading
    import time

    from malletrain_core.daemon import launchers

    monkeypatch.setattr(launchers, "HOLD_POLL_S", 60.0)
    co = start()
    co.set_target("7", ["n1", "n2", "n3"], 10.0)
    svc = launchers.LauncherService(co, wrap_key=lambda key, uid: "wrapped",
                                    report_addr="127.0.0.1:1", clock=lambda: 10.2)
    got = {}

    def held():
        got["reply"] = svc.checkin(1000, {"job": "7", "node": "n1", "epoch": 0,
                                          "state": "running", "inplace": True, "hold_s": 9})
        got["t"] = time.monotonic()

    th = threading.Thread(target=held)
    th.start()
    time.sleep(0.3)
    assert "reply" not in got, "nothing new yet: the member's check-in is held"
    t_ready = time.monotonic()
    joiner = svc.checkin(1000, {"job": "7", "node": "n3", "inplace": True, "ready": True})
    assert (joiner["order"]["kind"], joiner["order"]["epoch"]) == ("run", 1)
    th.join(10)
    order = got["reply"]["order"]
    assert (order["kind"], order["epoch"], order["world"]) == ("run", 1, 3)
    assert got["t"] - t_ready < 5.0, "answered by the wake-up, not by the end of the hold"


def test_a_restarted_daemon_that_lost_its_last_epoch_keeps_every_process():
    """The daemon is killed after handing a grow's epoch 1 to n1 and before saving it. Back,
    it knows epoch 0 (from disk) while n1's process runs epoch 1: the next epoch is started in
    place after the newest one reported, for n1, n2 and the joiner n3 alike (told
    epoch 1 or not), and nobody is stopped. Before,
    n1 got ``stop`` ("epoch 1 is over") and its process was restarted; with both members told
    epoch 1 the change went through the disk."""
    for told in (["n1"], ["n1", "n2"], ["n1", "n2", "n3"]):
        co = start()
        co.set_target("7", ["n1", "n2", "n3"], 10.0)
        saved = json.loads(json.dumps(co.to_dict()))  # what the daemon had saved
        co.checkin("7", "n3", 10.0, inplace=True)
        assert co.current("7").number == 1
        back = EpochCoordinator.from_dict(saved)
        orders = {n: running(back, n, 1 if n in told else 0, 20.0) for n in ("n1", "n2")}
        assert back.current("7").number == 2 and back.current("7").path == "inplace"
        orders["n3"] = running(back, "n3", 1, 20.0) if "n3" in told else \
            back.checkin("7", "n3", 20.0, inplace=True)
        for t in (20.1, 20.2, 22.0):  # each launcher runs what it was told last
            orders = {n: running(back, n, o.epoch, t) if o.kind == "run"
                      else back.checkin("7", n, t, inplace=True) for n, o in orders.items()}
            assert "stop" not in {o.kind for o in orders.values()}, (told, orders)
        assert {o.kind for o in orders.values()} == {"run"}, orders
        assert len({o.epoch for o in orders.values()}) == 1, orders
        assert back.current("7").members == ("n1", "n2", "n3")
        hist = back.state("7").history
        assert [h["path"] for h in hist[1:]] == ["inplace"] * (len(hist) - 1), hist
        assert not any(h["abandon"] for h in hist), hist


def test_an_order_into_a_new_epoch_is_saved_before_it_goes_out():
    """The coordinator's state is saved before a check-in's reply moves a launcher to another
    epoch, so that a daemon killed right after knows that epoch when it is back (saved only
    at the end of its next cycle, it was lost: see the test above); a reply that moves nobody
    saves nothing."""
    from malletrain_core.daemon.launchers import LauncherService

    co = start()
    saved: list[int | None] = []
    svc = LauncherService(co, wrap_key=lambda key, uid: "wrapped", report_addr="127.0.0.1:1",
                          clock=lambda: 100.0,
                          persist=lambda: saved.append(co.current("7").number))
    args = {"job": "7", "node": "n1", "epoch": 0, "state": "running", "inplace": True}
    assert svc.checkin(1000, args)["order"]["epoch"] == 0 and saved == []
    with svc.lock:
        co.set_target("7", ["n1"], 100.0, lost=["n2"])
    assert svc.checkin(1000, args)["order"]["epoch"] == 1
    assert saved == [1]


def test_a_loss_right_after_a_restart_stays_in_place():
    """The state is saved when a grow's epoch 1 is ordered, before the members say they run
    it; the daemon restarts and Slurm reports n3 lost before any launcher checked in again:
    the survivors' next epoch is in place (abandon). Before, it went through the disk (no
    saved member ran epoch 1 yet)."""
    co = start()
    co.set_target("7", ["n1", "n2", "n3"], 10.0)
    co.checkin("7", "n3", 10.0, inplace=True)
    assert co.current("7").number == 1
    back = EpochCoordinator.from_dict(json.loads(json.dumps(co.to_dict())))
    back.set_target("7", ["n1", "n2"], 12.0, lost=["n3"])
    ep = back.current("7")
    assert (ep.number, ep.members, ep.path, ep.abandon) == (2, ("n1", "n2"), "inplace", True)


def test_survivors_that_abandoned_while_the_daemon_was_away_stay_in_place():
    """The daemon is down; n3's process dies; n1's and n2's processes find it silent and
    abandon epoch 0, and their launchers (check-ins refused meanwhile) then say they are idle
    and ready. The daemon comes back, those check-ins land, and Slurm reports n3 lost: the
    survivors hold the state in memory, so their epoch is in place (abandon). Before, it went
    through the disk ("no member that stays runs a process"), seen on Slurm 22.05 to 26.05."""
    co = start(("n1", "n2", "n3"))
    back = EpochCoordinator.from_dict(json.loads(json.dumps(co.to_dict())))
    for n in ("n1", "n2"):
        back.checkin("7", n, 20.0, inplace=True)  # idle, ready: the process waits
    back.set_target("7", ["n1", "n2"], 20.0, lost=["n3"])
    ep = back.current("7")
    assert (ep.number, ep.members, ep.path, ep.abandon) == (1, ("n1", "n2"), "inplace", True)


def test_a_restart_path_survivor_still_goes_through_the_disk():
    """The same with launchers that do not rescale in place: the disk path, as before."""
    co = start(("n1", "n2", "n3"), inplace=False)
    for n in ("n1", "n2"):
        co.checkin("7", n, 20.0, inplace=False)
    co.set_target("7", ["n1", "n2"], 20.0, lost=["n3"])
    assert co.current("7").path == "disk"


# ----- a launcher that closes its held check-in (its task ended) -----------------------------

def test_a_member_whose_launcher_went_away_is_left_out_at_once():
    co = start(("n1", "n2", "n3"))
    for n in ("n1", "n2", "n3"):
        running(co, n, 0, 20.0)
    assert co.launcher_gone("7", "n3", 20.1)
    ep = co.current("7")
    assert (ep.number, ep.members, ep.path, ep.abandon) == (1, ("n1", "n2"), "inplace", True)
    o = running(co, "n1", 0, 20.2)
    assert (o.kind, o.epoch, o.world, o.abandon) == ("run", 1, 2, True)
    # the batch system's word comes later and changes nothing more
    co.set_target("7", ["n1", "n2"], 21.0, lost=["n3"])
    assert co.current("7").number == 1
    # a new launcher on that node (its task started again) is placed once ready
    co.set_target("7", ["n1", "n2", "n3"], 30.0)
    assert co.checkin("7", "n3", 30.5, addr="10.0.0.3", inplace=True).kind == "run"
    assert co.current("7").members == ("n1", "n2", "n3")


def test_a_launcher_that_goes_away_outside_the_epoch_or_alone_changes_nothing():
    co = start(("n1", "n2", "n3"))
    co.set_target("7", ["n1", "n2"], 10.0)          # a planned shrink: n3 leaves
    assert running(co, "n3", 0, 10.5).kind == "stop"
    co.checkin("7", "n3", 11.0, inplace=True)       # its process left; idle
    assert not co.launcher_gone("7", "n3", 11.5)    # then its task is ended: nothing to do
    assert co.current("7").number == 1
    for n in ("n1", "n2"):
        running(co, n, 1, 12.0)
    assert co.launcher_gone("7", "n1", 12.1)        # a member of the new epoch: the next one
    assert co.current("7").members == ("n2",)
    # the last member: the job ended (a cancel), nothing is started
    co2 = start(("n1",))
    running(co2, "n1", 0, 5.0)
    assert not co2.launcher_gone("7", "n1", 5.1)
    assert co2.current("7").number == 0
    assert not co2.launcher_gone("7", "nX", 5.2) and not co2.launcher_gone("8", "n1", 5.2)


def test_a_launcher_of_an_older_epoch_or_on_the_restart_path_changes_nothing():
    co = start(("n1", "n2", "n3"), inplace=False)
    for n in ("n1", "n2", "n3"):
        running(co, n, 0, 20.0, inplace=False)
    assert not co.launcher_gone("7", "n3", 20.1)     # restart path: its workers report it
    co = start(("n1", "n2", "n3"))
    co.set_target("7", ["n1", "n2", "n3", "n4"], 10.0)
    assert co.checkin("7", "n4", 10.5, addr="10.0.0.4", inplace=True).kind == "run"
    assert co.current("7").number == 1
    assert not co.launcher_gone("7", "n3", 10.6), "its last check-in was for epoch 0"


def test_a_held_check_in_whose_launcher_went_away_starts_the_next_epoch():
    """The service looks at the connection while it holds a member's check-in; when the
    launcher closed it, the others' held check-ins carry the next epoch within a poll."""
    import threading
    import time

    from malletrain_core.daemon.launchers import HOLD_POLL_S, LauncherService

    co = start(("n1", "n2"))
    closed = threading.Event()
    svc = LauncherService(co, wrap_key=lambda key, uid: "wrapped", report_addr="127.0.0.1:1",
                          clock=lambda: 100.0,
                          gone=lambda: closed.is_set() and threading.current_thread().name == "n2")
    got = {}

    def held(node):
        got[node] = svc.checkin(1000, {"job": "7", "node": node, "epoch": 0, "state": "running",
                                       "inplace": True, "hold_s": 8})
        got[node + "_t"] = time.monotonic()

    threads = [threading.Thread(target=held, args=(n,), name=n) for n in ("n1", "n2")]
    for th in threads:
        th.start()
    time.sleep(0.3)
    assert not got, "nothing new: both held"
    t_closed = time.monotonic()
    closed.set()
    for th in threads:
        th.join(10)
    order = got["n1"]["order"]
    assert (order["kind"], order["epoch"], order["world"], order["abandon"]) == \
        ("run", 1, 1, True)
    assert got["n1_t"] - t_closed < 6 * HOLD_POLL_S + 0.3
    assert "n2" not in co.state("7").launchers


def test_a_quiet_held_check_in_is_not_taken_for_a_launcher_gone():
    from malletrain_core.daemon.launchers import LauncherService

    co = start(("n1", "n2"))
    svc = LauncherService(co, wrap_key=lambda key, uid: "wrapped", report_addr="127.0.0.1:1",
                          clock=lambda: 100.0, gone=lambda: False)
    reply = svc.checkin(1000, {"job": "7", "node": "n2", "epoch": 0, "state": "running",
                               "inplace": True, "hold_s": 0.2})
    assert reply["order"]["epoch"] == 0 and co.current("7").number == 0
