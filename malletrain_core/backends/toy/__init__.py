"""A toy batch system and its backend: the worked example of docs/extending.md.

:class:`ToyCluster` is a batch system of its own, small enough to read in one sitting: nodes
that are free, taken by another job or down, and elastic jobs of one-node tasks that are
queued, running or done. Its state lives in memory, or in a JSON file (``path``) so that a
second process (a shell, a test) can submit jobs to a ``malletraind`` running with
``daemon.batch_system = "toy"``. Nothing runs on the nodes: a started task is only
marked running. Use it to try MalleTrain without Slurm or PBS, never on a cluster.

:class:`ToyBackend` is what a real backend writes on top of the shared bookkeeping of
:class:`~malletrain_core.backends.base.TaskBackend`: read the state (``poll``), start, stop
and end tasks (``_grow``, ``_shrink``, ``_finish``) and name a task's job (``_job_of``).
Like the others it keeps no state of its own between restarts: a new backend's first poll
reports every live job, every usable node and node running a worker, and every worker.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...config import Config
from ...errors import ValidationError
from ...events import (
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    JobRequest,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from ..base import Launch, PollEvents, TaskBackend
from ..system import BatchSystem

FREE, TAKEN, DOWN = "free", "taken", "down"              # node states
QUEUED, RUNNING, DONE = "queued", "running", "done"      # task states


@dataclass
class ToyJob:
    """An elastic job: ``max_nodes`` one-node tasks; ``end`` is "", completed or cancelled."""

    min_nodes: int
    max_nodes: int
    owner: str
    tasks: dict[str, list[str]] = field(default_factory=dict)  # task id -> [state, node]
    end: str = ""


class ToyCluster:
    """The toy batch system: every call reads the state, changes it and writes it back."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.nodes: dict[str, str] = {}
        self.jobs: dict[str, ToyJob] = {}
        self.read()

    def read(self) -> ToyCluster:
        """The state as it is now (another process may have changed the file)."""
        if self.path is not None and self.path.exists():
            doc = json.loads(self.path.read_text())
            self.nodes = doc["nodes"]
            self.jobs = {j: ToyJob(**v) for j, v in doc["jobs"].items()}
        return self

    def _save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"nodes": self.nodes, "jobs": {j: asdict(v) for j, v in self.jobs.items()}}
            self.path.write_text(json.dumps(doc, indent=1))

    def _task(self, task: str) -> list[str]:
        self.read()
        job = self.jobs.get(task.rsplit(".", 1)[0])
        if job is None or task not in job.tasks or job.end:
            raise ValidationError("toy", "task", f"{task!r} is not a task of a live job")
        return job.tasks[task]

    # ---------------------------------------------------------------- what users do
    def set_node(self, node: str, state: str) -> None:
        """Add a node, or set it free, taken (by another job: a task there is requeued) or
        down."""
        if state not in (FREE, TAKEN, DOWN):
            raise ValidationError("toy", "node state", f"{state!r}; use {FREE!r}, {TAKEN!r} "
                                  f"or {DOWN!r}")
        self.read()
        for job in self.jobs.values():
            for entry in job.tasks.values():
                if state != FREE and entry == [RUNNING, node]:
                    entry[:] = [QUEUED, ""]
        self.nodes[node] = state
        self._save()

    def submit(self, min_nodes: int, max_nodes: int, owner: str = "") -> str:
        """A new elastic job of ``max_nodes`` queued tasks; returns its id."""
        if not 1 <= min_nodes <= max_nodes:
            raise ValidationError("toy", "job", f"min_nodes={min_nodes}, max_nodes={max_nodes}: "
                                  "give 1 <= min_nodes <= max_nodes")
        self.read()
        job_id = next(f"t{n}" for n in itertools.count(len(self.jobs) + 1)
                      if f"t{n}" not in self.jobs)
        tasks = {f"{job_id}.{i}": [QUEUED, ""] for i in range(max_nodes)}
        self.jobs[job_id] = ToyJob(min_nodes, max_nodes, owner, tasks)
        self._save()
        return job_id

    def end(self, job_id: str, how: str = EndReason.CANCELLED.value) -> None:
        """End a job (``completed``: training done; ``cancelled``): every task is done."""
        self.read()
        job = self.jobs.get(job_id)
        if job is None or how not in (EndReason.COMPLETED.value, EndReason.CANCELLED.value):
            raise ValidationError("toy", "end", f"{job_id!r} as {how!r}: name one of the jobs "
                                  f"{sorted(self.jobs)} and \"completed\" or \"cancelled\"")
        for entry in job.tasks.values():
            if entry[0] == RUNNING:
                self.nodes[entry[1]] = FREE
            entry[0] = DONE
        job.end = job.end or how
        self._save()

    # ---------------------------------------------------------------- what the backend does
    def start(self, task: str, node: str) -> None:
        entry = self._task(task)
        if entry[0] != QUEUED or self.nodes.get(node) != FREE:
            raise ValidationError("toy", "start", f"{task} cannot start on {node}")
        entry[:] = [RUNNING, node]
        self.nodes[node] = TAKEN
        self._save()

    def requeue(self, task: str) -> None:
        entry = self._task(task)
        if entry[0] == RUNNING:
            self.nodes[entry[1]] = FREE
            entry[:] = [QUEUED, ""]
            self._save()


