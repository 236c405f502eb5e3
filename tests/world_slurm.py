"""A simulated Slurm at the subprocess boundary, for the backend contract suite.

:class:`SlurmSim` answers the commands :class:`SlurmBackend` runs from an in-memory state, in
the formats Slurm 22.05 prints (tests/golden/slurm/22.05/ is loaded into it and rendered back
line for line by tests/test_backend_contract.py), and changes that state on ``scontrol
update/release/hold/requeuehold`` and ``scancel`` as Slurm does for held array tasks.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from malletrain_core.backends.slurm import parse as sp
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.runner import CommandRunner

PARTITION = "preemptable"
RUNNING_PRIORITY = "4294901758"  # what 22.05 shows for a released, running task


@dataclass
class Task:
    """One line of the poll's squeue: the fields as Slurm prints them."""

    job_id: str
    array_id: str
    index: str
    state: str
    node: str
    limit: str
    restarts: str
    priority: str
    user: str
    reason: str
    comment: str
    wanted: str = ""  # ReqNodeList

    @property
    def key(self) -> str:
        return f"{self.array_id}_{self.index}"

    def line(self) -> str:
        return "|".join((self.job_id, self.array_id, self.index, self.state, self.node,
                         self.limit, self.restarts, self.priority, self.user, self.reason,
                         self.comment))


