"""A node granted to a job again while the job's shrunk task is still leaving it.

Seen on real Slurm 22.05 (tests/slurm/test_faults_site.py, the corrupt state database): a
daemon started without state shrinks every running worker; one task was still COMPLETING at
the next poll, so its node was offered and granted to the same job again (another task
released there). The engine's next order for that node, a shrink, then went to the task
leaving it and left the new one running; or the leaving task's stop confirmation read as the
loss of the new one. Either way the engine granted the node once more, a third task waited
there for ever ("Resources"), grows elsewhere found "no held task left", and training ran at
world 1 with two tasks RUNNING. Faked at the subprocess boundary only.
"""

from __future__ import annotations

from test_slurm_backend import FakeSlurm, T, nodes, task

from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.events import Event, Grow, Shrink, WorkerStarted, WorkerStopped

HELD = "job requeued in held state"


def regranted() -> tuple[FakeSlurm, SlurmBackend]:
    """Three workers shrunk after a restart and n01 granted to job 7 again at once: its tasks
    are not held yet, so the grant waits (no command); the next poll, with 7_0 still COMPLETING
    on n01, releases 7_1 there."""
    slurm = FakeSlurm()
    backend = SlurmBackend(slurm, grant_timeout_s=120, unplanned_wait_s=0)
    slurm.squeue = "".join(task(20 + i, 7, i, "RUNNING", f"n0{i + 1}", reason="JobHeldAdmin")
                           for i in range(3))
    slurm.sinfo = nodes(n01="allocated", n02="allocated", n03="allocated")
    backend.poll(T)
    backend.execute([Shrink("7", ("n01", "n02", "n03"))], T)  # the restart's shrink
    slurm.calls.clear()
    assert backend.execute([Grow("7", ("n01",), None)], T) == []
    assert slurm.commands() == []
    slurm.squeue = (task(20, 7, 0, "COMPLETING", "n01", reason="None")
                    + task(21, 7, 1, reason=HELD) + task(22, 7, 2, reason=HELD))
    slurm.sinfo = nodes(n01="completing", n02="idle", n03="idle")
    events = backend.poll(T + 1)
    assert not [e for e in events if isinstance(e, WorkerStopped) and e.node == "n01"]
    assert ["scontrol", "release", "7_1"] in slurm.commands()
    assert backend.launching == {"7_1": "n01"}
    slurm.calls.clear()
    return slurm, backend


def test_a_shrink_stops_the_task_granted_there_not_the_one_leaving() -> None:
    slurm, backend = regranted()
    events = backend.execute([Shrink("7", ("n01",))], T + 1)
    assert events == [WorkerStopped(T + 1, "7", "n01")]
    assert slurm.commands() == [["scontrol", "hold", "7_1"]]
    assert backend.launching == {}


def gone_from_n01(slurm: FakeSlurm, backend: SlurmBackend, new: str) -> list[Event]:
    """7_0 held at last; 7_1, released onto n01, as ``new`` says (a squeue line's tail)."""
    slurm.squeue = task(20, 7, 0, reason=HELD) + new + task(22, 7, 2, reason=HELD)
    slurm.sinfo = nodes(n01="allocated" if "RUNNING" in new else "idle", n02="idle",
                        n03="idle")
    return backend.poll(T + 2)


def test_the_leaving_task_does_not_read_as_the_loss_of_the_new_one() -> None:
    slurm, backend = regranted()
    events = gone_from_n01(slurm, backend, task(21, 7, 1, "RUNNING", "n01", prio=100,
                                                reason="None"))
    assert WorkerStarted(T + 2, "7", "n01") in events
    assert WorkerStopped(T + 2, "7", "n01") not in events
    assert backend.workers == {"7_1": ("7", "n01")}


def test_nor_while_the_new_one_is_still_starting() -> None:
    slurm, backend = regranted()
    events = gone_from_n01(slurm, backend, task(21, 7, 1, prio=100, reason="Resources"))
    assert not [e for e in events if isinstance(e, WorkerStopped)]
    assert backend.launching == {"7_1": "n01"}


def test_a_grant_onto_a_node_where_the_job_runs_releases_nothing() -> None:
    slurm, backend = regranted()
    gone_from_n01(slurm, backend, task(21, 7, 1, "RUNNING", "n01", reason="JobHeldAdmin"))
    slurm.calls.clear()
    events = backend.execute([Grow("7", ("n01",), None)], T + 2)
    assert slurm.commands() == []
    assert events == [WorkerStarted(T + 2, "7", "n01")]
