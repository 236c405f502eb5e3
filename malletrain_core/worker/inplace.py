"""Rescaling in place: the training processes stay alive across membership changes.

The launcher writes each new membership (epoch, rank, world size, the daemon's fresh master and
port) atomically into ``membership.json`` in the control folder. :class:`Elastic` watches that
file from a control thread and, at step boundaries, re-forms the gloo group, re-wraps DDP,
hands the training state from the most advanced member to everyone else (digest-checked),
and applies the learning-rate rule. A script opts in with a few lines::

    session = training.Session()
    model, optimizer = build()
    el = inplace.Elastic(session, model, optimizer, lr_for=lambda world: 0.1 * world)
    for step in el.steps(total=1000):         # the global step; re-forms happen between steps
        with el.guard():                      # a step abandoned by a lost peer is retried
            loss = loss_fn(el.net(x(step, el.rank)), y)
            optimizer.zero_grad(); loss.backward(); optimizer.step()
        session.report(samples=batch * el.world)

The membership names NODES (the daemon's rank and world are a node's rank and the node count).
``malletrain-run --inplace --nproc-per-node N`` starts N processes per node with ``LOCAL_RANK``
and ``LOCAL_WORLD_SIZE``; each reads the node's file and takes the global rank
``node rank × N + LOCAL_RANK`` in a group of ``node count × N`` (:meth:`Membership.for_process`),
so a node's processes all re-form at the same epoch, and each writes its own ready file.

Planned changes (grow, shrink) stop every member at the same step boundary: after each step
the members all-reduce the newest epoch any of them has been told about, so no step is lost.
A lost peer (SIGKILL) fails the collective in flight at once; a hung peer is abandoned when the
membership says so (``abandon``): the control thread fails the DDP comm hook's futures and the
boundary agreement, the step in flight is dropped (at most one step lost) and the survivors
re-form. The collective timeout (60 s at most) is only the backstop. A process that still
holds an abandoned gloo operation cannot exit cleanly, so it leaves with ``os._exit``.

Kept in one module (over 400 lines) on purpose: the re-form, the state hand-over and the abandon
path share the process group's lifecycle and the control thread's state.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import hashlib
import io
import os
import queue
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from . import training
from .control import (  # the control-file format, also importable from here as before
    LOST_NAME,
    MEMBERSHIP_NAME,
    READY_NAME,  # noqa: F401
    Membership,
    is_ready,  # noqa: F401
    local_layout,
    read_membership,
    ready_name,
    write_membership,  # noqa: F401
    write_peers_lost,
)
from .heartbeat import Heartbeat, Lost, peer_timeout_s
from .startup import ddp_without_dynamo

MAX_COLLECTIVE_TIMEOUT_S = 60.0
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
        seen in a 5-s reverse DNS lookup, see :func:`listen_on`): seen freed here,
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

    def track(self, work: Any) -> Any:
        with self.lock:
            self._keep(work)
        return work

    def wait(self, work: Any) -> None:
        """Wait for ``work``; raise :class:`StepAbandoned` if the control thread abandons it.

        Polls instead of attaching a Python callback to the work's future (see the class)."""
        fut = work.get_future()
        nap = NAP_S[0]
        while not fut.done():
            if self.reason is not None:
                raise StepAbandoned(self.reason)
            time.sleep(nap)
            nap = min(nap * 2, NAP_S[1])
        fut.value()  # raises the collective's own error (a peer lost)
        if self.device_sync:
            work.wait()  # a host read of the result now waits for the collective itself


class _GaveUp(Exception):
    """A store call given up on: the epoch it served was replaced or found lost."""


class _StoreCalls:
    """The main thread's store calls while it forms a group, each waited for only as long as
    its epoch is still wanted (``give_up()`` false). A call to the store of a stopped process
    never returns: torch's TCPStore client has no timeout on ``check`` nor on connecting
    (measured: both still blocked after 6 s, with a 2-s store timeout; the kernel accepts the
    connection for the stopped process), so the members of an epoch whose rank 0 was stopped
    while they met at its store waited there for the whole stop. One worker thread makes the
    calls in turn; one left in a hung call is replaced by a new one."""

    NAP_S = 0.01

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] | None = None

    def call(self, fn: Callable[[], Any], give_up: Callable[[], bool]) -> Any:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._jobs,), daemon=True,
                             name="malletrain-store-calls").start()
        done = threading.Event()
        box: list[tuple[Any, BaseException | None]] = []
        self._jobs.put((fn, box, done))
        while not done.wait(self.NAP_S):
            if give_up():
                self._jobs.put(None)  # that worker ends when its call returns, if ever
                self._jobs = None
                raise _GaveUp
        value, error = box[0]
        if error is not None:
            raise error
        return value

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Any]) -> None:
        while (job := jobs.get()) is not None:
            fn, box, done = job
            try:
                box.append((fn(), None))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                box.append((None, exc))
            done.set()
            del job, fn, box, done


@dataclass(eq=False)
class _Abandoned:
    """A group left with an operation pending (see :meth:`Elastic._teardown`): kept
    referenced, so that no destructor waits for that operation, until :meth:`ended`."""

    group: Any
    store: Any
    net: Any
    works: list[Any]

    def ended(self) -> bool:
        """Whether every operation issued on the group has ended (done, failed by a lost
        peer, or timed out): shutting it down then waits for nothing."""
        return all(w.is_completed() for w in self.works)


