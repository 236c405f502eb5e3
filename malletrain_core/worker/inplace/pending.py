"""The collectives in flight on the current group, which the control thread may fail.

A hung peer never fails an operation by itself (only the collective timeout would): the
control thread abandons what is pending when the membership or the heartbeat says so, and
the step in flight sees :class:`StepAbandoned` at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

KEEP_WORKS_S = 60.0  # how long a finished collective stays referenced (see _Pending)
NAP_S = (5e-5, 2e-3)  # polling a collective: the first nap, doubled up to the last


class StepAbandoned(RuntimeError):
    """The step in flight was abandoned because the membership changed under it."""


class _Pending:
    """The operations in flight on the current group, which the control thread may fail.

    No Python code ever runs on gloo's threads, and this process keeps a reference to every
    work it issued until the group's threads are joined (:meth:`release`). Without both, a
    gloo thread could need the GIL while the main thread, holding it, joins that thread in the
    group's destructor: a deadlock seen about once in 900 re-forms under load (a gloo thread
    freeing a finished work's tensors waited for the GIL; the main thread, freeing the old DDP
    and with it the group, waited for that thread). So DDP's comm-hook futures are completed
    by a thread of this process that polls the works (:meth:`_complete`), not by callbacks."""

    def __init__(self, device_sync: bool = False) -> None:
        self.device_sync = device_sync
        """NCCL: a work's future completes when the collective is queued on its stream, not
        when it has run (measured on an H100: 11 of 12 reads too early, 5 of 12 stale). So
        before a result is used, ``work.wait()`` puts the collective before the caller's
        stream; a host read (``int(t[0])``, ``.cpu()``) then waits for it. Gloo's works are
        done when their futures are."""
        self.lock = threading.Lock()
        self.reason: str | None = None
        self.abandoned_at: float | None = None  # when :attr:`reason` was set (monotonic)
        self.graced = 0  # shared-outcome operations in flight (:meth:`shared`)
        self.quiet_until = 0.0  # and the grace after the last one ended (monotonic)
        self.epoch: int | None = None  # the epoch whose group the operations run on
        self.works: list[tuple[float, Any]] = []  # (issued at, work) on the current group
        self._prune_at = 256
        # (work, its future, out, bucket, world)
        self._inflight: list[tuple[Any, Any, Any, Any, int]] = []
        self._wake = threading.Condition(self.lock)
        self._thread: threading.Thread | None = None
        self._closed = False

    def reset(self, epoch: int | None = None) -> None:
        """Start on the operations of ``epoch``'s group (None: not known)."""
        with self.lock:
            self.reason, self._inflight, self.epoch = None, [], epoch
            self.abandoned_at = None

    def release(self) -> list[Any]:
        """Hand over this group's works (the caller drops them once the group's threads are
        joined, or keeps them with an abandoned group)."""
        with self.lock:
            works, self.works, self._prune_at = self.works, [], 256
        return [w for _, w in works]

    def _keep(self, work: Any) -> None:
        """Hold ``work`` (under the lock); works finished over a minute ago are let go, since
        gloo's threads let go of a work as soon as it finishes."""
        now = time.monotonic()
        self.works.append((now, work))
        if len(self.works) > self._prune_at:
            self.works = [(t, w) for t, w in self.works
                          if now - t < KEEP_WORKS_S or not w.is_completed()]
            self._prune_at = max(256, 2 * len(self.works))

    def close(self) -> None:
        """Stop the completing thread and wait for it: a daemon thread that completes a future
        while the interpreter finalizes is ended inside torch's C++ frames, which aborts the
        process (seen: a worker's SIGABRT and core dump at its normal exit)."""
        with self.lock:
            self._closed = True
            self._wake.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def abandon(self, reason: str, epoch: int | None = None) -> bool:
        """Fail the operations in flight and any issued later, until :meth:`reset`; with
        ``epoch``, only those of that epoch's group (a loss found in an epoch this process has
        already left must not fail the next one's). Returns whether they were abandoned."""
        with self.lock:
            if epoch is not None and epoch != self.epoch:
                return False
            if self.reason is None:
                self.abandoned_at = time.monotonic()
            self.reason = reason
            for _, _, out, _, _ in self._inflight:
                if not out.done():
                    out.set_exception(StepAbandoned(reason))
            self._inflight = []
        return True

    def hook(self, _state: object, bucket: Any) -> Any:
        """A DDP comm hook (average all-reduce) whose result the control thread can fail."""
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        world = dist.get_world_size()
        out: Any = torch.futures.Future()
        with self.lock:
            if self.reason is not None:
                out.set_exception(StepAbandoned(self.reason))
                return out
            work = dist.all_reduce(buf, async_op=True)
            self._keep(work)
            self._inflight.append((work, work.get_future(), out, buf, world))
            if self._thread is None:
                self._thread = threading.Thread(target=self._complete, daemon=True,
                                                name="malletrain-allreduce")
                self._thread.start()
            self._wake.notify()
        return out

    def _complete(self) -> None:
        """Complete each hook's future once its all-reduce is done (polled, see the class)."""
        nap = NAP_S[0]
        while True:
            with self.lock:
                while not self._inflight and not self._closed:
                    self._wake.wait()
                    nap = NAP_S[0]
                if self._closed:
                    return
                finished = self._finish()
            if finished:
                nap = NAP_S[0]
            else:
                time.sleep(nap)
                nap = min(nap * 2, NAP_S[1])

    def _finish(self) -> bool:
        """Complete the futures of the all-reduces that are done (under the lock); whether
        there were any.

        No reference to a work outlives this call (all are locals here), and the lock is held
        throughout: until :meth:`release` (under the lock too) hands the works to the thread
        that lets their group go, :attr:`works` holds each of them, so what is dropped here is
        never a work's last reference. The last one can hold the old group's gloo context and
        the store its process hosted, whose destructor joins the store's thread (which was
        seen in a 5-s reverse DNS lookup, see :func:`.store.listen_on`): seen freed here,
        a loop variable left over from an epoch's last step, when the next epoch's first
        all-reduce completed, stopping that step for 4.9 s."""
        finished = [i for i in self._inflight if i[1].done()]
        for item in finished:
            self._inflight.remove(item)
            work, fut, out, buf, world = item
            if out.done():  # abandoned meanwhile
                continue
            try:
                fut.value()
                if self.device_sync:
                    work.wait()  # the division runs after the all-reduce on the GPU
                out.set_result(buf.div_(world))
            except Exception as exc:  # the peer's failure reaches the step
                out.set_exception(exc)
        return bool(finished)

    @contextlib.contextmanager
    def shared(self, grace_s: float) -> Iterator[None]:
        """Around an operation whose outcome every participant must share, issued and waited
        for inside: its group's connections are not shut down (:mod:`.release`) while it is in
        flight nor ``grace_s`` after it ends, by when a participant still finishing it has
        finished or given up on it itself."""
        with self.lock:
            self.graced += 1
        try:
            yield
        finally:
            with self.lock:
                self.graced -= 1
                self.quiet_until = max(self.quiet_until, time.monotonic() + grace_s)

    def track(self, work: Any) -> Any:
        with self.lock:
            self._keep(work)
        return work

    def wait(self, work: Any, grace_s: float = 0.0) -> None:
        """Wait for ``work``; raise :class:`StepAbandoned` if the control thread abandons it,
        or, with ``grace_s``, if it is not done that long after (an operation whose outcome
        every participant must share: :func:`~..sharded.heal.step_barrier`).

        Polls instead of attaching a Python callback to the work's future (see the class)."""
        fut = work.get_future()
        nap = NAP_S[0]
        give_up: float | None = None
        while not fut.done():
            if self.reason is not None:
                now = time.monotonic()
                give_up = now + grace_s if give_up is None else give_up
                if now >= give_up:
                    raise StepAbandoned(self.reason)
            time.sleep(nap)
            nap = min(nap * 2, NAP_S[1])
        fut.value()  # raises the collective's own error (a peer lost)
        if self.device_sync:
            work.wait()  # a host read of the result now waits for the collective itself

