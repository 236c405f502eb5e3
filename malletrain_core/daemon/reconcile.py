"""What the first poll after a restart means for an engine recovered from the journal, and
the check after every poll that the engine's nodes are where the batch system runs its tasks.

The journal holds what the engine decided, not what the batch system did with it: a daemon
killed between journalling a grow and carrying it out comes back holding a node no worker
started on; one killed before a shrink reached the batch system comes back with a worker the
engine no longer gives the job. The first poll reports every running worker and every offered
node, so the difference is known then; :func:`after_restart` turns it into events and shrinks,
which the daemon's cycle (:mod:`.core`) feeds to the engine and carries out.

After that, every cycle that polled ends with :func:`view_fixes`: the engine's node → job
map against the backend's :class:`~malletrain_core.interfaces.TaskView` of the same moment. A
difference (a shrink Slurm refused, a task released behind the daemon's back, a worker
reported that the engine never granted) is corrected in that cycle, with one line.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ..events import Event, NodesIdle, NodesReclaimed, Shrink, WorkerStarted, WorkerStopped
from ..interfaces import TaskView

log = logging.getLogger(__name__)


def after_restart(held: Mapping[str, str], events: Sequence[Event], now: float,
                  fresh: bool = False) -> tuple[list[Event], list[Shrink]]:
    """The events and shrinks that reconcile an engine holding ``held`` (node → job) with the
    first poll's ``events``: a grow whose worker never started is taken back and the node
    offered again (so that the engine re-plans), a shrink that never reached the batch system
    is made again.

    A ``fresh`` daemon (no state: a first start, or a state database that was lost or moved
    aside as corrupt) holds no node, so every worker still running is one it did not grant:
    each is shrunk (requeue-held, its job resumes from its checkpoint on the nodes the engine
    then grants), never left training where the engine offers the node to others."""
    held = dict(held)
    running = {(e.job_id, e.node) for e in events if isinstance(e, WorkerStarted)}
    if fresh and running:
        log.warning("%d workers run that this daemon, started without state, did not "
                    "grant: they are shrunk and their jobs planned again", len(running))
    offered = {n.name: n for e in events if isinstance(e, NodesIdle) for n in e.nodes}
    lost = [] if fresh else [node for node, job in sorted(held.items())
                             if (job, node) not in running]
    out: list[Event] = []
    if lost:
        log.warning("no worker on %s after the restart: the grows there are dropped",
                    ",".join(lost))
        out.append(NodesReclaimed(now, tuple(lost)))
        back = tuple(offered[n] for n in lost if n in offered)
        if back:
            out.append(NodesIdle(now, back))
    undone: dict[str, list[str]] = {}
    for job, node in sorted(running):
        if held.get(node) != job:
            undone.setdefault(job, []).append(node)
    shrinks = [Shrink(job, tuple(nodes)) for job, nodes in undone.items()]
    for action in shrinks:
        log.warning("job %s: shrink %s again after the restart", action.job_id,
                    ",".join(action.nodes))
    return out, shrinks


def view_fixes(held: Mapping[str, str], view: TaskView, now: float
               ) -> tuple[list[Event], list[Shrink]]:
    """The events and shrinks that make the engine's nodes (``held``: node → job) agree with
    the tasks the batch system runs (``view``), and one warning saying what differed; nothing
    when they agree.

    A task running or starting for a job on a node the engine does not give that job is shrunk
    (as after a restart without state): the engine may plan that node for another job, whose
    task would wait there behind it. A node the engine gives a job where no task of the job runs
    or starts is taken from the job: WorkerStopped where the node is still offered (it stays
    the engine's, idle), NodesReclaimed where it is not."""
    unordered: dict[str, list[str]] = {}
    for job, node in sorted(view.running):
        if held.get(node) != job:
            unordered.setdefault(job, []).append(node)
    empty = sorted((job, node) for node, job in held.items() if (job, node) not in view.running)
    if not unordered and not empty:
        return [], []
    said = [f"job {job} runs on {','.join(nodes)}, which the engine does not give it (shrunk)"
            for job, nodes in unordered.items()]
    said += [f"job {job} holds {node} where none of its tasks runs (taken from it)"
             for job, node in empty]
    log.warning("the engine's nodes differed from the batch system's tasks: %s", "; ".join(said))
    events: list[Event] = [WorkerStopped(now, job, node) if node in view.offered
                           else NodesReclaimed(now, (node,)) for job, node in empty]
    return events, [Shrink(job, tuple(nodes)) for job, nodes in unordered.items()]