class _Retiring:
    """The previous epoch's group, let go in a thread of its own while the next one trains.

    Shutting an NCCL communicator down takes 0.45-0.50 s and aborting one 1.0 s on an H100
    whatever the settings; a group formed beside it trains at once (measured: a re-form in
    0.015-0.053 s, thousands of all-reduces on the new group during the old one's tear-down).
    The thread runs ``shutdown()`` (``abort()`` for an abandoned NCCL operation), then drops
    the old DDP, the group and its store, and only then the works they ran (a work freed
    before its group's threads are joined can need the GIL on a gloo thread, see
    :class:`_Pending`)."""

    def __init__(self, kind: str, epoch: int | None, backend: str, parts: list[Any],
                 works: list[Any]) -> None:
        self.kind, self.epoch, self.backend = kind, epoch, backend
        self.started = time.monotonic()
        self.seconds: float | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._parts, self._works = parts, works   # [old net, group, store]
        self.thread = threading.Thread(target=self._run, name=f"malletrain-{kind}",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            let_go = _abort_group if self.kind == "abort" else _shutdown_group
            if self._parts[1] is not None:
                let_go(self._parts[1])
        except BaseException as exc:  # noqa: BLE001 - reported by Elastic._settle_retiring
            # kept as text: the exception's traceback would hold the group (its frames) and
            # this object (a cycle that only a full garbage collection frees), and with the
            # group its sockets and its gloo thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._parts.clear()   # frees the old DDP, the group and its store
            self._works.clear()   # then the works its threads ran
            self.seconds = time.monotonic() - self.started
            self.done.set()

    def summary(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "kind": self.kind,
                "seconds": round(self.seconds or 0.0, 4), "error": self.error}


class PortCycle:
    """Master ports handed out in turn from ``lo``-``hi``, as the daemon hands them out from
    ``[epochs] port_min-port_max``, skipping any that cannot be bound on ``host`` now: for
    whatever stands in for the daemon (the benches, the tests). Keep the range below Linux's
    ephemeral range (``net.ipv4.ip_local_port_range``, 32768- by default): a port bound to 0
    and let go can be taken by a connection's local end, and its TIME_WAIT then keeps the
    group's store from listening for up to 60 s."""

    def __init__(self, lo: int, hi: int, start: int | None = None,
                 host: str = "127.0.0.1") -> None:
        self.lo, self.hi, self.host = lo, hi, host
        self._next = lo if start is None else lo + (start - lo) % (hi - lo + 1)

    def __call__(self) -> int:
        span = self.hi - self.lo + 1
        for _ in range(span):
            port, self._next = self._next, self.lo + (self._next - self.lo + 1) % span
            with socket.socket() as s:
                try:
                    s.bind((self.host, port))
                except OSError:
                    continue
            return port
        raise RuntimeError(f"no port of {self.lo}-{self.hi} can be bound on {self.host}")


def listen_on(master: str, port: int) -> int | None:
    """A socket listening on ``master``'s own address (its first, as it resolves) at ``port``,
    for the epoch's store to serve on (its file descriptor, which the store then owns); None
    where that cannot be bound, and the store listens as it does by default.

    By default the store listens on a dual-stack socket on every interface, where an IPv4
    member's address reads as ``::ffff:a.b.c.d``; the store's thread formats each member's
    address with a reverse name lookup, which for that form misses ``/etc/hosts``' IPv4 lines
    and goes to DNS. A resolver that does not answer then held the store for 5 s, and its
    destructor, which joins that thread with the GIL held, stopped the whole process (its peers
    found rank 0 silent): measured on this project's test machine,
    a store freed while two clients kept connecting, 40 times: 5 of 40 took over 1 s (5.1 s
    at most) on the default socket, none (1 ms at most) on one bound here. Members reach the
    store at ``master`` anyway, so nothing else need listen."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(master, port,
                                                          type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        return None
    return sock.detach()


def _one_line(exc: BaseException) -> str:
    """An exception's last line of text (c10d's errors run over several)."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def _shutdown_group(group: Any) -> None:
    """Shut a forgotten group down (what ``destroy_process_group`` does to it)."""
    group.shutdown()


def _abort_group(group: Any) -> None:
    """Abort a forgotten group's communicators, which ends the operations they hold (NCCL)."""
    group.abort()


CONFIG_ERRORS = (
    ("Duplicate GPU", "two ranks on one GPU: give each process its own device "
     "(LOCAL_RANK, CUDA_VISIBLE_DEVICES; malletrain-run --nproc-per-node at most the GPUs)"),
    ("invalid device ordinal", "this process's LOCAL_RANK names a GPU this node does not "
     "have: --nproc-per-node at most the visible GPUs"),
    ("ncclInvalidUsage", "NCCL refused how it was called (ncclInvalidUsage): a setup error, "
     "not a lost peer"),
    ("ncclInvalidArgument", "NCCL refused an argument (ncclInvalidArgument): a setup error, not "
     "a lost peer"),
    ("No backend type associated with device type", "a collective on a tensor of the wrong "
     "device for this group's backend (a CPU tensor on NCCL)"),
)
"""Texts of errors that no new epoch can cure: the job fails with the explanation instead of
waiting for a membership change that would meet the same error."""


def configuration_error(exc: BaseException) -> str:
    """The explanation of a setup error in ``exc`` ("" for anything else, a lost peer)."""
    text = str(exc)
    return next((why for marker, why in CONFIG_ERRORS if marker in text), "")


def bind_device() -> int:
    """Bind this process to its GPU for NCCL and return the device index: the only one
    ``CUDA_VISIBLE_DEVICES`` leaves it, else ``LOCAL_RANK`` (the launcher's local rank, or
    ``SLURM_LOCALID`` / ``PALS_LOCAL_RANKID`` where the site starts one process per GPU)."""
    import torch

    count = torch.cuda.device_count()
    if count < 1:
        raise RuntimeError("malletrain: backend nccl, but this process sees no GPU "
                           "(CUDA_VISIBLE_DEVICES, the node's driver); use --device cpu/gloo")
    local = next((int(os.environ[v]) for v in ("LOCAL_RANK", "SLURM_LOCALID",
                                                 "PALS_LOCAL_RANKID")
                  if os.environ.get(v, "").isdigit()), 0)
    index = 0 if count == 1 else local
    if index >= count:
        raise RuntimeError(f"malletrain: local rank {local} but {count} GPUs visible: "
                           "--nproc-per-node at most the GPUs of a node")
    torch.cuda.set_device(index)
    return index


