"""The control channel of one training process: the membership file and the heartbeat.

A control thread reads each new membership the launcher writes (:meth:`ControlWatch.run`),
the heartbeat finds silent peers (:meth:`ControlWatch.peer_silent`), and the node's processes
tell each other of a lost peer (the control folder's ``lost`` file). Each of them may abandon
the operations in flight on the process's current group; none of them changes the group,
which only the main thread re-forms.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..control import LOST_NAME, MEMBERSHIP_NAME, Membership, read_membership, write_peers_lost
from ..heartbeat import Lost
from .pending import _Pending
from .release import GroupSockets


class ControlWatch:
    """What one process was told, and what it does about it off the main thread.

    ``group()`` gives the process's group as it is now (epoch, rank, world; epoch None
    before the first); ``host(m)`` hosts the store of ``m``'s epoch (its rank 0);
    ``leave(code, why)`` ends the process (no membership came in time)."""

    def __init__(self, control_dir: Path | None, local_rank: int, local_world: int,
                 poll_s: float, wait_membership_s: float, pending: _Pending,
                 group: Callable[[], tuple[int | None, int, int]],
                 host: Callable[[Membership], Any], leave: Callable[[int, str], None],
                 release: GroupSockets | None = None) -> None:
        self.control_dir = control_dir
        self.local_rank, self.local_world = local_rank, local_world
        self.poll_s = poll_s
        self.wait_membership_s = wait_membership_s
        self.pending = pending
        self.group = group
        self.host = host
        self.leave = leave
        self.release = release
        self.store_ports: set[int] = set()  # every store told of (:mod:`.release` keeps them)
        self._latest: Membership | None = None
        self._latest_lock = threading.Lock()
        self._told: dict[int, Membership] = {}  # the memberships read, by epoch (the last 8)
        self.lost_epoch = -1  # the newest epoch, not yet formed, found to have a silent peer
        self.told_lost: int | None = None  # the epoch this process said it lost a peer in
        self.let_go: int | None = None  # the epoch whose group this process tore down to re-form

    def run(self, stop: threading.Event) -> None:
        """The control thread: read each new membership, abandon the epoch it says to."""
        assert self.control_dir is not None
        path = self.control_dir / MEMBERSHIP_NAME
        seen: tuple[int, int] | None = None
        while not stop.wait(self.poll_s):
            if self.local_world > 1:
                self.sibling_lost()
            if self.release is not None:
                self.release.check(self.pending, self.store_ports)
            try:
                st = path.stat()
            except OSError:
                continue
            if (st.st_mtime_ns, st.st_ino) == seen:
                continue
            seen = (st.st_mtime_ns, st.st_ino)
            m = read_membership(self.control_dir)
            if m is None:
                continue
            m = m.for_process(self.local_rank, self.local_world)
            self._remember(m)
            with self._latest_lock:
                if self._latest is None or m.epoch > self._latest.epoch:
                    self._latest = m
            epoch = self.group()[0]
            if m.abandon and epoch is not None and m.epoch > epoch:
                self.pending.abandon(f"epoch {m.epoch} replaces epoch {epoch} "
                                      "(a peer was lost)")

    def sibling_lost(self) -> None:
        """Abandon this epoch's operations when another process of this node lost a peer in
        it (:meth:`tell_siblings`). Measured without it (2 nodes × 3 processes, one node
        SIGKILLed, the next epoch without ``abandon``, which is what a planned shrink whose
        leaver Slurm kills at once gives): one process failed at once, its two siblings
        waited in the step agreement for the whole collective timeout (20 s)."""
        assert self.control_dir is not None
        try:
            lost = int((self.control_dir / LOST_NAME).read_text())
        except (OSError, ValueError):
            return
        if lost == self.group()[0] and lost != self.told_lost and self.pending.reason is None:
            self.pending.abandon(f"epoch {lost}: another process of this node lost a peer",
                                  lost)

    def tell_siblings(self) -> None:
        """A peer failed this process's collective: tell the node's other processes (the
        control folder's ``lost`` file), whose operations may wait on this one."""
        epoch = self.group()[0]
        if self.local_world <= 1 or self.control_dir is None or epoch is None \
                or self.told_lost == epoch:
            return
        self.told_lost = epoch
        tmp = self.control_dir / f".{LOST_NAME}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            tmp.write_text(f"{epoch}\n")
            os.replace(tmp, self.control_dir / LOST_NAME)

    def _remember(self, m: Membership) -> None:
        """Keep ``m`` for :meth:`_formed` (the heartbeat's view of this process's epoch)."""
        self._told[m.epoch] = m
        self.store_ports.add(m.port)
        for old in sorted(self._told)[:-8]:
            del self._told[old]

    def _formed(self) -> Membership | None:
        """The membership of the epoch this process's group was formed for, or None (none
        yet, or the group is let go: the process is re-forming). The epoch let go is not
        watched: its rank 0 shut its store down as it left, and that store's silence, found
        while a re-form waited (for a joiner not told yet: the daemon died between two
        launchers), was once taken for a lost peer, which cut the new epoch's wait for that
        joiner from TOLD_WAIT_S to the normal bound (CI: the grow's epoch abandoned)."""
        epoch, rank, world = self.group()
        if epoch is None or epoch == self.let_go:
            return None
        m = self._told.get(epoch)
        if m is None or (m.rank, m.world) != (rank, world):
            return None
        return m

    def coming(self) -> Membership | None:
        """The epoch this process re-forms into: the newest membership told, once it is newer
        than the group's and names this process (None otherwise)."""
        m = self.newest()
        epoch = self.group()[0]
        if m is None or m.leave or (epoch is not None and m.epoch <= epoch):
            return None
        return m

    def watched(self) -> list[Membership | None]:
        """The epochs the heartbeat watches: the one the group was formed for and, from the
        moment it is told, the one this process re-forms into (see :meth:`peer_silent`)."""
        return [self._formed(), self.coming()]

    def replaced(self, m: Membership) -> bool:
        """Whether forming ``m`` is pointless: a newer membership was told, or a peer of
        ``m``'s epoch was found silent (the daemon names the next epoch without it)."""
        newer = self.newest()
        return (newer is not None and newer.epoch > m.epoch) or self.lost_epoch >= m.epoch

    def peer_silent(self, lost: Lost) -> None:
        """The heartbeat found a peer silent (dead, hung, its node gone), in the epoch this
        process trains in or in the one it re-forms into: abandon that epoch now, without
        waiting for an order, and tell the launcher which nodes (``peers_lost``), so the
        daemon, up or back, names the next epoch at once.
        Measured before (3 one-process nodes, one SIGKILLed, no ``abandon`` order: the daemon
        down, or a planned shrink whose leaver was killed first): one survivor failed at once,
        the other waited the whole collective timeout (20 s in the tests, up to 60 s).

        A peer silent while a newer epoch is told was once left alone (the process was
        "leaving that epoch anyway"): the step agreement then waited for it until the
        collective timeout, and the re-form into the newer epoch, which names it too, for it
        to come (bench/campaign.py: a sigstop during a re-form took 30.3 s, the whole stop).
        Now the epoch trained in is abandoned whenever its group is still this process's
        (only its own operations: :meth:`.pending._Pending.abandon`), and the epoch re-formed
        into is watched from the moment it is told, so a peer silent in it is named in it, the
        epoch the daemon holds current."""
        coming = self.coming()
        if lost.epoch == self.group()[0]:
            if not self.pending.abandon(lost.why, lost.epoch):
                return  # already re-forming into a newer epoch: the operations are gone
            tell = coming is None  # else the daemon has moved on; the newer epoch is watched
        elif coming is not None and lost.epoch == coming.epoch:
            self.lost_epoch = max(self.lost_epoch, lost.epoch)  # its re-form gives up
            self.pending.abandon(lost.why, lost.epoch)  # and its group, if just made
            tell = True
        else:
            return  # an epoch this process has left
        print(f"malletrain: {lost.why}; abandoning epoch {lost.epoch}", file=sys.stderr,
              flush=True)
        if tell and self.control_dir is not None:
            nodes = sorted({r // self.local_world for r in lost.ranks})
            with contextlib.suppress(OSError):
                write_peers_lost(self.control_dir, lost.epoch, nodes)

    def newest(self) -> Membership | None:
        with self._latest_lock:
            return self._latest

    def await_epoch(self, epoch: int) -> Membership:
        """The newest membership once its epoch is ``epoch`` or later (leaves past the wait)."""
        deadline = time.monotonic() + self.wait_membership_s
        while True:
            m = self.newest()
            if m is not None and m.epoch >= epoch:
                return m
            if time.monotonic() > deadline:
                self.leave(3, f"no membership for epoch ≥ {epoch} within "
                               f"{self.wait_membership_s:g} s")
            time.sleep(self.poll_s / 2)

    # ----- the group ----------------------------------------------------------------------

    def host_coming(self, m: Membership) -> None:
        """The heartbeat's call before it meets the store of ``m``'s epoch, in which this
        process is rank 0: host it now if it is the epoch this process re-forms into, so that
        its members can beat there (and check in) while this process finishes its step."""
        coming = self.coming()
        if coming is not None and coming.epoch == m.epoch:
            self.host(coming)
