"""The PBS backend: PBS's state in, the engine's actions out (OpenPBS; tested on a fake).

**An elastic job is a job array of one-node subjobs** in a preemptable execution queue that is
*enabled but not started* (``started = False``): PBS accepts jobs there but its scheduler never
starts them, so a queued subjob waits until the daemon starts it on the node the allocator
chose, with ``qrun -H (<vnode>) <subjob>`` (operator privilege; the scheduler is bypassed: the
server refuses a job-exclusive vnode but not one whose ncpus another job holds, measured on
OpenPBS 23.06, so the backend itself keeps workers off vnodes running other jobs). The queuejob
hook routes ``qsub -q malletrain -J 1-N -l select=1:...`` there. Why subjobs and not one job
per node: one submission of the user's then holds every worker, each subjob can be started
(qrun), requeued (qrerun) and deleted (qdel) on its own, and it runs as the user without the
daemon ever submitting for them. Why not holds: qhold and qrls act on whole arrays only, never
on subjobs (their man pages), so the queue's stopped state is the hold. pbs_release_nodes is
not needed either: it shrinks a multi-node job, and every worker here is one node. The engine's
id of a job is the array's id (``123[].server``).

* **poll**: ``pbsnodes -a -F json``, then ``qstat -f -F json <queue>`` (the arrays) and
  ``qstat -f -t -F json <queue>`` (their subjobs), reconciled with the previous poll. Events
  in this order: JobSubmitted, NodesReclaimed (a node the engine could use was taken: a worker
  requeued by PBS's preemption, an idle node given to another job, down, or gone),
  WorkerStopped (a worker ended for any other reason, our shrink included), JobEnded,
  NodesIdle (nodes new to the pool), WorkerStarted.
* **execute**: Grow → ``pbsnodes -a -F json`` once (a vnode PBS gave to another job since
  the poll is not started on: WorkerStopped and NodesReclaimed at once), then one ``qrun -a -H
  (<vnode>) <subjob>`` per node; a worker a poll finds sharing its vnode with another queue's
  job is requeued (``qrerun``) and the vnode withdrawn (NodesReclaimed); Shrink → ``qrerun
  <subjob>`` (the subjob goes back to the stopped queue, SIGTERM first, SIGKILL after the
  queue's kill_delay); Finish → ``qdel <array>``; Checkpoint is the epoch coordinator's
  business, not PBS's. Grow's ``time_limit_s`` cannot be applied: PBS cannot change one
  subjob's walltime; preemption reclaims the node instead.

A grow that cannot be carried out (no queued subjob left, qrun refused, not running within
``grant_timeout_s``, started and requeued by PBS) comes back as WorkerStopped for that job and
node; a subjob is not started again on the vnode it left under ``REUSE_SETTLE_S`` ago. No event is sent for a
job after its Finish. A vnode is offered only when it is free (no state bit), runs no job, has
no reservation pending and is not tied to another queue. Hole ends are not read from PBS's
plan: IdleNode.hole_end is None.

The commands it runs are :mod:`.commands`, the reading of PBS's output :mod:`.parse`, the
admin checks :mod:`.checks`.
"""

from __future__ import annotations

import logging

