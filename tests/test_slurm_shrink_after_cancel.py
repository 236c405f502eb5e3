"""A shrink never requeues a task the user has just cancelled.

Seen on real Slurm 22.05 under load (bench/load.py): the user's ``scancel`` of an elastic job
left its running task COMPLETING; a shrink of that task (deferred until its epoch drained)
reached Slurm a moment later as ``scontrol requeuehold``, which Slurm applies to a
cancelled task too. The task came back held, the job looked alive, the daemon grew it again
and the job the user had ended ran on. Faked at the subprocess boundary only.
"""

from __future__ import annotations

from test_slurm_backend import FakeSlurm, T, nodes, task

from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.events import EndReason, Grow, JobEnded, Shrink, WorkerStopped


def running_job(slurm: FakeSlurm, backend: SlurmBackend) -> None:
    slurm.squeue = (task(20, 7, 0, "RUNNING", "n01", reason="JobHeldAdmin")
                    + task(21, 7, 1, "RUNNING", "n02", reason="JobHeldAdmin"))
    slurm.sinfo = nodes(n01="allocated", n02="allocated")
    backend.poll(T)


def test_a_cancelled_task_is_not_requeued_by_a_late_shrink() -> None:
    slurm = FakeSlurm()
    backend = SlurmBackend(slurm, grant_timeout_s=120)
    running_job(slurm, backend)
    # scancel 7: both tasks are being killed when the shrink of n01 is handed over.
    slurm.squeue = (task(20, 7, 0, "COMPLETING", "n01", reason="None")
                    + task(21, 7, 1, "COMPLETING", "n02", reason="None"))
    slurm.sinfo = nodes(n01="completing", n02="completing")
    backend.poll(T + 1)
    slurm.calls.clear()
    assert backend.execute([Shrink("7", ("n01",))], T + 1) == []
    assert not [c for c in slurm.commands() if "requeuehold" in c]
    slurm.squeue = task(20, 7, 0, "CANCELLED", "n01") + task(21, 7, 1, "CANCELLED", "n02")
    slurm.sinfo = nodes(n01="idle", n02="idle")
    events = backend.poll(T + 2)
    assert JobEnded(T + 2, "7", EndReason.CANCELLED) in events
    slurm.calls.clear()
    backend.execute([Grow("7", ("n01",), 600.0)], T + 2)
    assert slurm.commands() == [], "nothing of the ended job is released again"


def test_a_running_sibling_is_still_requeued() -> None:
    slurm = FakeSlurm()
    backend = SlurmBackend(slurm, grant_timeout_s=120)
    running_job(slurm, backend)
    # Only 7_0 ends on its own (its worker exited); 7_1 still runs.
    slurm.squeue = (task(20, 7, 0, "COMPLETING", "n01", reason="None")
                    + task(21, 7, 1, "RUNNING", "n02", reason="JobHeldAdmin"))
    backend.poll(T + 1)
    slurm.calls.clear()
    assert backend.execute([Shrink("7", ("n01", "n02"))], T + 1) == []
    assert slurm.commands() == [["scontrol", "requeuehold", "Incomplete", "7_1"]]
    slurm.squeue = (task(20, 7, 0, "CANCELLED", "n01")
                    + task(21, 7, 1, reason="job requeued in held state"))
    slurm.sinfo = nodes(n01="idle", n02="idle")
    events = backend.poll(T + 2)
    assert sorted(e.node for e in events if isinstance(e, WorkerStopped)) == ["n01", "n02"]
    assert "7" in backend.jobs


class ReadBack(FakeSlurm):
    """The poll sees ``squeue``; the read-back after a requeue (``squeue -j``) sees ``after``."""

    def __init__(self) -> None:
        super().__init__()
        self.after = ""

    def _spawn(self, argv, timeout_s, input):  # type: ignore[no-untyped-def]
        result = super()._spawn(argv, timeout_s, input)
        if argv[0] == "squeue" and "-j" in argv:
            result.stdout = self.after
        return result


def recycle(after_cancel: bool) -> ReadBack:
    slurm = ReadBack()
    backend = SlurmBackend(slurm, grant_timeout_s=120)
    running_job(slurm, backend)
    # 7_0 hit its time limit; the poll sees it TIMEOUT and recycles it with requeuehold.
    slurm.squeue = (task(20, 7, 0, "TIMEOUT", "n01", reason="TimeLimit")
                    + task(21, 7, 1, "RUNNING", "n02", reason="JobHeldAdmin"))
    # Meanwhile (or not) the user cancels the array: 7_1 is being killed.
    slurm.after = (task(20, 7, 0, "PENDING", reason="job requeued in held state")
                   + task(21, 7, 1, "COMPLETING" if after_cancel else "RUNNING", "n02"))
    if after_cancel:
        slurm.after = slurm.after.replace("COMPLETING", "CANCELLED")
    slurm.calls.clear()
    backend.poll(T + 1)
    return slurm


def test_a_task_recycled_while_the_user_cancels_is_cancelled_again() -> None:
    slurm = recycle(after_cancel=True)
    assert slurm.commands() == [["scontrol", "requeuehold", "7_0"], ["scancel", "7_0"]]


def test_a_recycled_task_of_a_live_job_stays() -> None:
    slurm = recycle(after_cancel=False)
    assert slurm.commands() == [["scontrol", "requeuehold", "7_0"]]
