"""In-place members that vanish without the coordinator hearing of it.

Seen under real Slurm (tests/slurm/test_faults_site.py on the in-place path): malletraind decided
a planned shrink 3 → 1, started the in-place epoch, released the two leavers to Slurm (which
requeued their tasks) and was SIGKILLed before it saved the new epoch. The restarted daemon
recovered epoch 0 with all three members; Slurm reported no stop for the leavers (the daemon had
not seen them stop), and the survivor's process, on the in-place path, does not exit on a lost
peer: it waits for the next membership. Nothing started one, and the job stopped training.
"""

from __future__ import annotations

from malletrain_core.daemon.epochs import EpochCoordinator
from tests.test_epochs_inplace import running, start


def restarted(inplace: bool = True) -> EpochCoordinator:
    """Epoch 0 on n1, n2, n3 as saved before the kill, recovered by a new daemon."""
    co = start(("n1", "n2", "n3"), inplace=inplace)
    for n in ("n1", "n2", "n3"):
        running(co, n, 0, 10.0, inplace=inplace)
    return EpochCoordinator.from_dict(co.to_dict())


def test_silent_members_are_dropped_after_the_launcher_timeout() -> None:
    co = restarted()
    co.tick(100.0)  # the restart: the old check-ins count from here
    for t in (101.0, 105.0, 110.0):
        assert running(co, "n1", 0, t).kind == "run"
        co.tick(t)
    assert co.current("7").number == 0, "dropped before the launchers could reconnect"
    running(co, "n1", 0, 114.0)
    co.tick(115.5)
    ep = co.current("7")
    assert (ep.number, ep.members, ep.path, ep.abandon) == (1, ("n1",), "inplace", True)
    o = running(co, "n1", 0, 116.0)
    assert (o.kind, o.epoch, o.rank, o.world, o.abandon) == ("run", 1, 0, 1, True)
    co.tick(140.0)
    assert co.current("7").number == 1, "the silent members came back into the plan"


def test_a_dropped_node_rejoins_in_place_when_a_launcher_starts_there_again() -> None:
    co = restarted()
    co.tick(100.0)
    running(co, "n1", 0, 114.0)
    co.tick(115.5)
    assert co.current("7").members == ("n1",)
    running(co, "n1", 1, 120.0)
    assert co.checkin("7", "n2", 121.0, inplace=True).kind == "run"
    ep = co.current("7")
    assert (ep.number, ep.members, ep.path) == (2, ("n1", "n2"), "inplace")


def test_restart_path_members_are_left_to_their_workers_failure() -> None:
    co = restarted(inplace=False)  # a torchrun survivor exits and reports it
    co.tick(100.0)
    for t in (110.0, 120.0, 150.0):
        running(co, "n1", 0, t, inplace=False)
        co.tick(t)
    assert co.current("7").number == 0


def test_nothing_happens_while_every_member_is_silent() -> None:
    co = restarted()
    co.tick(100.0)
    co.tick(200.0)  # none heard from: the daemon, not the members, may be the one cut off
    assert co.current("7").number == 0


def test_a_hung_member_found_silent_is_stopped_before_it_is_named_again() -> None:
    """n2's process hangs (SIGSTOP); n1's and n3's processes find it silent in epoch 0 and
    say so. n2's launcher lives on and keeps checking in as running epoch 0 and ready. Before,
    the coordinator took that check-in as a ready joiner and named n2 in the next epoch at once
    (56 ms after the abandon, in bench/campaign.py's sigstop faults): the survivors waited 20 s
    for it to form the group and exited, and the job restarted from disk. Now it is told to
    stop, and joins again only with a process that checked in ready after leaving."""
    co = restarted()
    co.tick(10.0)
    for n in ("n1", "n3"):
        running(co, n, 0, 11.0)
    co.checkin("7", "n1", 12.0, epoch=0, state="running", inplace=True, lost=(0, (1,)))
    ep = co.current("7")
    assert (ep.number, ep.members, ep.abandon) == (1, ("n1", "n3"), True)
    o = running(co, "n2", 0, 12.1)  # the hung process's launcher, still calling it ready
    assert o.kind == "stop", o
    assert co.current("7").members == ("n1", "n3"), "the hung node was named again"
    for n in ("n1", "n3"):
        running(co, n, 1, 13.0)
    co.tick(13.0)
    assert co.current("7").number == 1
    # its launcher stopped the process (SIGKILL) and started a new one, which got ready
    assert co.checkin("7", "n2", 15.0, epoch=0, state="exited", rc=-9, inplace=True,
                      ready=False).kind == "wait"
    o = co.checkin("7", "n2", 20.0, inplace=True)
    ep = co.current("7")
    assert o.kind == "run" and ep.members == ("n1", "n3", "n2") and ep.path == "inplace"
