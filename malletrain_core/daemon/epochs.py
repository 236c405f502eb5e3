"""The epoch coordinator: which nodes of a job train together, and when that changes.

A job trains in *epochs*. Epoch ``e`` fixes its members (node → rank, rank 0's node is the
master), a master port that is fresh for the epoch and distinct from every other running
epoch, and a rendezvous id; each member's launcher runs ``torchrun`` with a static rendezvous
for exactly that membership. The daemon sets the *target* (the nodes the job holds now, from
the engine) and the launchers check in; the coordinator answers each check-in with an order:

* ``run``        be in epoch ``e`` with this rank, world size, master, port and id;
* ``wait``       no epoch for this node now: stay idle and ask again;
* ``stop``       leave the epoch you run (the job shrank off this node, or a peer was lost);
* ``checkpoint`` ask rank 0 to checkpoint at its next step (before a planned change);
* ``exit``       training finished: the launcher exits.

A planned change (grow, shrink) first asks for a checkpoint and starts epoch ``e+1`` when the
checkpoint is acknowledged or after ``checkpoint_timeout_s``. A lost peer (preemption, a
worker that died) stops the survivors and starts epoch ``e+1`` at once: they resume from the
last checkpoint. New nodes join when every target node has checked in, or after
``join_timeout_s`` with those that have. Launchers that rescale in place start their process
ahead of the epoch and say when it is ready; a ready one waits at most ``join_wait_s`` for the
others still starting, however many grants follow it (each re-form pauses the members and
costs every process CPU time; a joiner kept waiting idles its node).

Pure: time is passed in, randomness comes from an injectable source, nothing here does I/O.
The whole state round-trips through :meth:`EpochCoordinator.to_dict` so the daemon can persist
it and, after a restart, recover the running epochs that the launchers kept training.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ValidationError
from ..wire.checkin import LauncherState
from ..wire.orders import EpochError, Order, OrderKind

log = logging.getLogger(__name__)

KEY_BYTES = 32
LAUNCHER_STATES = tuple(state.value for state in LauncherState)
HISTORY = 32
@dataclass
class Epoch:
    """One membership of a job: ``members[r]`` is the node of rank ``r``."""

    number: int
    members: tuple[str, ...]
    master: str
    port: int
    rdzv_id: str
    started: float
    path: str = "disk"      # how the members entered it: "inplace" (live processes) or "disk"
    abandon: bool = False   # a member of the previous epoch is gone: drop the step in flight


@dataclass
class Launcher:
    """The last check-in of one launcher (one array task on one node)."""

    node: str
    addr: str
    epoch: int | None
    state: LauncherState
    rc: int | None
    seen: float
    ckpt_seen: int = 0
    inplace: bool = False   # its training process stays alive across epochs
    ready: bool = True      # in place: its process is ready to join (imports done)
    ready_since: float | None = None  # in place: when it first checked in ready (not placed)


@dataclass
class JobState:
    """Everything the coordinator knows about one job."""

    job: str
    uid: int
    key: bytes
    target: tuple[str, ...] = ()
    target_since: float = 0.0
    epoch: Epoch | None = None
    next_epoch: int = 0
    launchers: dict[str, Launcher] = field(default_factory=dict)
    ckpt_request: int = 0
    ckpt_requested_at: float | None = None
    ckpt_acked: bool = False
    finished: bool = False
    failed: bool = False
    failures: int = 0
    failed_at: float | None = None
    problem: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    """The last ``HISTORY`` epochs: number, world size, path, abandon, start time."""
    silent: dict[str, int] = field(default_factory=dict)
    """In place: node → the epoch whose survivors found its process silent. Until that
    node's launcher says the process has left, the node is not ready to join (see
    :meth:`EpochCoordinator.checkin`)."""


def in_place(st: JobState, cur: Epoch, nodes: list[str]) -> bool:
    """Can the change to ``nodes`` happen in place? Every launcher involved keeps its
    process alive, and some member of ``cur`` that stays runs it now (holds the state)."""
    return not_in_place(st, cur, nodes) is None

def not_in_place(st: JobState, cur: Epoch, nodes: list[str]) -> str | None:
    """Why the change to ``nodes`` cannot happen in place (None: it can)."""
    unknown = [n for n in nodes if n not in st.launchers]
    if unknown:
        return f"no launcher known on {','.join(unknown)}"
    involved = set(nodes) | set(cur.members)  # lost members' launchers are forgotten
    restart = [n for n, la in st.launchers.items() if n in involved and not la.inplace]
    if restart:
        return f"the launcher on {','.join(restart)} runs the restart path"
    # Any epoch: a running in-place process holds the job's state (or takes it in its
    # epoch's hand-over). Asking for ``cur``'s own number failed after a restart: the
    # state saved before ``cur``'s order went out (see LauncherService.persist) still
    # has the members running the epoch before, and a loss then went through the disk.
    # A member whose process abandoned ``cur`` (a peer went silent while the daemon was
    # away) waits, ready, for the next membership with the state in memory: it counts
    # too. (Were every such process new, the hand-over resumes from the checkpoint.)
    staying = [st.launchers[n] for n in nodes if n in cur.members]
    if any((la.state is LauncherState.RUNNING and la.epoch is not None)
           or (la.state is LauncherState.IDLE and la.ready) for la in staying):
        return None
    return "no member that stays runs a process: " + ", ".join(
        f"{la.node} {la.state.value} epoch {la.epoch}" for la in staying)

def runs_ahead(st: JobState, cur: Epoch) -> bool:
    """Does a member's live process run an epoch newer than ``cur``? Only after a restart
    of the daemon that lost its last epochs (killed before it saved them): the next epoch
    is then started in place for everyone (its number after the newest one reported), so
    the members that were told the lost epoch and those that were not meet again, instead
    of the newer ones being stopped (their processes restarted) as members of an epoch
    that is over."""
    return any(launcher_ahead(la, cur)
               for n, la in st.launchers.items() if n in cur.members or n in st.target)

def launcher_ahead(la: Launcher, cur: Epoch) -> bool:
    """Does ``la``'s live process run an epoch newer than ``cur`` (see :func:`runs_ahead`)?"""
    return la.inplace and la.state is LauncherState.RUNNING and la.epoch is not None \
        and la.epoch > cur.number