from ...events import (
    EndReason,
    Event,
    Finish,
    Grow,
    IdleNode,
    NodesReclaimed,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from ...runner import CommandRunner
from ..base import REUSE_SETTLE_S, Launch, PollEvents, TaskBackend
from ..states import NodeState, TaskState
from . import parse as pp
from .commands import PbsCommands
from .options import PbsOptions

log = logging.getLogger(__name__)

DEFAULT_QUEUE = PbsOptions.queue


class PbsBackend(TaskBackend):
    """PBS behind the :class:`~malletrain_core.backends.base.Backend` protocol.

    Clock-free: every method takes ``now``. Needs PBS operator privilege (qrun).
    """

    name = "pbs"

    wake_lead_s = 0.2
    """How long the daemon waits after a hook datagram that follows a quiet spell (Slurm's
    backend: 10 ms). A grant here is ``qrun -H``, which runs the subjob on the vnode even when
    PBS has just picked that vnode for a job that is preempting ours and not running yet (seen:
    a worker and the preempting job on one vnode, ncpus -2/2, when the daemon acted 10 ms after
    the requeue's datagram); waiting as long as a burst does gives that job time to start.
    Since then each batch of grows also reads the vnodes again first (:meth:`_grow`)."""

    def __init__(self, runner: CommandRunner, queue: str = DEFAULT_QUEUE,
                 grant_timeout_s: float = PbsOptions.grant_timeout_s,
                 group_resource: str | None = None) -> None:
        PbsOptions(queue=queue, grant_timeout_s=grant_timeout_s).validate()
        super().__init__()
        self.runner = runner
        self.pbs = PbsCommands(runner, queue)
        self.queue = queue
        self.grant_timeout_s = float(grant_timeout_s)
        self.group_resource = group_resource
        """A resources_available key naming a vnode's topology group (e.g. ``switch``)."""
        self._subjobs: dict[str, pp.PbsJob] = {}          # subjob id -> last seen
        self._to_delete: set[str] = set()                 # finished, qdel not yet done
        self._unwanted: dict[str, float] = {}             # shrunk while launching -> until
        self._yielding: dict[str, tuple[str, bool]] = {}  # off a clash -> (vnode, qrerun ok)
        self._runs_at_launch: dict[str, int] = {}         # launching -> run_count at qrun

    def busy(self) -> bool:
        """Also while a worker requeued off a clashing vnode has not left it."""
        return super().busy() or bool(self._yielding)

    def _job_of(self, task: str) -> str:
        seen = self._subjobs.get(task)
        if seen is not None and seen.array_id is not None:
            return str(seen.array_id)
        head, _, rest = task.partition("[")          # 12[3].server -> 12[].server
        return f"{head}[]{rest.partition(']')[2]}" if rest else task

    # ------------------------------------------------------------------ poll
    def poll(self, now: float) -> list[Event]:
        """Reconcile with PBS and return what changed since the last poll."""
        # pbsnodes first: a worker that starts between the two calls then shows as ours.
        nodes = self.pbs.vnodes()
        jobs = self.pbs.jobs()
        for aid in sorted(self._to_delete):
            self._delete(aid)
        arrays = {j.id: j for j in jobs.values() if j.is_array and j.queue == self.queue}
        subjobs: dict[str, list[pp.PbsJob]] = {}
        for j in jobs.values():
            if j.array_id is not None and j.array_id in arrays:
                subjobs.setdefault(j.array_id, []).append(j)
        current = {j.id: j for group in subjobs.values() for j in group}
        our_ids = {j.id for j in jobs.values() if j.queue == self.queue}
        out = PollEvents()
        self._admit_arrays(arrays, subjobs, now, out)
        self._yield_clashes(current, nodes, our_ids)
        self._reconcile_workers(current, now, out)
        self._reconcile_launches(current, nodes, now, out)
        self._reconcile_jobs(subjobs, now, out)
        idle = self._reconcile_nodes(nodes, our_ids, out.reclaimed)
        self._subjobs = current
        self._gone &= set(arrays)
        self._stopping &= set(current)

        return out.ordered(now, idle)

    def _admit_arrays(self, arrays: dict[str, pp.PbsJob],
                      subjobs: dict[str, list[pp.PbsJob]], now: float, out: PollEvents) -> None:
        for aid in sorted(arrays, key=pp.job_number):
            if self._is_new(aid):
                self._admit(aid, pp.job_request(arrays[aid], subjobs.get(aid, [])), now, out)

    def _yield_clashes(self, current: dict[str, pp.PbsJob], nodes: dict[str, pp.PbsNode],
                       our_ids: set[str]) -> None:
        """A worker of ours on a vnode that also runs another queue's job gives it up at once
        (``qrerun``): ``qrun -H`` skips PBS's resource check, so a grant that raced a job PBS
        started there oversubscribes the vnode, and the batch system's job comes first. The
        vnode is then neither ours nor usable, so :meth:`_reconcile_nodes` withdraws it
        (NodesReclaimed), as for a preemption."""
        for sid, (node, _) in list(self._yielding.items()):
            seen = current.get(sid)
            if seen is None or seen.state not in pp.ACTIVE or seen.node != node:
                del self._yielding[sid]
        for sid, sub in sorted(current.items()):
            if sub.state not in pp.ACTIVE or not sub.node \
                    or self._yielding.get(sid, ("", False))[1]:
                continue
            vnode = nodes.get(sub.node)
            others = [j for j in vnode.jobs if j not in our_ids] if vnode is not None else []
            if not others:
                continue
            log.warning("vnode %s runs %s and our subjob %s: requeueing ours (qrerun)",
                        sub.node, ",".join(others), sid)
            self._yielding[sid] = (sub.node, self.pbs.act("qrerun", sid))  # retried if refused
            self._workers.pop(sid, None)
            self._launching.pop(sid, None)
            self._unwanted.pop(sid, None)
            self._stopping.discard(sid)

    def _reconcile_workers(self, current: dict[str, pp.PbsJob], now: float, out: PollEvents) -> None:
        unwanted = set(self._unwanted)
        for sid, until in list(self._unwanted.items()):
            seen = current.get(sid)
            if seen is not None and seen.state is TaskState.RUNNING:
                del self._unwanted[sid]
                self.pbs.act("qrerun", sid)  # started after the engine had shrunk it away
            elif seen is None or seen.state is TaskState.DONE or now >= until:
                del self._unwanted[sid]
        for sid, sub in sorted(current.items()):
            if sub.array_id not in self._jobs or sub.state not in pp.ACTIVE or not sub.node \
                    or sub.requeuing:
                continue
            if sid in unwanted or sid in self._yielding:
                continue
            if sid not in self._workers:
                self._started(self._launching.pop(sid, None), self.grant_timeout_s, now)
                self._workers[sid] = (str(sub.array_id), sub.node)
                out.started.append(WorkerStarted(now, str(sub.array_id), sub.node))
        for sid in list(self._workers):
            seen = current.get(sid)
            # A worker PBS is requeuing is taken as preempted at the poll that sees it (its node
            # reclaimed), not when it shows Q about a second later; in place the survivors wait
            # for the next epoch. (The jobobit hook runs only at the requeue's end, so this
            # helps when a poll falls inside it.) One the daemon itself requeued (a shrink) is
            # waited for as before.
            if seen is not None and seen.state in pp.ACTIVE and seen.node == self._workers[sid][1] \
                    and not (seen.requeuing and sid not in self._stopping):
                continue
            aid, node = self._workers.pop(sid)
            if sid in self._stopping or seen is None or seen.state is TaskState.DONE:
                self._left[sid] = (node, now)  # not when preempted: another job runs there
            if seen is not None and seen.state is TaskState.DONE and seen.exit_status \
                    and sid not in self._stopping:
                log.warning("job %s: subjob %s on %s exited %s; PBS cannot run a finished "
                            "subjob again, so the job can grow to %d nodes at most from now",
                            aid, sid, node, seen.exit_status,
                            sum(1 for j in current.values() if j.array_id == aid
                                and j.state is not TaskState.DONE))
            if sid in self._stopping:
                self._stopping.discard(sid)
                if not self._granted_again(aid, node):
                    out.stopped.append(WorkerStopped(now, aid, node))
            elif seen is not None and (seen.state in (TaskState.PENDING, TaskState.HELD)
                                       or seen.requeuing):
                out.reclaimed.append(node)  # requeued by PBS: preempted
                self._offered.pop(node, None)
            else:
                out.stopped.append(WorkerStopped(now, aid, node))

    def _reconcile_launches(self, current: dict[str, pp.PbsJob], nodes: dict[str, pp.PbsNode],
                            now: float, out: PollEvents) -> None:
        for sid, launch in list(self._launching.items()):
            seen = current.get(sid)
            runs = self._runs_at_launch.get(sid, 0)
            vnode = nodes.get(launch.node)
            # Started and back in the queue on a vnode still usable: not a preemption (that
            # one is a reclaim, :meth:`_reconcile_nodes`) but a failed start.
            bounced = (seen is not None and seen.state is TaskState.PENDING
                       and seen.run_count > runs and vnode is not None
                       and vnode.usable(self.queue))
            if seen is None or seen.state is TaskState.DONE or bounced \
                    or now >= launch.deadline:
                del self._launching[sid]
                self._runs_at_launch.pop(sid, None)
                self._left[sid] = (launch.node, now)
                out.stopped.append(WorkerStopped(now, launch.job_id, launch.node))
                if bounced:
                    log.warning("grant of %s to job %s: subjob %s started and PBS requeued it "
                                "(run_count %d → %d): node offered again", launch.node,
                                launch.job_id, sid, runs, seen.run_count)  # type: ignore[union-attr]
                elif seen is not None and seen.state is not TaskState.DONE:
                    log.warning("grant of %s to job %s: subjob %s not running after %g s "
                                "(state %s): node offered again", launch.node, launch.job_id,
                                sid, self.grant_timeout_s, seen.code)
        for sid in [s for s in self._runs_at_launch if s not in self._launching]:
            del self._runs_at_launch[sid]

    def _reconcile_jobs(self, subjobs: dict[str, list[pp.PbsJob]], now: float,
                        out: PollEvents) -> None:
        """A job ends when a worker exited 0 (training done) or the array is gone."""
        for aid in list(self._jobs):
            group = subjobs.get(aid)
            last = group if group is not None else [
                j for j in self._subjobs.values() if j.array_id == aid]
            exits = {j.exit_status for j in last if j.state is TaskState.DONE}
            if 0 in exits:
                reason = EndReason.COMPLETED
            elif group is not None:
                continue
            elif exits:
                reason = EndReason.FAILED
            else:
                reason = EndReason.CANCELLED  # gone with no worker done: deleted (qdel)
            self._close(aid, reason, now, out)

    def _reconcile_nodes(self, nodes: dict[str, pp.PbsNode], our_ids: set[str],
                         reclaimed: list[str]) -> list[IdleNode]:
        """Update the offered pool; returns the NodesIdle entries. A vnode still held only by
        subjobs of our queue (a worker exiting or being requeued) is neither new nor lost."""
        ours = {node for _, node in self._workers.values()}
        launching = {launch.node for launch in self._launching.values()}
        just_lost = set(reclaimed)
        idle: list[IdleNode] = []
        for name in sorted(nodes):
            vnode = nodes[name]
            usable = vnode.usable(self.queue)
            if name in ours or (name in launching and name in self._offered):
                if name not in self._offered:  # a worker we did not start (daemon restart)
                    idle.append(self._idle(vnode))
                    self._offered[name] = None
                if name in ours or usable:
                    continue
            elif usable and name not in just_lost:
                if name not in self._offered:
                    idle.append(self._idle(vnode))
                    self._offered[name] = None
                continue
            elif (name in self._offered and vnode.jobs and set(vnode.jobs) <= our_ids
                  and vnode.state is not NodeState.DOWN):
                continue
            self._withdraw(name, reclaimed)
            for sid in [s for s, la in self._launching.items() if la.node == name]:
                del self._launching[sid]  # the engine drops it with NodesReclaimed
        for name in sorted(set(self._offered) - set(nodes)):
            self._withdraw(name, reclaimed)
        return idle

    def _idle(self, vnode: pp.PbsNode) -> IdleNode:
        group = vnode.resources.get(self.group_resource) if self.group_resource else None
        return IdleNode(vnode.name, None, str(group) if group is not None else None)

    def _shrink(self, shrinks: list[Shrink], now: float, events: list[Event]) -> None:
        for action in shrinks:
            self._shrink_one(action, now, events)

    def _shrink_one(self, action: Shrink, now: float, events: list[Event]) -> None:
        for node in action.nodes:
            sid = self._task_on(action.job_id, node)  # the one granted since, if any
            if sid is None:
                log.warning("shrink of job %s on %s: no worker there", action.job_id, node)
                continue
            if sid in self._launching:  # qrun sent, not running yet: requeue it once it is
                del self._launching[sid]
                self._unwanted[sid] = now + self.grant_timeout_s
                events.append(WorkerStopped(now, action.job_id, node))
                continue
            if sid in self._stopping:
                continue
            if self.pbs.act("qrerun", sid):
                self._stopping.add(sid)
                self._left[sid] = (node, now)
            else:
                events.append(WorkerStarted(now, action.job_id, node))  # still running there

    def _grow(self, grows: list[Grow], now: float, events: list[Event]) -> None:
        if not any(action.nodes for action in grows):
            return
        # The vnodes read again once per batch of grows: the engine decided on the last poll's
        # view, and ``qrun -H`` would run a subjob on a vnode that PBS has given to another job
        # since (seen: a preempting job started 0.7 s before the grant, both ran on one vnode
        # with ncpus -2/2). None when pbsnodes did not answer: the grows go ahead and the next
        # poll's clash check (:meth:`_yield_clashes`) undoes any that collided.
        fresh = self.pbs.fresh_vnodes()
        taken: list[str] = []
        for action in grows:
            events += self._grow_one(action, now, fresh, taken)
        if taken:
            events.append(NodesReclaimed(now, tuple(sorted(set(taken)))))

    def _grow_one(self, action: Grow, now: float, fresh: dict[str, pp.PbsNode] | None,
                  taken_nodes: list[str]) -> list[Event]:
        taken = set(self._workers) | set(self._launching) | self._stopping | set(self._unwanted)
        free = sorted((s for s, j in self._subjobs.items()
                       if j.array_id == action.job_id and j.state is TaskState.PENDING
                       and s not in taken), key=lambda s: self._subjobs[s].index or 0)
        failed: list[Event] = []
        for node in action.nodes:
            if action.job_id not in self._jobs or not free:
                log.warning("grow of %s on %s: no queued subjob left", action.job_id, node)
                failed.append(WorkerStopped(now, action.job_id, node))
                continue
            why = pp.taken(fresh.get(node), self._subjobs, self.queue) \
                if fresh is not None else None
            if why:
                log.info("grow of %s on %s: not started, PBS has taken the vnode since the last "
                         "poll (%s)", action.job_id, node, why)
                failed.append(WorkerStopped(now, action.job_id, node))
                self._withdraw(node, taken_nodes)
                continue
            sid = self._pick(free, node, now)
            if sid is None:
                log.info("grow of %s on %s: its queued subjobs left that vnode under %g s ago "
                         "(its mom may still be ending them): vnode given back, offered again "
                         "by a later poll", action.job_id, node, REUSE_SETTLE_S)
                failed.append(WorkerStopped(now, action.job_id, node))
                self._withdraw(node, taken_nodes)
                continue
            if self.pbs.act("qrun", "-a", "-H", f"({node})", sid):
                self._launching[sid] = Launch(action.job_id, node, now + self.grant_timeout_s)
                self._runs_at_launch[sid] = self._subjobs[sid].run_count
            else:
                failed.append(WorkerStopped(now, action.job_id, node))
        return failed

    def _finish(self, finishes: list[Finish]) -> None:
        for action in finishes:
            self._end(action.job_id)
            self._delete(action.job_id)

    def _delete(self, aid: str) -> None:
        """``qdel`` the array; retried at the next poll when PBS did not answer."""
        self._to_delete.discard(aid)
        if not self.pbs.qdel(aid):
            self._to_delete.add(aid)