class ToyBackend(TaskBackend):
    """The toy batch system behind the Backend protocol. A task id is ``<job>.<index>``."""

    name = "toy"

    def __init__(self, cluster: ToyCluster) -> None:
        super().__init__()
        self.cluster = cluster

    def _job_of(self, task: str) -> str:
        return task.rsplit(".", 1)[0]

    def poll(self, now: float) -> list[Event]:
        jobs, out = self.cluster.read().jobs, PollEvents()
        for job_id, job in jobs.items():
            if self._is_new(job_id) and not job.end:
                self._admit(job_id, JobRequest(job_id, min_nodes=job.min_nodes,
                                               max_nodes=job.max_nodes, owner=job.owner), now, out)
        running = {t: (j, e[1]) for j, job in jobs.items() if j in self._jobs
                   for t, e in job.tasks.items() if e[0] == RUNNING}
        for task, (job_id, node) in running.items():
            if task not in self._workers:
                self._launching.pop(task, None)
                self._workers[task] = (job_id, node)
                out.started.append(WorkerStarted(now, job_id, node))
        for task in [t for t in self._workers if t not in running]:
            job_id, node = self._workers.pop(task)
            if task in self._stopping or self.cluster.nodes.get(node) == FREE:
                out.stopped.append(WorkerStopped(now, job_id, node))  # we or it stopped it
            else:
                out.reclaimed.append(node)  # requeued because the node was taken
                self._offered.pop(node, None)
            self._stopping.discard(task)
        for task in [t for t in self._launching if t not in running]:
            launch = self._launching.pop(task)  # requeued before it was seen running: its
            if self.cluster.nodes.get(launch.node) == FREE:  # node is reclaimed, or free
                out.stopped.append(WorkerStopped(now, launch.job_id, launch.node))
        for job_id in [j for j in self._jobs if j not in jobs or jobs[j].end]:
            self._close(job_id, EndReason(jobs[job_id].end if job_id in jobs else "cancelled"),
                        now, out)
        ours = {node for _, node in self._workers.values()}
        idle = [IdleNode(n) for n, state in sorted(self.cluster.nodes.items())
                if (state == FREE or n in ours) and n not in self._offered
                and n not in out.reclaimed]
        self._offered.update((node.name, None) for node in idle)
        for node, state in sorted(self.cluster.nodes.items()):
            if state != FREE and node not in ours:
                self._withdraw(node, out.reclaimed)
        return out.ordered(now, idle)

    def _grow(self, grows: list[Grow], now: float, events: list[Event]) -> None:
        for action in grows:
            busy = set(self._workers) | set(self._launching) | self._stopping
            job = self.cluster.jobs.get(action.job_id)
            free = [t for t, e in job.tasks.items() if e[0] == QUEUED and t not in busy] \
                if job is not None and action.job_id in self._jobs else []
            for node in action.nodes:
                try:
                    task = free.pop(0)
                    self.cluster.start(task, node)
                except (IndexError, ValidationError):
                    events.append(WorkerStopped(now, action.job_id, node))  # a failed grow
                    continue
                self._launching[task] = Launch(action.job_id, node, now)

    def _shrink(self, shrinks: list[Shrink], now: float, events: list[Event]) -> None:
        for action in shrinks:
            for node in action.nodes:
                task = self._task_on(action.job_id, node)
                if task is None:
                    continue
                self.cluster.requeue(task)
                if self._launching.pop(task, None) is not None:  # not seen running yet
                    events.append(WorkerStopped(now, action.job_id, node))
                else:
                    self._stopping.add(task)

    def _finish(self, finishes: list[Finish]) -> None:
        for action in finishes:
            self._end(action.job_id)
            if action.job_id in self.cluster.jobs:
                self.cluster.end(action.job_id)


def from_config(config: Config) -> ToyBackend:
    """``daemon.batch_system = "toy"``: the cluster's state in ``<state_dir>/toy-cluster.json``."""
    return ToyBackend(ToyCluster(Path(config.daemon.state_dir) / "toy-cluster.json"))


SYSTEM = BatchSystem(from_config)