def order_for(st: JobState, la: Launcher, max_failures: int) -> Order:
    """The order for launcher ``la`` of job ``st`` now (``max_failures``: epochs failed in a
    row before the job stops)."""
    if st.failed:
        return Order(OrderKind.EXIT, rc=1, reason=f"more than {max_failures} epochs failed "
                     "in a row; see the job's output")
    if st.finished:
        return Order(OrderKind.EXIT, rc=0, reason="training finished")
    cur = st.epoch
    running = la.epoch if la.state is LauncherState.RUNNING else None
    if cur is not None and la.node in cur.members:
        if la.inplace and running is not None and (
                cur.path == "inplace" or running > cur.number
                or (running == cur.number and st.failed_at is not None)):
            # its live process re-forms in place (or waits for the next membership after
            # a peer failed): no stop first
            running = cur.number
            if st.failed_at is not None:
                return Order(OrderKind.RUN, epoch=cur.number, rank=cur.members.index(la.node),
                             world=len(cur.members), master=cur.master, port=cur.port,
                             rdzv_id=cur.rdzv_id, abandon=cur.abandon or None)
        if running is not None and running != cur.number:
            return Order(OrderKind.STOP, epoch=running, reason=f"epoch {running} is over")
        if running is not None and st.failed_at is not None:
            return Order(OrderKind.STOP, epoch=running, reason="a worker of this epoch failed")
        if running == cur.number and st.ckpt_requested_at is not None \
                and la.node == cur.members[0] and la.ckpt_seen < st.ckpt_request:
            return Order(OrderKind.CHECKPOINT, epoch=cur.number, request=st.ckpt_request,
                         reason="membership changes next")
        if la.state is LauncherState.EXITED and la.epoch == cur.number:
            return Order(OrderKind.WAIT, reason="waiting for the next epoch")
        return Order(OrderKind.RUN, epoch=cur.number, rank=cur.members.index(la.node),
                     world=len(cur.members), master=cur.master, port=cur.port,
                     rdzv_id=cur.rdzv_id, abandon=cur.abandon or None)
    if cur is not None and la.node in st.target and launcher_ahead(la, cur):
        return Order(OrderKind.WAIT, reason=f"epoch {running} is newer than this daemon's "
                     f"{cur.number}: the next epoch takes this node in place")
    if running is not None:
        why = "the job left this node" if la.node not in st.target else \
            f"not a member of epoch {cur.number if cur else 'none'}"
        if la.inplace:
            la.ready = False  # its process leaves; the next one must get ready first
        return Order(OrderKind.STOP, epoch=running, reason=why)
    return Order(OrderKind.WAIT, reason=st.problem or "no epoch for this node yet")


