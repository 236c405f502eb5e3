"""Releasing a process held in an operation of an abandoned gloo group.

DDP's collectives and the step agreement are polled (:class:`~.pending._Pending`), so the
control thread's abandonment ends them at once. FSDP2 runs its collectives itself and waits
for them in the main thread, in C++: a process can stay in one whose peer is alive but will
never take part, a node's sibling that failed its own part of the step and left for the next
epoch. Seen under HSDP on real Slurm (2 processes a node, one of two nodes preempted): one
process failed its cross-replica all-reduce on the lost node's connection and went to the
next epoch's rendezvous; its sibling stayed in a collective of FSDP2's with it until the
rendezvous gave up (60 s), and the node was started again from the checkpoint. Letting go of
the group on the leaver's side does not release the sibling when the leaver's group is not
freed at once (:func:`~..sharded.state.let_go_of_groups`), and
shutting the leaver's sockets leaves a sibling that is sending in gloo's ``waitSend``.

What does release it is its own side: once an epoch has been abandoned for
:data:`RELEASE_AFTER_S`, outside an operation whose outcome the participants must share and
its grace (:meth:`~.pending._Pending.shared`: the HSDP step barrier), the control
thread shuts down (``shutdown(SHUT_RDWR)``, the descriptors stay gloo's) this process's
connections of the groups formed for that epoch and before; the operation fails at once with
gloo's "Connection closed by peer", as a lost peer's would, and the step is dropped. A process
that is not held but waits for the next membership (the daemon down) has the same connections
shut down: nothing runs on them any more, and a peer held on them is freed too.
Measured with two gloo processes, one never joining: all-reduce, send, recv and
reduce-scatter, 1 kB and 40 MB, all failed 1.0 s after the shutdown at 1.0 s.

A group's connections are the TCP sockets the process opened while it formed the group and
handed the state over (the mesh's subgroups included), less those of the stores (their ports
are the memberships'). Sockets a script opens itself in another thread during a re-form would
be counted too; those of groups a script makes later are not, and hold it as before.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

RELEASE_AFTER_S = 2.0
"""How long an abandoned epoch's operations may hold the main thread before the control thread
shuts its group's connections down. An operation the control thread can abandon has ended by
then; the others are of a group that is done with."""
KEEP_EPOCHS = 4  # the groups whose connections are remembered (the newest epochs)


def _connection(fd: int) -> tuple[socket.socket, int, int] | None:
    """A duplicate of ``fd`` and its (local, remote) ports when it is a connected TCP socket
    (the caller closes the duplicate); else None. Asked of the socket itself: reading
    ``/proc/self/net/tcp`` walks the whole namespace's table (10 ms measured here, on a pause's
    path at every re-form)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            return sock, sock.getsockname()[1], sock.getpeername()[1]
    except OSError:   # not connected (a listener)
        pass
    sock.close()
    return None


def socket_fds() -> dict[int, int]:
    """This process's socket descriptors: inode → descriptor."""
    out: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            link = os.readlink(f"/proc/self/fd/{name}")
            if link.startswith("socket:["):
                out[int(link[8:-1])] = int(name)
    return out


def shut_down(inodes: Iterable[int], keep_ports: set[int]) -> int:
    """Shut down each of ``inodes`` that is still an open, established TCP connection of this
    process and on none of ``keep_ports``; the descriptors stay open (their owner closes them).
    Returns how many were shut down."""
    fds = socket_fds()
    done = 0
    for inode in sorted(set(inodes) & set(fds)):
        found = _connection(fds[inode])
        if found is None:
            continue
        sock, local, remote = found
        try:
            # the number closed and reused since the listing: not that connection
            if os.fstat(sock.fileno()).st_ino == inode and not {local, remote} & keep_ports:
                sock.shutdown(socket.SHUT_RDWR)
                done += 1
        except OSError:
            pass
        finally:
            sock.close()
    return done


class GroupSockets:
    """The connections of each epoch's group, and their release (see the module).

    The main thread calls :meth:`opening` before it forms a group and :meth:`opened` once
    the state is handed over; the control thread calls :meth:`check` at every poll."""

    def __init__(self, after_s: float = RELEASE_AFTER_S) -> None:
        self.after_s = after_s
        self.by_epoch: dict[int, set[int]] = {}
        self._lock = threading.Lock()  # by_epoch: written by the main thread, read by check
        self._before: set[int] = set()
        self._released: float | None = None  # the abandonment already released

    def opening(self) -> None:
        self._before = set(socket_fds())

    def opened(self, epoch: int, store_ports: set[int]) -> None:
        new = set()
        for inode, fd in socket_fds().items():
            found = None if inode in self._before else _connection(fd)
            if found is not None:
                found[0].close()
                if not set(found[1:]) & store_ports:
                    new.add(inode)
        with self._lock:
            self.by_epoch[epoch] = self.by_epoch.get(epoch, set()) | new
            for old in sorted(self.by_epoch)[:-KEEP_EPOCHS]:
                del self.by_epoch[old]

    def check(self, pending: Any, store_ports: set[int], now: float | None = None) -> int:
        """Shut down the connections of the groups of ``pending``'s epoch and before once it
        has been abandoned :attr:`after_s` (once per abandonment); how many were. Under the
        pending operations' lock, so the main thread cannot start on a new group meanwhile."""
        now = time.monotonic() if now is None else now
        with pending.lock:
            at, epoch = pending.abandoned_at, pending.epoch
            if pending.reason is None or at is None or epoch is None or pending.graced \
                    or now < pending.quiet_until or at == self._released \
                    or now - at < self.after_s:
                return 0
            self._released = at
            with self._lock:
                inodes = set().union(*(s for e, s in self.by_epoch.items() if e <= epoch))
            done = shut_down(inodes, store_ports)
        if done:
            print(f"malletrain: epoch {epoch}: abandoned {now - at:.1f} s ago and its group "
                  f"not let go yet; shut down {done} connection(s) of it (an operation held "
                  "on it fails at once)", file=sys.stderr, flush=True)
        return done
