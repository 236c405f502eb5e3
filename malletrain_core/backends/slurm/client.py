"""How the Slurm backend talks to slurmctld: the reads and actions it makes, behind one protocol.

:class:`SlurmClient` names every call the backend makes; :func:`client_for` picks its
implementation once, when the backend is built:

* :class:`CommandsClient`: Slurm's commands (``squeue``, ``sinfo``, ``scontrol``, ``scancel``)
  through the :class:`~malletrain_core.runner.CommandRunner`;
* :class:`PyslurmReadsClient`: the reads through a pyslurm source
  (:class:`~.pyslurm_reader.PyslurmSource`), the actions through the commands, where pyslurm
  reads but cannot act on this release;
* :class:`PyslurmClient`: reads and actions through the pyslurm source.

Every implementation answers with the same parsed rows and fails with the same
:class:`~malletrain_core.errors.CommandError` (the pyslurm source writes the commands' texts and
errors), so the backend's decisions are written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from ...runner import CommandRunner
from . import parse as sp


class Reading(NamedTuple):
    """One poll's view of Slurm: the partition's nodes, its tasks and the backfill plan."""

    nodes: dict[str, sp.NodeRow]
    tasks: list[sp.TaskRow]
    plan: list[sp.PlanRow]


class SlurmClient(Protocol):
    """The reads and actions of the Slurm backend. An action that Slurm refuses raises a
    CommandError whose stderr is scontrol's (the backend reads which tasks failed from it)."""

    runner: CommandRunner
    """The commands' runner (a pyslurm client runs the commands pyslurm does not replace)."""

    def read(self, partition: str) -> Reading:
        """The poll's three reads: the plan, the nodes, then the partition's tasks."""

    def tasks(self, arrays: Sequence[str]) -> list[sp.TaskRow]:
        """Every task of the arrays ``arrays``, whatever its state."""

    def scontrol(self, verb: str, keys: Sequence[str]) -> None:
        """``scontrol VERB <keys folded into one job list>`` (hold, release, requeuehold
        [Incomplete]) in one call."""

    def grow(self, key: str, node: str, minutes: int) -> None:
        """Pin task ``key`` to ``node``, start time now, a time limit of ``minutes``."""

    def cancel(self, arrays: Sequence[str]) -> None:
        """``scancel`` the whole arrays ``arrays``."""


class PyslurmCalls(Protocol):
    """What a pyslurm source answers (:class:`~.pyslurm_reader.PyslurmSource`): the commands'
    texts and errors, made as RPCs."""

    @property
    def acts(self) -> bool:
        """Whether the actions go through pyslurm too (else only the reads do)."""

    def snapshot(self, partition: str) -> dict[str, str]: ...

    def tasks(self, arrays: Sequence[str]) -> str: ...

    def scontrol(self, verb: str, jobs: str) -> None: ...

    def grow(self, key: str, node: str, minutes: int) -> None: ...

    def cancel(self, arrays: Sequence[str]) -> None: ...


class CommandsClient:
    """Slurm's commands, one process per call."""

    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner

    def read(self, partition: str) -> Reading:
        # The plan first: a job of another partition that starts after it is read shows in
        # sinfo as holding its nodes, instead of vanishing from the plan while sinfo still
        # shows those nodes idle (they would be offered, and a grow would chase the job).
        # Then sinfo before our tasks: a task that starts between the two calls shows as
        # ours, not as a foreign job on a node we offered.
        p = self.runner.run(["squeue", "-h", "-t", "PD", "--start", "-o", sp.PLAN_FORMAT])
        n = self.runner.run(["sinfo", "-h", "-N", "-p", partition, "-o", sp.SINFO_FORMAT])
        q = self.runner.run(["squeue", "-h", "-r", "-t", "all", "-p", partition,
                             "-O", sp.SQUEUE_FORMAT])
        return Reading(sp.parse_sinfo(n.stdout), sp.parse_squeue(q.stdout),
                       sp.parse_plan(p.stdout))

    def tasks(self, arrays: Sequence[str]) -> list[sp.TaskRow]:
        return sp.parse_squeue(self.runner.run(
            ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(arrays), "-O",
             sp.SQUEUE_FORMAT], check=False).stdout)

    def scontrol(self, verb: str, keys: Sequence[str]) -> None:
        self.runner.run(["scontrol", *verb.split(), sp.fold_tasks(keys)])

    def grow(self, key: str, node: str, minutes: int) -> None:
        self.runner.run(["scontrol", "update", f"JobId={key}", f"ReqNodeList={node}",
                         "StartTime=now", f"TimeLimit={minutes}"])

    def cancel(self, arrays: Sequence[str]) -> None:
        self.runner.run(["scancel", *arrays])


class PyslurmReadsClient(CommandsClient):
    """The reads through pyslurm (two RPCs a poll instead of three processes); the actions
    through the commands."""

    def __init__(self, runner: CommandRunner, source: PyslurmCalls) -> None:
        super().__init__(runner)
        self.source = source

    def read(self, partition: str) -> Reading:
        got = self.source.snapshot(partition)
        return Reading(sp.parse_sinfo(got["sinfo"]), sp.parse_squeue(got["squeue"]),
                       sp.parse_plan(got["plan"]))

    def tasks(self, arrays: Sequence[str]) -> list[sp.TaskRow]:
        return sp.parse_squeue(self.source.tasks(arrays))


class PyslurmClient(PyslurmReadsClient):
    """Reads and actions through pyslurm: no Slurm command process at all."""

    def scontrol(self, verb: str, keys: Sequence[str]) -> None:
        self.source.scontrol(verb, sp.fold_tasks(keys))

    def grow(self, key: str, node: str, minutes: int) -> None:
        self.source.grow(key, node, minutes)

    def cancel(self, arrays: Sequence[str]) -> None:
        self.source.cancel(arrays)


def client_for(runner: CommandRunner, source: PyslurmCalls | None = None) -> SlurmClient:
    """The client of a backend: the commands without a pyslurm source; else pyslurm for the
    reads, and for the actions where the source acts (``slurm.pyslurm``, chosen by
    :func:`~.pyslurm_reader.choose`)."""
    if source is None:
        return CommandsClient(runner)
    if source.acts:
        return PyslurmClient(runner, source)
    return PyslurmReadsClient(runner, source)