def next_free_port(port_range: tuple[int, int], cursor: int,
                   busy: set[int | None]) -> tuple[int, int]:
    """The first port of ``port_range`` from ``cursor`` on (round robin) not in ``busy``, and
    the cursor after it."""
    lo, hi = port_range
    span = hi - lo + 1
    for i in range(span):
        port = lo + (cursor - lo + i) % span
        if port not in busy:
            return port, lo + (port - lo + 1) % span
    raise EpochError(f"no free master port in {lo}-{hi}: every port is used by a running "
                     "epoch; widen the coordinator's port range")


class EpochCoordinator:
    """Per-job epochs, membership targets, launcher check-ins and the orders they get."""

    def __init__(self, port_range: tuple[int, int] = (29500, 29999),
                 checkpoint_timeout_s: float = 60.0, join_timeout_s: float = 30.0,
                 launcher_timeout_s: float = 15.0, max_failures: int = 10,
                 failure_settle_s: float = 5.0,
                 random: Callable[[int], bytes] = os.urandom,
                 join_wait_s: float = 5.0) -> None:
        lo, hi = port_range
        if not 1024 <= lo <= hi <= 65535:
            raise ValidationError("epochs", "port_range", f"{port_range!r} must be LO ≤ HI "
                                  "within 1024-65535")
        if checkpoint_timeout_s <= 0 or join_timeout_s < 0 or launcher_timeout_s <= 0:
            raise ValidationError("epochs", "timeouts", "checkpoint_timeout_s and "
                                  "launcher_timeout_s must be > 0, join_timeout_s ≥ 0")
        if failure_settle_s < 0:
            raise ValidationError("epochs", "failure_settle_s", f"{failure_settle_s!r} must be ≥ 0")
        if not join_wait_s >= 0:
            raise ValidationError("epochs", "join_wait_s", f"{join_wait_s!r} must be ≥ 0")
        if max_failures < 1:
            raise ValidationError("epochs", "max_failures", f"{max_failures!r} must be ≥ 1")
        self.port_range = (lo, hi)
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self.join_timeout_s = join_timeout_s
        self.join_wait_s = join_wait_s
        self.launcher_timeout_s = launcher_timeout_s
        self.max_failures = max_failures
        self.failure_settle_s = failure_settle_s
        self._random = random
        self._jobs: dict[str, JobState] = {}
        self._port_cursor = lo
        self._since: float | None = None  # the first tick of this run (not persisted)

    # ----- the daemon's side -------------------------------------------------------------
    def add_job(self, job: str, uid: int, now: float) -> JobState:
        """Register ``job`` (owned by ``uid``) and draw its per-launch report key."""
        if job in self._jobs:
            return self._jobs[job]
        key = self._random(KEY_BYTES)
        if len(key) != KEY_BYTES:
            raise EpochError(f"random source gave {len(key)} bytes, need {KEY_BYTES}")
        state = JobState(job=job, uid=int(uid), key=key, target_since=now)
        self._jobs[job] = state
        return state

    def remove_job(self, job: str) -> None:
        """Forget ``job`` (it ended); its port returns to the pool."""
        self._jobs.pop(job, None)

    def set_target(self, job: str, nodes: Iterable[str], now: float,
                   lost: Iterable[str] = ()) -> None:
        """The nodes ``job`` holds now; ``lost`` names nodes taken away without warning."""
        st = self._get(job)
        target = tuple(dict.fromkeys(nodes))
        lost_set = set(lost)
        for node in lost_set:
            st.launchers.pop(node, None)
        if set(target) != set(st.target):
            st.target = target
            st.target_since = now
        if st.epoch is not None and lost_set & set(st.epoch.members):
            self._restart(st, now)
        self._plan(st, now)

    def acknowledge_checkpoint(self, job: str, epoch: int, now: float) -> None:
        """A checkpoint was completed in ``epoch`` (a report carried ``ckpt``)."""
        st = self._jobs.get(job)
        if st is None or st.epoch is None or st.epoch.number != epoch:
            return
        if st.ckpt_requested_at is not None:
            st.ckpt_acked = True
        st.failures = 0
        self._plan(st, now)

    def tick(self, now: float) -> None:
        """Apply the checkpoint and join timeouts, and drop silent in-place members."""
        if self._since is None:
            self._since = now
        for st in self._jobs.values():
            self._drop_silent(st, now)
            self._plan(st, now)

    def _drop_silent(self, st: JobState, now: float) -> None:
        """An in-place member whose launcher has not checked in for ``launcher_timeout_s``
        (counted from this run's first tick at the earliest, so that launchers reconnect
        after a daemon restart) is lost while another member still checks in: its peers'
        processes live on (a restart-path worker exits and reports the failure; these wait
        for the next membership), so nothing else would start one. Seen after the daemon
        released such a member to the batch system and died before saving its new epoch."""
        cur, since = st.epoch, self._since if self._since is not None else now
        if cur is None or st.finished or st.failed_at is not None:
            return
        members = [st.launchers.get(n) for n in cur.members]
        if not all(la is not None and la.inplace for la in members):
            return
        silent = [la.node for la in members
                  if la is not None and now - max(la.seen, since) >= self.launcher_timeout_s]
        if silent and len(silent) < len(members):
            for node in silent:
                st.launchers.pop(node, None)
            self._restart(st, now)

    # ----- the launchers' side -----------------------------------------------------------
    def checkin(self, job: str, node: str, now: float, *, epoch: int | None = None,
                state: LauncherState | str = LauncherState.IDLE, rc: int | None = None,
                addr: str = "", ckpt_seen: int = 0, inplace: bool = False,
                ready: bool = True, lost: tuple[int, tuple[int, ...]] | None = None) -> Order:
        """Record a launcher's check-in and return its order. ``lost``: ``(epoch, node
        ranks)`` that the launcher's processes found silent (their heartbeat stopped)."""
        if state not in LAUNCHER_STATES:
            raise ValidationError("checkin", "state", f"{state!r}; use one of "
                                  f"{', '.join(LAUNCHER_STATES)}")
        state = LauncherState(state)
        st = self._get(job)
        known = st.launchers.get(node)
        addr = addr or (known.addr if known is not None else node)
        lost_in = st.silent.get(node)
        if lost_in is not None:
            if state is LauncherState.RUNNING and (epoch is None or epoch <= lost_in):
                # Still the process its peers found silent (hung: its launcher lives on and
                # calls it ready): not ready, so it is told to stop instead of being named
                # in the next epoch, where the others would wait for it to form the group.
                ready = False
            else:
                del st.silent[node]  # that process is gone: the next one joins when ready
        ready_since = None
        if inplace and ready and state is not LauncherState.RUNNING:
            ready_since = known.ready_since if known is not None and known.ready \
                and known.ready_since is not None else now
        st.launchers[node] = Launcher(node=node, addr=addr, epoch=epoch, state=state,
                                      rc=rc, seen=now, ckpt_seen=int(ckpt_seen),
                                      inplace=bool(inplace), ready=bool(ready),
                                      ready_since=ready_since)
        if epoch is not None and epoch >= st.next_epoch:
            # A launcher from a lost coordinator state: never reuse its epoch number, nor a
            # checkpoint request number it has already relayed.
            st.next_epoch = epoch + 1
        st.ckpt_request = max(st.ckpt_request, int(ckpt_seen))
        cur = st.epoch
        if cur is not None and epoch == cur.number and node in cur.members \
                and state is LauncherState.EXITED:
            if rc == 0:
                st.finished = True
            elif st.failed_at is None:
                st.failures += 1  # once per failed epoch, however many workers report it
                if st.failures > self.max_failures:
                    st.finished = st.failed = True
                else:
                    st.failed_at = now  # restart once the survivors are known (see _plan)
        if lost is not None and cur is not None:
            self._silent_peers(st, cur, node, lost, now)
        self._plan(st, now)
        return order_for(st, st.launchers[node], self.max_failures)

    def _silent_peers(self, st: JobState, cur: Epoch, node: str,
                      lost: tuple[int, tuple[int, ...]], now: float) -> None:
        """A member's processes found members of ``cur`` silent (dead, hung, their node gone)
        and abandoned the epoch: they are lost, and the others start the next epoch now
        (``abandon``). Their launchers may still check in (a process hung, its launcher alive:
        held check-ins keep them seen), so the survivors' word is taken; a launcher told it
        is out stops its process, which joins again once ready."""
        epoch, ranks = lost
        if epoch != cur.number or node not in cur.members or st.finished:
            return
        gone = {cur.members[r] for r in ranks if 0 <= r < len(cur.members)} - {node}
        if gone:
            self._lose(st, cur, gone, now)

    def _lose(self, st: JobState, cur: Epoch, nodes: Iterable[str], now: float) -> None:
        """Members of ``cur`` lost (silent, or their launcher gone): forgotten until a launcher
        there checks in anew, and the others start the next epoch now."""
        for n in nodes:
            st.launchers.pop(n, None)
            st.silent[n] = cur.number
        self._restart(st, now)

    def launcher_gone(self, job: str, node: str, now: float) -> bool:
        """The launcher of an in-place member of the current epoch closed its held check-in:
        the batch system ended its task (a preemption, a requeue, a time limit), and its
        processes went with it. The others start the next epoch now (``abandon``) instead of
        when the batch system's word or their heartbeat comes. Nothing for a launcher outside
        the current epoch (a planned leaver, already out), nor when no other member is left
        (the whole job ended: the batch system says so). True when an epoch was started."""
        st = self._jobs.get(job)
        la = st.launchers.get(node) if st is not None else None
        if st is None or la is None or st.finished or st.epoch is None:
            return False
        cur = st.epoch
        if node not in cur.members or not la.inplace or la.state is not LauncherState.RUNNING \
                or la.epoch != cur.number:
            return False
        if not any(n in st.launchers for n in cur.members if n != node):
            return False
        log.info("job=%s node %s: its launcher closed its check-in (its task ended); epoch %d "
                 "goes on without it", job, node, cur.number)
        self._lose(st, cur, (node,), now)
        return st.epoch is not cur

    # ----- queries -----------------------------------------------------------------------
    def jobs(self) -> list[str]:
        return list(self._jobs)

    def state(self, job: str) -> JobState:
        return self._get(job)

    def key(self, job: str) -> bytes:
        """The job's per-launch key for report HMACs."""
        return self._get(job).key

    def owner(self, job: str) -> int | None:
        st = self._jobs.get(job)
        return None if st is None else st.uid

    def current(self, job: str) -> Epoch | None:
        return self._get(job).epoch

    def draining(self, job: str) -> set[str]:
        """Nodes that left the target but still train: release them to the batch system only
        once they are gone from here (after the checkpoint).

        In place that is once the leaver's launcher says its process is gone, not when the
        next epoch starts without it: the process leaves at the next step boundary, together
        with the others, and released before that the batch system kills it inside a step,
        where the survivors wait for it in the step's all-reduce (up to the collective
        timeout for a member that does not talk to it directly). The bridge's ``max_defer_s``
        bounds the wait for a launcher that no longer checks in."""
        st = self._get(job)
        if st.epoch is None:
            return set()
        target = set(st.target)
        leaving = {n for n, la in st.launchers.items()
                   if la.inplace and la.state is LauncherState.RUNNING and n not in target}
        return (set(st.epoch.members) - target) | leaving

    def finished(self, job: str) -> bool:
        return self._get(job).finished

    # ----- internals ---------------------------------------------------------------------
    def _get(self, job: str) -> JobState:
        try:
            return self._jobs[job]
        except KeyError:
            raise EpochError(f"unknown job {job!r}; the daemon registers jobs when it admits "
                             "them") from None

    def _ready(self, st: JobState) -> list[str]:
        members = st.epoch.members if st.epoch is not None else ()
        return [n for n in st.target if n in st.launchers
                and (st.launchers[n].ready or n in members)]

    def _plan(self, st: JobState, now: float) -> None:
        if st.finished:
            return
        ready = self._ready(st)
        if st.epoch is not None and st.failed_at is not None:
            # A worker died: the survivors are the launchers heard from since. Wait until
            # every ready node was heard from, or failure_settle_s, whichever comes first.
            heard = [n for n in ready if st.launchers[n].seen >= st.failed_at]
            if len(heard) == len(ready) or now - st.failed_at >= self.failure_settle_s:
                self._restart(st, now)
            return
        everyone = len(ready) == len(st.target)
        joined = everyone or now - st.target_since >= self.join_timeout_s
        cur = st.epoch
        if cur is None:
            if ready and joined:
                self._start(st, ready, now)
            elif waited := [n for n in ready if self._waited(st, n, now)]:
                self._start(st, waited, now)
            return
        desired = [n for n in ready if n in cur.members or joined
                   or launcher_ahead(st.launchers[n], cur)]
        if not joined:
            early = [n for n in ready if n not in cur.members and self._waited(st, n, now)]
            if early and in_place(st, cur, desired + early):
                desired += early
        if set(desired) == set(cur.members) and not runs_ahead(st, cur):
            st.ckpt_requested_at = None
            return
        if in_place(st, cur, desired):
            self._start(st, desired, now)  # the state stays in the members' memory
            return
        if st.ckpt_requested_at is None:
            st.ckpt_request += 1
            st.ckpt_requested_at = now
            st.ckpt_acked = False
            return
        if st.ckpt_acked or now - st.ckpt_requested_at >= self.checkpoint_timeout_s:
            if desired:
                self._start(st, desired, now)
            else:
                st.epoch = None
                st.ckpt_requested_at = None

    def _waited(self, st: JobState, node: str, now: float) -> bool:
        """Has ``node`` (ready, not yet placed) waited ``join_wait_s`` for the others? Only
        launchers that rescale in place wait so: on the restart path every change stops and
        restarts all the members."""
        la = st.launchers.get(node)
        return la is not None and la.inplace and la.ready_since is not None \
            and now - la.ready_since >= self.join_wait_s

    def _restart(self, st: JobState, now: float) -> None:
        """Unplanned: the survivors (members still checking in) start the next epoch now."""
        if st.epoch is None:
            return
        since = st.failed_at if st.failed_at is not None else now - self.launcher_timeout_s
        alive = {n for n, la in st.launchers.items() if la.seen >= since}
        survivors = [n for n in st.epoch.members if n in alive and n in st.target]
        members = survivors + [n for n in self._ready(st) if n in alive and n not in survivors]
        previous, st.epoch = st.epoch, None
        st.ckpt_requested_at = None
        st.failed_at = None
        if members:
            self._start(st, members, now, previous, lost=True)

    def _start(self, st: JobState, nodes: list[str], now: float,
               previous: Epoch | None = None, lost: bool = False) -> None:
        previous = previous or st.epoch
        if previous is not None:
            keep = [n for n in previous.members if n in nodes]
            nodes = keep + sorted(n for n in nodes if n not in keep)
        number = st.next_epoch
        try:
            port = self._free_port(exclude=previous.port if previous else None,
                                   ignore_job=st.job)
        except EpochError as exc:
            st.problem = str(exc)  # retried at every event; a port frees when an epoch ends
            return
        st.problem = ""
        master = st.launchers[nodes[0]].addr
        why = not_in_place(st, previous, nodes) if previous is not None else None
        inplace = previous is not None and why is None
        if why is not None:
            log.info("job=%s epoch %d on the disk path: %s", st.job, number, why)
        st.epoch = Epoch(number=number, members=tuple(nodes), master=master, port=port,
                         rdzv_id=f"mt-{st.job}-{number}-{self._random(4).hex()}",
                         started=now, path="inplace" if inplace else "disk",
                         abandon=inplace and lost)
        st.next_epoch = number + 1
        st.ckpt_requested_at = None
        st.ckpt_acked = False
        st.history = [*st.history[-(HISTORY - 1):],
                      {"epoch": number, "world": len(nodes), "path": st.epoch.path,
                       "abandon": st.epoch.abandon, "started": now}]

    def _free_port(self, exclude: int | None, ignore_job: str) -> int:
        busy = {s.epoch.port for s in self._jobs.values()
                if s.epoch is not None and s.job != ignore_job} | {exclude}
        port, self._port_cursor = next_free_port(self.port_range, self._port_cursor, busy)
        return port

    # ----- persistence -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot of the whole state (keys as hex)."""
        jobs = {}
        for job, st in self._jobs.items():
            d = asdict(st)
            d["key"] = st.key.hex()
            d["target"] = list(st.target)
            if st.epoch is not None:
                d["epoch"]["members"] = list(st.epoch.members)
            for la in d["launchers"].values():
                la["state"] = LauncherState(la["state"]).value
            jobs[job] = d
        return {"version": 1, "port_range": list(self.port_range),
                "checkpoint_timeout_s": self.checkpoint_timeout_s,
                "join_timeout_s": self.join_timeout_s, "join_wait_s": self.join_wait_s,
                "launcher_timeout_s": self.launcher_timeout_s, "max_failures": self.max_failures,
                "failure_settle_s": self.failure_settle_s,
                "port_cursor": self._port_cursor,
                "jobs": jobs}

    @classmethod
    def from_dict(cls, data: dict[str, Any],
                  random: Callable[[int], bytes] = os.urandom) -> EpochCoordinator:
        """Rebuild a coordinator from :meth:`to_dict` output."""
        if data.get("version") != 1:
            raise EpochError(f"epoch state version {data.get('version')!r} is not supported; "
                             "remove the state file to start afresh")
        lo, hi = data["port_range"]
        co = cls((int(lo), int(hi)), float(data["checkpoint_timeout_s"]),
                 float(data["join_timeout_s"]), float(data["launcher_timeout_s"]),
                 int(data["max_failures"]), float(data["failure_settle_s"]), random,
                 float(data.get("join_wait_s", 5.0)))
        co._port_cursor = int(data["port_cursor"])
        for job, d in data["jobs"].items():
            d = dict(d)
            epoch = d.pop("epoch")
            launchers = d.pop("launchers")
            st = JobState(**{**d, "key": bytes.fromhex(d["key"]), "target": tuple(d["target"])})
            if epoch is not None:
                st.epoch = Epoch(**{**epoch, "members": tuple(epoch["members"])})
            st.launchers = {n: Launcher(**{**la, "state": LauncherState(la["state"])})
                            for n, la in launchers.items()}
            co._jobs[job] = st
        return co