def _accepts(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (a store's host, before c10d connects)."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def abandon_action(backend: str) -> str:
    """How a group holding an abandoned operation is let go, by its backend's name:
    ``"abort"`` for NCCL (its communicators can be aborted, which ends the operations they
    hold), ``"forget"`` for gloo and anything else (an abandoned gloo operation cannot be
    aborted: the group is forgotten, kept referenced, and the process leaves with
    ``os._exit``)."""
    return "abort" if "nccl" in str(backend).lower() else "forget"


ABORT_BOUND_S = 15.0
"""How long letting go of an old group (its shut-down, or the abort of an abandoned NCCL
operation) may take before the process gives up on it (an abort can itself hang on a
communicator stuck in the driver): on an H100 a shut-down takes 0.5 s and an abort 1.0 s; past
the bound the node's processes leave and are started again (the restart path). A shut-down
may also wait for the collective timeout (see :meth:`Elastic._bound`); a process can set one
bound for both, :attr:`Elastic.retire_bound_s`."""
EXIT_ABORT_HUNG = training.RESTART_EXIT_CODE
"""The exit code of a process whose NCCL abort did not return within :data:`ABORT_BOUND_S`:
``malletrain-run --inplace`` starts the node's processes again at once, and the new ones join
the membership file's epoch, taking the state from its members (the restart path)."""


def _abort_default_group() -> None:
    """Abort every communicator of this process's groups and clear torch.distributed's
    records of them: ``torch.distributed.distributed_c10d._abort_process_group`` (torch 2.13;
    experimental there, NCCL only). Written for NCCL, not run on a GPU here."""
    from torch.distributed import distributed_c10d as c10d

    c10d._abort_process_group()


def _forget_default_group() -> None:
    """Clear torch.distributed's record of the default group without shutting it down
    (what ``destroy_process_group`` does, less the backend shutdown that would block on an
    abandoned operation). Uses torch's private bookkeeping, checked with torch 2.13."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    c10d._update_default_pg(None)
    for table in (world.pg_map, world.pg_names, world.pg_group_ranks, world.pg_backend_config,
                  world.pg_to_tag, world.tags_to_pg, world.pg_coalesce_state):
        table.clear()
    c10d._unregister_all_process_groups()
    world.group_count = 0


def _feed(h: Any, obj: Any) -> None:
    """Hash a nested state (tensors by dtype, shape and bytes) deterministically."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        # reshape: a 0-dim tensor (BatchNorm's num_batches_tracked) cannot be viewed as bytes
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:  # numbers, strings, None, booleans: their repr is exact and deterministic
        h.update(f"{type(obj).__name__}:{obj!r}".encode())


def digest(state: Any) -> str:
    """The sha256 of a training state (equal states give equal digests on any rank)."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


class Elastic:
    """Keeps one training process in its job across membership changes (see the module doc).

    ``extra`` maps names to objects with ``state_dict``/``load_state_dict`` (a sampler's
    position, a data iterator) that are handed over with the model. ``lr_for(world)`` gives the
    learning rate for a world size (the global-batch rule) and is applied on every change.
    Without a control folder (the restart path, or outside MalleTrain) it forms the group once
    from torchrun's environment and never re-forms. On both paths it checkpoints at step
    boundaries when ``session`` says so (its period, or the daemon's request) and resumes from
    the last checkpoint when no process holds the state (``on_save(step)`` after each save).
    ``backend`` is ``gloo`` or ``nccl`` (the NCCL path is written but untested on GPUs).
    ``ddp=False`` leaves the model unwrapped and the script calls :meth:`average_gradients`
    after ``backward()`` (DDP's first use imports ``torch._dynamo``, about a second of CPU at
    every process start). With several processes per node (``malletrain-run --inplace
    --nproc-per-node N``: ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) :attr:`rank` and :attr:`world`
    are the global ones, ``node rank × N + LOCAL_RANK`` and ``node count × N``, and
    ``lr_for`` gets that world.
    """

    def __init__(self, session: training.Session, model: Any, optimizer: Any,
                 scheduler: Any = None, lr_for: Callable[[int], float] | None = None,
                 extra: Mapping[str, Any] | None = None, step: int = 0,
                 collective_timeout_s: float = MAX_COLLECTIVE_TIMEOUT_S,
                 control_dir: str | None = None, poll_s: float = 0.02,
                 wait_membership_s: float = 600.0,
                 on_save: Callable[[int], None] | None = None, backend: str = "gloo",
                 ddp: bool = True) -> None:
        if not 0 < collective_timeout_s <= MAX_COLLECTIVE_TIMEOUT_S:
            raise ValueError(f"collective_timeout_s must be in (0, {MAX_COLLECTIVE_TIMEOUT_S:g}]"
                             " (it is only the backstop for a hung peer)")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend {backend!r} cannot rescale in place: give gloo or nccl "
                             "(a backend without an abort, such as xccl, cannot let go of a "
                             "lost peer's operation); run without --inplace (the restart path)")
        self.backend = backend
        self.ddp = ddp
        self.session = session
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.lr_for = lr_for
        self.extra = dict(extra or {})
        self.on_save = on_save
        self.step = int(step)
        self.has_state = step > 0
        self.timeout_s = collective_timeout_s
        self.poll_s = poll_s
        self.wait_membership_s = wait_membership_s
        control = control_dir if control_dir is not None else os.environ.get(
            training.ENV_CONTROL_DIR)
        self.control_dir = Path(control) if control else None
        self.inplace = self.control_dir is not None and os.environ.get(
            training.ENV_INPLACE, "1" if control_dir else "") == "1"
        # in place, the node's membership becomes this process's (see Membership.for_process)
        self.local_rank, self.local_world = local_layout(os.environ) if self.inplace else (0, 1)
        self.net: Any = model
        self.epoch: int | None = None
        self.rank = session.rank
        self.world = session.world_size
        self.changes: list[dict[str, Any]] = []
        self.checkpoints: list[int] = []       # steps saved to disk by this process
        self.resumed_from: int | None = None   # the step loaded from disk, if one was
        self.holds_abandoned = False
        self.step_pauses: list[tuple[float, float]] = []  # this step's re-forms (start, end)
        self._holding_step = False   # re-forming inside a step, its gradients kept
        self._keep_step = False      # the new group agreed to finish that step
        self._pending = _Pending(device_sync=backend == "nccl")
        if backend == "nccl":
            bind_device()
        self._graveyard: list[_Abandoned] = []
        self._retiring: _Retiring | None = None   # the last group, being let go in a thread
        self.retire_bound_s: float | None = None  # None: _bound(kind)
        self.retired: list[dict[str, Any]] = []   # what letting go of each old group took
        self._phases: dict[str, float] = {}       # the current re-form's pieces (_apply)
        self._store: Any = None
        self._hosted: tuple[int, Any] | None = None  # (epoch, store) this process hosts
        self._host_lock = threading.Lock()
        self._store_calls = _StoreCalls()
        self._lost_epoch = -1  # the newest epoch, not yet formed, found to have a silent peer
        self._torch_hook: tuple[Any, Any] = (None, None)  # (what it wrapped, torch's hook)
        self._latest: Membership | None = None
        self._latest_lock = threading.Lock()
        self._step_failed = False
        self._told_lost: int | None = None  # the epoch this process said it lost a peer in
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._exit_code = 0
        self._told: dict[int, Membership] = {}  # the memberships read, by epoch (the last 8)
        self._beat = Heartbeat(self._watched, self._peer_silent,
                               peer_timeout_s() if self.inplace else 0.0,
                               host=self._host_coming)
        self._beater: threading.Thread | None = None
        atexit.register(self._exit_guard)

    # ----- the control channel ------------------------------------------------------------
    def _watch(self) -> None:
        assert self.control_dir is not None
        path = self.control_dir / MEMBERSHIP_NAME
        seen: tuple[int, int] | None = None
        while not self._stop.wait(self.poll_s):
            if self.local_world > 1:
                self._sibling_lost()
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
            if m.abandon and self.epoch is not None and m.epoch > self.epoch:
                self._pending.abandon(f"epoch {m.epoch} replaces epoch {self.epoch} "
                                      "(a peer was lost)")

    def _sibling_lost(self) -> None:
        """Abandon this epoch's operations when another process of this node lost a peer in
        it (:meth:`_tell_siblings`). Measured without it (2 nodes × 3 processes, one node
        SIGKILLed, the next epoch without ``abandon``, which is what a planned shrink whose
        leaver Slurm kills at once gives): one process failed at once, its two siblings
        waited in the step agreement for the whole collective timeout (20 s)."""
        assert self.control_dir is not None
        try:
            lost = int((self.control_dir / LOST_NAME).read_text())
        except (OSError, ValueError):
            return
        if lost == self.epoch and lost != self._told_lost and self._pending.reason is None:
            self._pending.abandon(f"epoch {lost}: another process of this node lost a peer",
                                  lost)

    def _tell_siblings(self) -> None:
        """A peer failed this process's collective: tell the node's other processes (the
        control folder's ``lost`` file), whose operations may wait on this one."""
        if self.local_world <= 1 or self.control_dir is None or self.epoch is None \
                or self._told_lost == self.epoch:
            return
        self._told_lost = self.epoch
        tmp = self.control_dir / f".{LOST_NAME}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            tmp.write_text(f"{self.epoch}\n")
            os.replace(tmp, self.control_dir / LOST_NAME)

    def _remember(self, m: Membership) -> None:
        """Keep ``m`` for :meth:`_formed` (the heartbeat's view of this process's epoch)."""
        self._told[m.epoch] = m
        for old in sorted(self._told)[:-8]:
            del self._told[old]

    def _formed(self) -> Membership | None:
        """The membership of the epoch this process's group was formed for, or None."""
        epoch = self.epoch
        m = self._told.get(epoch) if epoch is not None else None
        if m is None or (m.rank, m.world) != (self.rank, self.world):
            return None
        return m

    def _coming(self) -> Membership | None:
        """The epoch this process re-forms into: the newest membership told, once it is newer
        than the group's and names this process (None otherwise)."""
        m = self._newest()
        if m is None or m.leave or (self.epoch is not None and m.epoch <= self.epoch):
            return None
        return m

    def _watched(self) -> list[Membership | None]:
        """The epochs the heartbeat watches: the one the group was formed for and, from the
        moment it is told, the one this process re-forms into (see :meth:`_peer_silent`)."""
        return [self._formed(), self._coming()]

    def _replaced(self, m: Membership) -> bool:
        """Whether forming ``m`` is pointless: a newer membership was told, or a peer of
        ``m``'s epoch was found silent (the daemon names the next epoch without it)."""
        newer = self._newest()
        return (newer is not None and newer.epoch > m.epoch) or self._lost_epoch >= m.epoch

    def _peer_silent(self, lost: Lost) -> None:
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
        (only its own operations: :meth:`_Pending.abandon`), and the epoch re-formed into is
        watched from the moment it is told, so a peer silent in it is named in it, the epoch
        the daemon holds current."""
        coming = self._coming()
        if lost.epoch == self.epoch:
            if not self._pending.abandon(lost.why, lost.epoch):
                return  # already re-forming into a newer epoch: the operations are gone
            tell = coming is None  # else the daemon has moved on; the newer epoch is watched
        elif coming is not None and lost.epoch == coming.epoch:
            self._lost_epoch = max(self._lost_epoch, lost.epoch)  # its re-form gives up
            self._pending.abandon(lost.why, lost.epoch)  # and its group, if just made
            tell = True
        else:
            return  # an epoch this process has left
        print(f"malletrain: {lost.why}; abandoning epoch {lost.epoch}", file=sys.stderr,
              flush=True)
        if tell and self.control_dir is not None:
            nodes = sorted({r // self.local_world for r in lost.ranks})
            with contextlib.suppress(OSError):
                write_peers_lost(self.control_dir, lost.epoch, nodes)

    def _newest(self) -> Membership | None:
        with self._latest_lock:
            return self._latest

    def _await_epoch(self, epoch: int) -> Membership:
        deadline = time.monotonic() + self.wait_membership_s
        while True:
            m = self._newest()
            if m is not None and m.epoch >= epoch:
                return m
            if time.monotonic() > deadline:
                self._leave(3, f"no membership for epoch ≥ {epoch} within "
                               f"{self.wait_membership_s:g} s")
            time.sleep(self.poll_s / 2)

    # ----- the group ----------------------------------------------------------------------
    def _teardown(self) -> None:
        """Let go of the current group without waiting for it (see :class:`_Retiring`).

        The group is forgotten by torch.distributed at once, so the next one can be formed
        beside it, and is shut down (planned changes) or aborted (NCCL, an abandoned
        operation) in a thread of its own. An abandoned gloo group cannot be shut down while
        its operation is pending: it goes to the graveyard until that operation ends."""
        import torch.distributed as dist

        old_net, self.net = self.net, self.model
        works = self._pending.release()
        if not dist.is_initialized():
            self._store = None
            return
        backend = str(dist.get_backend())
        if self._pending.reason is not None and abandon_action(backend) == "forget":
            # An abandoned gloo operation is still pending on a hung peer: shutting the group
            # down would wait for it (the collective timeout). Forget the group instead and
            # keep it referenced, so that no destructor waits either; this process leaves with
            # os._exit (see close()).
            if not self.holds_abandoned:
                self.holds_abandoned = True
                self._watch_for_crash()
            self._graveyard.append(_Abandoned(dist.group.WORLD, self._store, old_net, works))
            self._let_go_store()
            _forget_default_group()
            return
        # NCCL with an abandoned operation: aborting the communicators ends it. A shut-down or
        # abort that hangs itself (a communicator stuck in the driver) is given up on after
        # retire_bound_s: the node's processes leave and restart (never a hung job).
        kind = "abort" if self._pending.reason is not None else "shutdown"
        t0 = time.monotonic()
        self._settle_retiring(wait=True)   # at most one old group being let go at a time
        self._phases["wait_retiring_s"] = time.monotonic() - t0
        parts = [old_net, dist.group.WORLD, self._store]
        del old_net
        self._let_go_store()
        _forget_default_group()
        # The parts go to the thread with no reference of their own left here: the thread
        # can be done before this one runs again, and a last reference dropped here freed the
        # group and the store this process hosted on the step's path (the store's destructor
        # joins its thread, seen in a 5-s reverse DNS lookup).
        self._retiring = _Retiring(kind, self.epoch, backend, parts, works)
        del parts, works   # the lists the thread empties, not their contents
        if kind == "abort":
            self.holds_abandoned = True  # until the abort returns (_settle_retiring)

    def _let_go_store(self) -> None:
        """Forget the group's store here (its new owner keeps it, or nobody)."""
        with self._host_lock:
            if self._hosted is not None and self._hosted[1] is self._store:
                self._hosted = None
        self._store = None

    def _let_go_hosted(self, epoch: int) -> None:
        """Stop hosting the store of an epoch before ``epoch`` that was given up unformed:
        left listening, it would hold its port, which the daemon hands out again later."""
        with self._host_lock:
            if self._hosted is not None and self._hosted[0] < epoch:
                self._hosted = None

    def _host_coming(self, m: Membership) -> None:
        """The heartbeat's call before it meets the store of ``m``'s epoch, in which this
        process is rank 0: host it now if it is the epoch this process re-forms into, so that
        its members can beat there (and check in) while this process finishes its step."""
        coming = self._coming()
        if coming is not None and coming.epoch == m.epoch:
            self._host_store(coming)

    def _host_store(self, m: Membership) -> Any:
        """The store of ``m``'s epoch, hosted by this process (its rank 0): made once, by the
        heartbeat as soon as the epoch is told or by the re-form, whichever comes first."""
        import torch.distributed as dist

        with self._host_lock:
            if self._hosted is not None and self._hosted[0] == m.epoch:
                return self._hosted[1]
            if self._hosted is not None and self._hosted[0] > m.epoch:
                raise RuntimeError(f"epoch {m.epoch} was replaced by epoch {self._hosted[0]}")
            fd = listen_on(m.master, m.port)
            try:
                store = dist.TCPStore(m.master, m.port, m.world, is_master=True,
                                      timeout=dt.timedelta(seconds=self.timeout_s),
                                      wait_for_workers=False, master_listen_fd=fd)
            except BaseException:
                if fd is not None:
                    os.close(fd)
                raise
            self._hosted = (m.epoch, store)  # an older one not formed is let go
            return store

    def _settle_retiring(self, wait: bool) -> None:
        """Forget the group let go in the background once its thread is done; ``wait``: wait
        for it, at most until its bound. Past the bound the process leaves for the restart
        path (:data:`EXIT_ABORT_HUNG`): it cannot be trusted with the device any more."""
        r = self._retiring
        if r is None or self._retired_within(r, wait):
            return
        if r.started + self._bound(r.kind) > time.monotonic():
            return
        self.holds_abandoned = True  # leave with os._exit: nothing may wait on that group
        self._leave(EXIT_ABORT_HUNG, f"the {r.kind} of epoch {r.epoch}'s {r.backend} group "
                    f"did not return within {self._bound(r.kind):g} s: this node's processes "
                    "leave and are started again (the restart path)")

    def _retired_within(self, r: _Retiring, wait: bool) -> bool:
        """Whether ``r`` is done (``wait``: waiting at most until its bound); once it is, it
        is forgotten and what it took recorded in :attr:`retired`."""
        left = r.started + self._bound(r.kind) - time.monotonic()
        if not r.done.wait(max(0.0, left) if wait else 0.0):
            return False
        self._retiring = None
        self.retired.append(r.summary())
        if r.error is not None:
            print(f"malletrain: letting go of epoch {r.epoch}'s {r.backend} group ({r.kind}) "
                  f"failed: {r.error}", file=sys.stderr, flush=True)
        self.holds_abandoned = bool(self._graveyard) or self._pending.reason is not None
        return True

    def _bound(self, kind: str) -> float:
        """How long letting go of an old group may take (:attr:`retire_bound_s` when set):
        an abort :data:`ABORT_BOUND_S`; a shut-down as long too, or until the collective
        timeout has ended any operation still pending on it (a gloo group whose peer failed
        in a step can hold one; its shut-down then waits for it) and 5 s more."""
        if self.retire_bound_s is not None:
            return self.retire_bound_s
        return ABORT_BOUND_S if kind == "abort" else max(ABORT_BOUND_S, self.timeout_s + 5.0)

    def _reap(self) -> None:
        """Shut down the abandoned groups whose operations have all ended (failed when their
        peer was lost, or timed out). Kept, such a group costs a CPU core: its peers' data for
        the operation it gave up stays unread in its sockets, and gloo's event loop wakes for
        it without pause (one thread used 38 CPU-s in 39 s in the demo, until its process was
        preempted). Freeing it closes those sockets and joins its threads, which are idle."""
        ended = [g for g in self._graveyard if g.ended()]
        if not ended:
            return
        self._graveyard = [g for g in self._graveyard if g not in ended]
        for g in ended:
            works, g.works = g.works, []
            g.group = g.store = g.net = None  # frees the group: joins its threads
            works.clear()                     # then the works they ran (see _Pending)
        self.holds_abandoned = bool(self._graveyard) or self._pending.reason is not None

    @property
    def _device(self) -> Any:
        """Where the control collectives' tensors live: the GPU for NCCL, else the CPU."""
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _form(self, m: Membership) -> bool:
        """Form ``m``'s group; False when a newer membership replaced ``m`` meanwhile (a
        member that was told a later epoch never comes to this one, so nobody waits for it),
        or when the heartbeat found a peer of ``m``'s epoch silent (the daemon, told, names
        the next epoch without it).

        Every rank first checks in at the store (rank 0 hosts it, from the moment it was
        told the epoch: :meth:`_host_coming`) and waits, polling, until all ``m.world`` did,
        or ``m`` was given up; only then is the gloo group made, which needs every rank.
        Connection attempts are probed with a plain socket first, so that a store not yet up
        costs no c10d retry back-off (16 s measured); the store calls are waited for only
        while ``m`` is wanted (:class:`_StoreCalls`: a stopped rank 0 never answers)."""
        import torch.distributed as dist

        timeout = dt.timedelta(seconds=self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        # keys of this epoch only: a restarted daemon may hand the same port to a new epoch
        keys = [f"malletrain/{m.epoch}/joined/{r}" for r in range(m.world)]
        store = None
        warned = False

        def call(fn: Callable[[], Any]) -> Any:
            return self._store_calls.call(fn, lambda: self._replaced(m))

        def connect() -> Any:
            if m.rank == 0:
                return self._host_store(m)
            return dist.TCPStore(m.master, m.port, m.world, is_master=False, timeout=timeout,
                                 wait_for_workers=False)

        while True:
            try:
                joined = store is not None and call(partial(self._joined, store, keys))
            except _GaveUp:
                return False
            if joined:
                break
            if joined is None:
                store = None  # its host moved on (a newer membership reaches us too)
            if self._replaced(m):
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"epoch {m.epoch}: not every rank came to the group on "
                                   f"{m.master}:{m.port} within {self.timeout_s:g} s")
            try:
                if store is None and (m.rank == 0 or _accepts(m.master, m.port)):
                    store = call(connect)
                    call(partial(store.set, keys[m.rank], "1"))
                    continue  # look at once: alone (world 1), or the last to come, all are in
            except _GaveUp:
                return False
            except (RuntimeError, OSError) as exc:  # the store went away (its host moved on)
                store = None
                if m.rank == 0 and not warned and time.monotonic() > deadline - self.timeout_s + 5:
                    # rank 0 cannot make the store: its port is taken, often by a connection's
                    # TIME_WAIT (up to 60 s), which a master port in the ephemeral range risks
                    warned = True
                    print(f"malletrain: epoch {m.epoch}: the group's store cannot listen on "
                          f"port {m.port} for 5 s ({_one_line(exc)}); still trying until "
                          f"{self.timeout_s:g} s: keep [epochs] port_min-port_max below "
                          "net.ipv4.ip_local_port_range", file=sys.stderr, flush=True)
            time.sleep(self.poll_s / 4)
        assert store is not None
        self._store = store
        self._phases["store_s"] = time.monotonic() - (deadline - self.timeout_s)
        if sys.excepthook is self._torch_hook[1]:
            # torch wraps sys.excepthook at every init_process_group to prefix "[rankN]: ";
            # unwrapped, twenty re-forms would prefix a traceback's lines twenty times
            sys.excepthook = self._torch_hook[0]
        before = sys.excepthook
        # NCCL: the communicator is made now, bound to this process's GPU (a lazy one costs
        # the first all-reduce 0.39-0.62 s on an H100, an eager one 0.05 s).
        eager = {"device_id": self._device} if self.backend == "nccl" else {}
        dist.init_process_group(self.backend,
                                store=dist.PrefixStore(f"malletrain/{m.epoch}", store),
                                rank=m.rank, world_size=m.world, timeout=timeout, **eager)
        self._torch_hook = (before, sys.excepthook)
        return True

    @staticmethod
    def _joined(store: Any, keys: list[str]) -> bool | None:
        """Whether every rank checked in at ``store``; None, not an error, when the store went
        away: its host (rank 0) moved on to a newer membership, which reaches this process
        too. Raised, that error killed this rank's processes: under real Slurm a restarted
        daemon that had lost its last epoch named a newer one, and each re-form that followed
        lost one node's processes ("Failed to recv"), 6 epochs and 30 s before a disk resume."""
        if store is None:
            return False
        try:
            return bool(store.check(keys))
        except (RuntimeError, OSError):
            return None

    def _wrap(self) -> None:
        from torch import nn

        if self.world > 1 and self.ddp:
            with ddp_without_dynamo():   # a joiner's first step imports no torch._dynamo
                net = nn.parallel.DistributedDataParallel(self.model)
            # a lambda: DDP refuses a hook whose parameters carry (string) annotations
            net.register_comm_hook(None, lambda state, bucket: self._pending.hook(state, bucket))
            self.net = net
        else:
            self.net = self.model

    def _collective(self, op: Callable[..., Any], *args: Any) -> None:
        self._pending.wait(self._pending.track(op(*args, async_op=True)))

    def average_gradients(self) -> None:
        """With ``ddp=False``: average the model's gradients over the group (one all-reduce of
        all of them, abandonable like DDP's), between ``backward()`` and the optimizer step;
        the model's floating-point buffers (BatchNorm's running statistics) are averaged in
        the same all-reduce.

        When a peer is lost in that all-reduce (a preemption, a crash), the survivors keep the
        step: they re-form at once, inside the step, and if every member of the new group holds
        this step's gradients (no joiner, nobody ahead) they average them over the new group
        and the step completes, with the lost node's samples left out. Otherwise the step is
        dropped as with DDP (:class:`StepAbandoned` reaches :meth:`guard`)."""
        import torch
        import torch.distributed as dist

        tensors = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.world <= 1 or not tensors:
            return
        # and the floating-point buffers (BatchNorm's running statistics), averaged as well:
        # each rank's forward pass moved them with its own batch, and without DDP (which
        # broadcasts rank 0's) nothing else keeps them equal between ranks
        tensors += [b for b in self.model.buffers() if b.is_floating_point()]
        while True:
            flat = torch.cat([t.reshape(-1) for t in tensors]).to(self._device)
            if self.world <= 1:
                break
            try:
                self._collective(dist.all_reduce, flat)
                break
            except Exception as exc:
                if not (self.inplace and self._is_peer_failure(exc)):
                    raise
                self._reform_holding_step()
        flat /= self.world
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def _reform_holding_step(self) -> None:
        """Re-form after a peer was lost in this step's all-reduce, telling the new group that
        this process holds the step's gradients; raise :class:`StepAbandoned` unless every
        member does (see :meth:`average_gradients`)."""
        lost_t = time.time()
        self._note_abandoned()
        self._holding_step = True
        try:
            self._apply(self._await_epoch((self.epoch or 0) + 1), "lost")
        finally:
            self._holding_step = False
            self.step_pauses.append((lost_t, time.time()))
        if not self._keep_step:
            raise StepAbandoned(f"epoch {self.epoch}: a member of the new group does not hold "
                                f"step {self.step}'s gradients; the step is dropped")
        self.changes[-1]["kept_step"] = True

    # ----- the state ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything that is handed over: model, optimizer, scheduler, extras, step, samples."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "extra": {k: v.state_dict() for k, v in self.extra.items()},
                "step": self.step}

    def digest(self) -> str:
        return digest(self.state())

    def _digest_without_buffers(self) -> str:
        """:meth:`digest` of the state less the model's buffers (only its parameters)."""
        state = self.state()
        params = {name for name, _ in self.model.named_parameters()}
        state["model"] = {k: v for k, v in state["model"].items() if k in params}
        return digest(state)

    def _load(self, payload: dict[str, Any]) -> None:
        import torch

        state = payload["state"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        for k, v in self.extra.items():
            if k in state.get("extra", {}):
                v.load_state_dict(state["extra"][k])
        self.step = int(state.get("step", payload.get("step", 0)))
        self.session.samples = float(payload.get("samples", 0.0))
        if "rng" in payload:
            torch.set_rng_state(payload["rng"])
            random.setstate(payload["py_rng"])
        self.has_state = True

    def _resume(self) -> None:
        """Load the last disk checkpoint (what :meth:`steps` saves), if there is one: the
        state when no process kept it in memory (the job's first epoch, every node lost)."""
        payload = self.session.resume()
        if payload is not None and isinstance(payload.get("state"), dict) \
                and "model" in payload["state"]:
            self._load(payload)
            self.resumed_from = self.step  # the learning-rate rule is applied after this

    def _checkpoint(self) -> None:
        """At a step boundary: save the state when the period is due or the daemon asked."""
        if self.session.should_checkpoint():
            self.save()

    def save(self) -> bool:
        """Save the state to the job's checkpoint folder now (rank 0; other ranks do nothing
        and get False); ``on_save(step)`` is called after a save that completed."""
        if self.session.checkpoint(self.state(), self.step) is None:
            return False
        self.checkpoints.append(self.step)
        if self.on_save is not None:
            self.on_save(self.step)
        return True

    def _hand_over(self) -> dict[str, Any]:
        """Agree on the most advanced member and send its state to every rank that differs."""
        import torch
        import torch.distributed as dist

        self._keep_step = False
        if self.world == 1:
            if not self.has_state:
                self._resume()
            self._keep_step = self._holding_step
            return {"source": 0, "sent_bytes": 0, "digest": self.digest()}
        dev = self._device
        flag = torch.tensor([1 if self.has_state else 0], dtype=torch.int64, device=dev)
        self._collective(dist.all_reduce, flag, dist.ReduceOp.MAX)
        if int(flag[0]) == 0:
            self._resume()  # nobody holds a state in memory: every rank reads the checkpoint
        mine = self.digest()
        # Holding a step, the members compare their states less the model's buffers: the
        # forward pass has put this rank's batch into BatchNorm's running statistics, which
        # the step's all-reduce then averages (see average_gradients).
        agree = self._digest_without_buffers() if self._holding_step else mine
        # (step held, digest, step whose gradients are held or -1): see average_gradients
        info = torch.tensor([self.step if self.has_state else -1, int(agree[:15], 16),
                             self.step if self._holding_step else -1],
                            dtype=torch.int64, device=dev)
        rows = [torch.zeros(3, dtype=torch.int64, device=dev) for _ in range(self.world)]
        self._collective(dist.all_gather, rows, info)
        steps = [int(r[0]) for r in rows]
        src = max(range(self.world), key=lambda r: (steps[r], -r))
        need = any(int(r[0]) != steps[src] or int(r[1]) != int(rows[src][1]) for r in rows)
        self._keep_step = not need and all(int(r[2]) == steps[src] >= 0 for r in rows)
        sent = 0
        if need:
            size = torch.zeros(1, dtype=torch.int64, device=dev)
            data = b""
            if self.rank == src:
                buf = io.BytesIO()
                torch.save({"state": self.state(), "samples": self.session.samples,
                            "rng": torch.get_rng_state(), "py_rng": random.getstate()}, buf)
                data = buf.getvalue()
                size[0] = len(data)
            self._collective(dist.broadcast, size, src)
            sent = int(size[0])
            blob = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
                    if self.rank == src else torch.empty(sent, dtype=torch.uint8, device=dev))
            self._collective(dist.broadcast, blob, src)
            if self.rank != src:
                # weights_only: tensors, containers and plain values, never arbitrary objects
                self._load(torch.load(io.BytesIO(blob.cpu().numpy().tobytes()),
                                      weights_only=True))
            mine = self.digest()
            check = torch.tensor([int(mine[:15], 16)], dtype=torch.int64, device=dev)
            got = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(self.world)]
            self._collective(dist.all_gather, got, check)
            if len({int(g[0]) for g in got}) != 1:
                raise RuntimeError("training state digests differ after the hand-over")
        return {"source": src, "sent_bytes": sent, "digest": mine}

    # ----- changes ------------------------------------------------------------------------
    def _apply(self, m: Membership, kind: str) -> None:
        t0 = time.monotonic()
        # where a re-form's time goes (the last try's, in the change record): the wait for
        # the group let go before (at most one at a time), meeting at the store, the new
        # group's init, and the hand-over of the state
        self._phases = {}
        while True:
            if m.leave:
                self._leave(0, f"epoch {m.epoch}: this node leaves the job")
            self._teardown()
            self._let_go_hosted(m.epoch)
            self._pending.reset(m.epoch)
            t_form = time.monotonic()
            try:
                formed = self._form(m)
            except Exception:
                # the group's init failed (a peer stopped between checking in and connecting
                # waits out the collective timeout in gloo): the next epoch if a peer of this
                # one was found silent meanwhile (or it was replaced), else the error
                if not self._replaced(m):
                    raise
                formed = False
            if not formed:
                m = self._await_epoch(m.epoch + 1)  # replaced before it formed: the newer
                continue
            self._phases["form_s"] = time.monotonic() - t_form
            self.epoch, self.rank, self.world = m.epoch, m.rank, m.world
            self.session.set_membership(m.epoch, m.rank, m.world)
            try:
                t_hand = time.monotonic()
                handed = self._hand_over()
                self._phases["hand_over_s"] = time.monotonic() - t_hand
                self._wrap()  # DDP's constructor runs collectives too
                break
            except Exception as exc:  # a member lost during the hand-over: the next epoch
                if not self._is_peer_failure(exc):
                    raise
                self._note_abandoned()
                m = self._await_epoch(m.epoch + 1)
        if self.lr_for is not None:
            lr = self.lr_for(self.world)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.changes.append({"epoch": m.epoch, "kind": kind, "world": m.world, "rank": m.rank,
                             "step": self.step, "reform_s": round(time.monotonic() - t0, 4),
                             **{k: round(v, 4) for k, v in self._phases.items()}, **handed})

    def _agree(self) -> int:
        """The newest epoch any member has been told about (all members call it each step)."""
        import torch
        import torch.distributed as dist

        m = self._newest()
        seen = m.epoch if m is not None else -1
        if self.world == 1:
            return seen
        t = torch.tensor([seen], dtype=torch.int64, device=self._device)
        self._collective(dist.all_reduce, t, dist.ReduceOp.MAX)
        return int(t[0])

    def _start(self) -> None:
        if not self.inplace:
            import torch.distributed as dist

            if os.environ.get(training.ENV_EPOCH) is not None:  # the restart path's epoch
                self.epoch = self.session.epoch

            if self.world > 1 and not dist.is_initialized():
                dist.init_process_group(self.backend,
                                        timeout=dt.timedelta(seconds=self.timeout_s))
            if not self.has_state:
                self._resume()
            self._wrap()
            if self.lr_for is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = self.lr_for(self.world)
            return
        assert self.control_dir is not None
        self._watcher = threading.Thread(target=self._watch, name="malletrain-control",
                                         daemon=True)
        self._watcher.start()
        self._beater = threading.Thread(target=self._beat.run, args=(self._stop,),
                                        name="malletrain-heartbeat", daemon=True)
        self._beater.start()
        (self.control_dir / ready_name(self.local_rank, self.local_world)).write_text(
            f"{os.getpid()}\n")
        m = self._await_epoch(0)
        self._apply(m, "start")

    def _leave(self, code: int, why: str) -> None:
        print(f"malletrain: {why}", file=sys.stderr, flush=True)
        self.close(code)
        raise SystemExit(code)

    def steps(self, total: int = 0) -> Iterator[int]:
        """Yield the global step to run next until ``total`` (0: forever), re-forming between
        steps when the membership changes."""
        self._start()
        while total <= 0 or self.step < total:
            if self._graveyard:
                self._reap()
            if self._retiring is not None:
                self._settle_retiring(wait=False)
            self._step_failed = False
            self.step_pauses = []
            yield self.step
            if not self._step_failed:
                self.step += 1
                self.has_state = True
                self._checkpoint()
            if not self.inplace:
                continue
            if self.step_pauses and self._step_failed:
                # re-formed inside the step, which was then dropped: the new group's members
                # all start the next step now (as after a re-form here), no agreement first
                continue
            target = self.epoch
            try:
                target = self._agree()
            except Exception as exc:
                if not self._is_peer_failure(exc):
                    raise
                self._step_failed = True
            if self._step_failed:
                self._note_abandoned()
                m = self._await_epoch((self.epoch or 0) + 1)
                self._apply(m, "lost")
            elif self.epoch is not None and target is not None and target > self.epoch:
                self._apply(self._await_epoch(target), "planned")

    def _note_abandoned(self) -> None:
        """Remember that this process holds an operation the control thread abandoned (called
        on every peer failure: the node's other processes are told too)."""
        self.holds_abandoned = self.holds_abandoned or self._pending.reason is not None
        self._tell_siblings()

    def _is_peer_failure(self, exc: BaseException) -> bool:
        import torch.distributed as dist

        setup = configuration_error(exc)
        if setup:
            raise RuntimeError(f"malletrain: {setup} ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
        if isinstance(exc, (StepAbandoned, dist.DistError)) or self._pending.reason:
            return True
        text = str(exc)
        return isinstance(exc, RuntimeError) and any(
            w in text for w in ("gloo", "Connection closed", "Connection reset", "Timed out"))

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Run one step; a step failed by a lost or abandoned peer is dropped, not raised."""
        try:
            yield
        except Exception as exc:
            if not (self.inplace and self.world > 1 and self._is_peer_failure(exc)):
                raise
            self._step_failed = True
            self._note_abandoned()
            if self.optimizer is not None:
                self.optimizer.zero_grad(set_to_none=True)

    def _stop_threads(self) -> None:
        """Stop this object's threads and wait for them: none may touch a future while the
        interpreter finalizes (see :meth:`_Pending.close`)."""
        self._stop.set()
        self._pending.close()
        for thread in (self._watcher, self._beater):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5.0)

    def close(self, code: int = 0) -> None:
        """Leave the group; a process holding an abandoned collective exits at once."""
        self._stop_threads()
        if not self.holds_abandoned:
            with contextlib.suppress(Exception):
                self._teardown()
        self._exit_if_held(code)

    def _exit_if_held(self, code: int) -> None:
        """Leave at once (``os._exit``) when an operation or a group being let go could make
        the interpreter's exit wait or abort; the group of the last epoch is waited for, up to
        its bound (a daemon thread inside torch's C++ at exit aborts the process)."""
        r = self._retiring
        if r is not None and not self._retired_within(r, wait=True):
            self.holds_abandoned = True
        if self.holds_abandoned:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _watch_for_crash(self) -> None:
        """Remember an uncaught exception, so the forced exit keeps a failing exit code."""
        previous = sys.excepthook

        def hook(kind: Any, value: Any, tb: Any) -> None:
            self._exit_code = 1
            previous(kind, value, tb)

        sys.excepthook = hook

    def _exit_guard(self) -> None:
        """At interpreter exit: this object's threads stop first (:meth:`_stop_threads`); a
        process holding an abandoned collective would block and die of SIGABRT in its
        destructors, so it leaves at once with its exit code."""
        self._stop_threads()
        # an uncaught exception when the flag was set before the crash hook was installed
        # (guard() sets it first): never report a crash as "training finished"
        crashed = getattr(sys, "last_value", None) is not None
        self._exit_if_held(self._exit_code or (1 if crashed else 0))