def duration(minutes: int) -> str:
    """A TimeLimit as squeue prints it: ``1:00`` (1 min), ``59:00``, ``1:00:00``, ``3-00:00:00``."""
    d, rest = divmod(minutes, 1440)
    h, m = divmod(rest, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:00"
    return f"{h}:{m:02d}:00" if h else f"{m}:00"


class SlurmSim(CommandRunner):
    """Slurm's partition ``preemptable``: nodes and MalleTrain's held arrays; a World of the
    contract suite (tests/backend_contract.py)."""

    name = "slurm"

    def __init__(self, deferred: bool = False) -> None:
        super().__init__()
        self.deferred = deferred
        """Released tasks start at the next scheduling pass (the next poll's sinfo), not at
        once: what a shrink between a grow and that pass meets is a task still pending."""
        self.nodes: dict[str, str] = {}    # name -> sinfo state
        self.tasks: dict[str, Task] = {}   # A_i -> task
        self.next_id = 1
        self.calls: list[list[str]] = []

    @classmethod
    def from_capture(cls, squeue: str, sinfo: str) -> SlurmSim:
        """The state a captured poll shows."""
        sim = cls()
        for line in sinfo.splitlines():
            name, _, state = line.partition("|")
            sim.nodes[name] = state
        for line in squeue.splitlines():
            task = Task(*line.split("|", 10))
            sim.tasks[task.key] = task
        return sim

    # ------------------------------------------------------------------ rendering
    def squeue(self) -> str:
        return "".join(t.line() + "\n" for t in self.tasks.values())

    def sinfo(self) -> str:
        return "".join(f"{n}|{s}\n" for n, s in sorted(self.nodes.items()))

    def plan(self) -> str:
        return "".join(f"{t.key}|{t.array_id}|N/A|(null)|{PARTITION}\n"
                       for t in self.tasks.values() if t.state == "PENDING")

    # ------------------------------------------------------------------ the world
    def submit(self, min_nodes: int, max_nodes: int, owner: str) -> str:
        """``sbatch -N LO-HI`` through job_submit.lua: a user-held array of HI tasks."""
        aid = str(self.next_id)
        self.next_id += 1
        for i in range(max_nodes):
            task = Task(aid, aid, str(i), "PENDING", "", "UNLIMITED", "0", "0", owner,
                        "JobHeldUser", f"malletrain:min={min_nodes},max={max_nodes}")
            self.tasks[task.key] = task
        return aid

    def take(self, node: str) -> None:
        """A production job starts on ``node``, preempting (requeuing) a task there."""
        for t in self.tasks.values():
            if t.state == "RUNNING" and t.node == node:
                held = t.priority == "0"
                t.state, t.node, t.restarts = "PENDING", "", str(int(t.restarts) + 1)
                t.priority, t.reason = ("0", "JobHeldAdmin") if held else ("1", "BeginTime")
        self.nodes[node] = "allocated"

    def free(self, node: str) -> None:
        self.nodes[node] = "idle"

    add_node = free

    def cancel(self, aid: str) -> None:
        """``scancel`` by the owner."""
        self.end(aid, "CANCELLED")

    def running(self, aid: str) -> set[str]:
        return {t.node for t in self.tasks.values() if t.array_id == aid and t.state == "RUNNING"}

    def backend(self) -> SlurmBackend:
        return SlurmBackend(self, partition=PARTITION, grant_timeout_s=120)

    def end(self, aid: str, state: str) -> None:
        """Every task of array ``aid`` that is not done ends as ``state``."""
        for t in self.tasks.values():
            if t.array_id == aid and t.state not in ("COMPLETED", "CANCELLED", "TIMEOUT"):
                if t.state == "RUNNING":
                    self.nodes[t.node] = "idle"
                t.state = state

    def complete(self, aid: str) -> None:
        """Training done: the running workers exit 0, the held tasks stay."""
        for t in self.tasks.values():
            if t.array_id == aid and t.state == "RUNNING":
                self.nodes[t.node] = "idle"
                t.state = "COMPLETED"

    # ------------------------------------------------------------------ commands
    def _spawn(self, argv: list[str], timeout_s: float,
               input: str | None) -> subprocess.CompletedProcess[str]:  # noqa: A002
        self.calls.append(list(argv))
        out, err = "", []
        if argv[0] == "sinfo":
            assert argv[-1] == sp.SINFO_FORMAT and PARTITION in argv
            self.schedule()
            out = self.sinfo()
        elif argv[0] == "squeue" and "--start" in argv:
            assert argv[-1] == sp.PLAN_FORMAT
            out = self.plan()
        elif argv[0] == "squeue" and "-j" in argv:  # the read-back of recycled tasks
            assert argv[-1] == sp.SQUEUE_FORMAT
            arrays = set(argv[argv.index("-j") + 1].split(","))
            out = "".join(t.line() + "\n" for t in self.tasks.values() if t.array_id in arrays)
        elif argv[0] == "squeue":
            assert argv[-1] == sp.SQUEUE_FORMAT and PARTITION in argv
            out = self.squeue()
        elif argv[:2] == ["scontrol", "update"]:
            fields = dict(a.split("=", 1) for a in argv[2:])
            task = self.tasks.get(fields["JobId"])
            if task is None or task.state != "PENDING":
                err.append(f"{fields['JobId']}: Invalid job id specified")
            else:
                task.wanted = fields["ReqNodeList"]
                task.limit = duration(int(fields["TimeLimit"]))
        elif argv[0] == "scontrol":
            incomplete = len(argv) == 4 and argv[2] == "Incomplete"
            listed = argv[3] if incomplete else argv[2] if len(argv) == 3 else ""
            for key in sp.expand_task_ids(listed) if listed else []:
                problem = self._scontrol(argv[1], key, incomplete)
                if problem:
                    err.append(f"{key}: {problem}")
        elif argv[0] == "scancel":
            for aid in argv[1:]:
                live = [t for t in self.tasks.values() if t.array_id == aid]
                if not live:
                    err.append(f"scancel: error: Kill job error on job id {aid}: "
                               "Invalid job id specified")
                elif all(t.state in ("COMPLETED", "CANCELLED") for t in live):
                    err.append(f"scancel: error: Kill job error on job id {aid}: "
                               "Job/step already completing or completed")
                self.end(aid, "CANCELLED")
        else:
            raise FileNotFoundError(argv[0])
        return subprocess.CompletedProcess(argv, 1 if err else 0, out, "".join(
            e + "\n" for e in err))

    def schedule(self) -> None:
        """A scheduling pass: released tasks start on their requested node when it is idle."""
        for t in self.tasks.values():
            node = t.wanted
            if t.state == "PENDING" and t.priority != "0" and node and \
                    self.nodes.get(node) == "idle":
                if t.job_id == t.array_id:  # a task split off its array gets its own id
                    t.job_id = str(1000 + len(self.calls))
                t.state, t.node, t.priority = "RUNNING", node, RUNNING_PRIORITY
                self.nodes[node] = "allocated"

    def _scontrol(self, verb: str, key: str, incomplete: bool = False) -> str:
        """One task of a batched ``scontrol VERB [Incomplete] list``; returns the error, ""
        when done. With ``Incomplete`` Slurm requeues only a running task and does nothing,
        successfully, to any other."""
        t = self.tasks.get(key)
        if t is None:
            return "Invalid job id specified"
        if verb == "hold":
            t.priority = "0"
            t.reason = "JobHeldAdmin"
        elif verb == "release":
            t.priority = "1"
            t.reason = "None"
            if not self.deferred:
                self.schedule()
        elif verb == "requeuehold":
            if incomplete and t.state != "RUNNING":
                return ""
            if t.state not in ("RUNNING", "TIMEOUT"):
                return "Job is pending execution"
            if t.state == "RUNNING":
                self.nodes[t.node] = "idle"
            t.state, t.node, t.restarts = "PENDING", "", str(int(t.restarts) + 1)
            t.priority, t.reason = "0", "job requeued in held state"
        else:
            raise AssertionError(f"scontrol {verb}: not a command the backend runs")
        return ""
