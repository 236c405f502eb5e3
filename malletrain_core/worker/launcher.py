"""``malletrain-run``: the launcher that runs inside each one-node task of an elastic job.

    malletrain-run [options] [--] python train.py ARGS

It runs as the job's user inside its Slurm array task (the daemon never runs user code). It
authenticates to the daemon over TCP with a munge credential, checks in, and follows orders:
for each epoch it runs ::

    torchrun --nnodes=W --node-rank=r --nproc-per-node=1 --master-addr=A --master-port=P
             --rdzv-backend=static --rdzv-id=ID --max-restarts=0 --no-python python train.py ARGS

with the training environment of :mod:`malletrain_core.worker.training`; it relays checkpoint
requests by touching the control flag, stops the workers when told (or reports their exit when
a peer was lost: torchrun exits), keeps its epoch running and reconnects with backoff while the
daemon is away, and exits at once on SIGTERM, killing the workers' process group.

With ``--inplace`` there is no torchrun: the launcher starts the node's N training processes
(``--nproc-per-node``, 1 by default, ``auto`` = one per visible GPU) ahead of their epoch, each
with ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, keeps them across epochs and relays each order as
the node's membership file (:mod:`.control`). The node is one unit: ready when all N are,
and when one of them exits the others are stopped and the node's exit is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from .. import config, jobsecret
from ..errors import MalleTrainError
from ..munge import Munge
from ..wire.api import ApiError, ApiUnavailable, parse_address
from ..wire.checkin import CheckIn, CheckInReply, LauncherState
from ..wire.orders import VERSION as ORDERS_VERSION
from ..wire.orders import EpochError, Order, OrderKind
from . import control, runid, training
from .client import TcpClient
from .identity import Identity, identity_from_env, job_variable

log = logging.getLogger("malletrain-run")

ENV_DAEMON = "MALLETRAIN_DAEMON"
ENV_NODE_ADDR = "MALLETRAIN_NODE_ADDR"
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
READY_POLL_S = 0.01
"""How often the launcher looks for its processes' ready files while they start: the node is
placed only once the daemon hears it is ready (a stat per process; was 0.1 s, about 50 ms of
a joiner's start on average)."""
LOST_POLL_S = 0.05  # in place: how often the launcher looks for its processes' peers_lost
IN_PLACE_MAX_BACKOFF_S = 3.0
"""In place, the longest wait between two tries to reach a daemon that is away: a restarted
daemon counts an in-place member silent for its ``launcher_timeout_s`` (15 s) as lost and
re-forms without it, so a backoff doubling up to 30 s cost a job an abandoned epoch when the
daemon was away for a few seconds."""


def torchrun_argv(order: Order, command: Sequence[str], nproc_per_node: int = 1,
                  rdzv_timeout_s: int = 300, torchrun: Sequence[str] = TORCHRUN,
                  log_dir: str | None = None) -> list[str]:
    """The torchrun command for one epoch: a static rendezvous for exactly this membership."""
    logs = [f"--log-dir={log_dir}"] if log_dir else []
    return [*torchrun, *logs, f"--nnodes={order.world}", f"--node-rank={order.rank}",
            f"--nproc-per-node={nproc_per_node}", f"--master-addr={order.master}",
            f"--master-port={order.port}", "--rdzv-backend=static",
            f"--rdzv-id={order.rdzv_id}", f"--rdzv-conf=timeout={int(rdzv_timeout_s)}",
            "--max-restarts=0", "--no-python", *command]


def worker_env(base: Mapping[str, str], job: str, order: Order, key_hex: str,
               report_addr: str, checkpoint_dir: str, control_dir: str) -> dict[str, str]:
    """The environment of the training processes (the contract of ``training.Session``)."""
    env = dict(base)
    env.update({training.ENV_JOB: job, training.ENV_EPOCH: str(order.epoch),
                training.ENV_REPORT_ADDR: report_addr, training.ENV_REPORT_KEY: key_hex,
                training.ENV_CHECKPOINT_DIR: checkpoint_dir,
                training.ENV_CONTROL_DIR: control_dir,
                runid.ENV_RUN_ID: runid.for_job(job, base)})
    return env


def local_envs(nproc: int, rank: int | None = None,
               world: int | None = None) -> list[dict[str, str]]:
    """The variables of each of a node's ``nproc`` in-place processes: ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE`` and, once the node's ``rank`` of ``world`` nodes is known, the global
    ``RANK = rank × nproc + LOCAL_RANK`` and ``WORLD_SIZE = world × nproc`` (what torchrun
    would set; :class:`.inplace.Elastic` derives the same from each new membership)."""
    out = []
    for i in range(nproc):
        env = {"LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": str(nproc)}
        if rank is not None and world is not None:
            env.update(RANK=str(rank * nproc + i), WORLD_SIZE=str(world * nproc))
        out.append(env)
    return out


GPU_ID = re.compile(r"\d+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+")
NVIDIA_DEVICE = re.compile(r"nvidia\d+")


def visible_gpus(env: Mapping[str, str], dev: Path = Path("/dev")) -> int:
    """The GPUs this node's processes may use, counted without importing torch (seconds of
    CPU in every task): ``CUDA_VISIBLE_DEVICES`` when set (CUDA stops at its first invalid
    entry: ``-1``, ``NoDevFiles`` or an empty value hide every GPU), else the ``/dev/nvidiaN``
    device files."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is not None:
        count = 0
        for item in text.split(","):
            if not GPU_ID.fullmatch(item.strip()):
                break
            count += 1
        return count
    try:
        return sum(1 for p in dev.iterdir() if NVIDIA_DEVICE.fullmatch(p.name))
    except OSError:
        return 0


def nproc_per_node(text: str, env: Mapping[str, str]) -> int:
    """``--nproc-per-node``: a whole number ≥ 1, or ``auto`` (one per visible GPU, 1 without)."""
    if text.strip().lower() == "auto":
        return max(1, visible_gpus(env))
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise MalleTrainError(f"--nproc-per-node {text!r}: give a whole number ≥ 1 (processes "
                              "per node; with GPUs, one per GPU) or auto (one per visible GPU)")
    return value


class Workers:
    """The processes of one node and everything they start: the torchrun of one epoch (the
    restart path), or the node's in-place training processes, one per ``local_envs`` entry
    (each started with ``env`` updated by its entry).

    torchrun puts each worker in a session of its own, so signalling torchrun's process group
    is not enough: :meth:`stop` signals every descendant it can see, then kills the rest.
    The node is one unit: :meth:`poll` gives its exit code once one process has ended and the
    others have been stopped (see there).
    """

    def __init__(self, argv: list[str], env: Mapping[str, str], epoch: int,
                 local_envs: Sequence[Mapping[str, str]] = ({},),
                 settle_s: float = 10.0) -> None:
        self.epoch = epoch
        self.settle_s = settle_s
        self._spec = (argv, dict(env), list(local_envs))  # for again()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._rc: int | None = None
        self._first_exit: float | None = None
        try:
            for extra in local_envs:
                self.procs.append(subprocess.Popen(
                    argv, env={**env, **extra}, start_new_session=True,
                    preexec_fn=_die_with_parent(os.getpid())))
        except BaseException:
            self.stop(grace_s=0.2)  # those already started go too
            raise

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The first process (the only one on the restart path: torchrun)."""
        return self.procs[0]

    def again(self) -> Workers:
        """The same processes started anew (same command and environment)."""
        argv, env, local_envs = self._spec
        return Workers(argv, env, self.epoch, local_envs=local_envs, settle_s=self.settle_s)

    def poll(self) -> int | None:
        """None while every process runs; else the node's exit code, once the others are
        stopped: the first non-zero code, or 0. A process that ended with 0 (training done, or
        the node left the job) is given ``settle_s`` for the others to end at the same step
        boundary by themselves (rank 0 may still be saving its last checkpoint); a non-zero
        code stops them at once (a node whose processes disagree or die goes as a whole)."""
        if self._rc is not None:
            return self._rc
        codes = [p.poll() for p in self.procs]
        ended = [c for c in codes if c is not None]
        if not ended:
            return None
        failed = next((c for c in ended if c != 0), None)
        if failed is None and len(ended) < len(codes):
            now = time.monotonic()
            if self._first_exit is None:
                self._first_exit = now
            if now - self._first_exit < self.settle_s:
                return None
        if len(ended) < len(codes):
            self.stop()
        self._rc = failed if failed is not None else 0
        return self._rc

    def stopped(self) -> bool:
        """Whether one of the processes is stopped (SIGSTOP, a debugger's stop): it cannot
        leave at a step boundary, however long it is given."""
        for started in self.procs:
            try:
                if started.returncode is None and psutil.Process(started.pid).status() in (
                        psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    return True
            except psutil.Error:
                pass
        return False

    def _tree(self, proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
        if proc.returncode is not None:  # reaped: its pid may be another process's now
            return []
        try:
            root = psutil.Process(proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace_s: float = 3.0) -> int:
        """SIGTERM the workers (they exit at once), SIGKILL each process this object started
        (torchrun, or an in-place training process: nothing to save, and no shutdown
        traceback in the user's output), SIGKILL what is left after ``grace_s``. Returns the
        first process's exit code."""
        procs: list[psutil.Process] = []
        for started in self.procs:
            tree = self._tree(started)
            for i, proc in enumerate(tree):
                try:
                    proc.send_signal(signal.SIGKILL if i == 0 else signal.SIGTERM)
                except psutil.Error:
                    pass
            procs += tree
        alive = _wait_gone(procs, grace_s)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        _wait_gone(alive, 5.0)
        codes = []
        for started in self.procs:
            try:
                codes.append(started.wait(5.0))
            except subprocess.TimeoutExpired:
                codes.append(-9)
        return codes[0] if codes else -9


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """For the child, between fork and exec (Linux): SIGKILL it when the launcher dies, so a
    launcher killed without warning (SIGKILL: no chance to stop its tree) takes torchrun or
    the in-place process with it; the workers under torchrun watch the launcher themselves
    (:func:`training.watch_launcher`). None where ``prctl`` is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the call: nothing would come
            os._exit(1)
    return set_death_signal


PR_SET_PDEATHSIG = 1


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited (a zombie counts: its parent is gone and init
    reaps it when it will); returns those still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = list(procs)
    while True:
        still = []
        for proc in alive:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(proc)
            except psutil.NoSuchProcess:
                pass
        alive = still
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


class Launcher:
    """Check in, follow orders, run epochs; :meth:`run` returns the exit code."""

    def __init__(self, ident: Identity, command: Sequence[str], client: Any, munge: Munge | jobsecret.JobSecretAuth,
                 checkpoint_dir: str, control_dir: str, poll_s: float = 2.0,
                 max_backoff_s: float = 30.0, nproc_per_node: int = 1,
                 node_addr: str = "", torchrun: Sequence[str] = TORCHRUN,
                 base_env: Mapping[str, str] | None = None,
                 sleep: Callable[[float], None] = time.sleep, inplace: bool = False,
                 leave_grace_s: float = 30.0, ready_timeout_s: float = 300.0,
                 hold_s: float = 5.0) -> None:
        self.ident = ident
        self.command = list(command)
        self.client = client
        self.munge = munge
        self.checkpoint_dir = checkpoint_dir
        self.control_dir = control_dir
        self.poll_s = poll_s
        self.max_backoff_s = max_backoff_s
        self.nproc_per_node = nproc_per_node
        self.node_addr = node_addr
        self.torchrun = tuple(torchrun)
        self.base_env = dict(os.environ if base_env is None else base_env)
        # the training processes end themselves once this process is gone (training.py)
        self.base_env[training.ENV_LAUNCHER_PID] = str(os.getpid())
        self.sleep = sleep
        self.workers: Workers | None = None
        self.state = LauncherState.IDLE
        self.epoch: int | None = None
        self.rc: int | None = None
        self.ckpt_seen = 0
        self.refusals = 0
        self.inplace = inplace
        self.leave_grace_s = leave_grace_s
        self.ready_timeout_s = ready_timeout_s
        self.hold_s = hold_s if inplace else 0.0  # in place: the daemon holds the reply
        self._prestarted = 0.0
        self._held = 0.0

    # ----- one round -----------------------------------------------------------------------
    def _observe(self) -> None:
        if self.workers is not None and self.state == LauncherState.RUNNING:
            rc = self.workers.poll()
            if rc == training.RESTART_EXIT_CODE and self.inplace:
                # a process taking the restart path in place: it joins the membership file's
                # epoch when started again (worker/byo_inplace.py)
                log.info("epoch %s: training processes restart (their restart path)", self.epoch)
                self.workers = self.workers.again()
            elif rc is not None:
                log.info("epoch %s: workers exited with %s", self.epoch, rc)
                self.state, self.rc, self.workers = LauncherState.EXITED, rc, None

    def checkin(self) -> CheckInReply:
        if not self.node_addr and hasattr(self.client, "connect"):
            self.client.connect()
            self.node_addr = self.client.local_address() or ""
        ready = self.ready()
        self._held = self.hold_s if ready else 0.0
        return CheckInReply.from_dict(
            self.client.call("checkin", **self._checkin(ready, self._held).to_args()))

    def _checkin(self, ready: bool, hold_s: float) -> CheckIn:
        lost = None
        if self.inplace:
            seen = control.read_peers_lost(self.control_dir)
            if seen is not None and self.state is LauncherState.RUNNING and seen[0] == self.epoch:
                lost = (seen[0], tuple(seen[1]))
        return CheckIn(job=self.ident.job, node=self.ident.node, task=self.ident.task,
                       epoch=self.epoch, state=self.state, rc=self.rc, addr=self.node_addr,
                       ckpt_seen=self.ckpt_seen, proto=ORDERS_VERSION, inplace=self.inplace,
                       ready=ready, hold_s=hold_s, lost=lost)
    def _tell_lost_peers(self, stop: threading.Event) -> None:
        """In place, a thread: when the node's processes find peers silent (``peers_lost``),
        tell the daemon at once on a connection of its own (a check-in that is not held),
        instead of at the end of the held check-in in flight (up to ``hold_s``). The epoch
        this starts wakes the held check-ins, this launcher's among them."""
        told: int | None = None
        while not stop.wait(LOST_POLL_S):
            lost = control.read_peers_lost(self.control_dir)
            if lost is None or lost[0] == told or lost[0] != self.epoch \
                    or self.state is not LauncherState.RUNNING \
                    or not isinstance(self.client, TcpClient):
                continue
            told = lost[0]
            side = TcpClient(self.client.host, self.client.port, self.client.munge,
                             timeout_s=5.0)
            try:
                side.call("checkin", **self._checkin(True, 0.0).to_args())
                log.info("epoch %s: told the daemon that node(s) %s went silent", lost[0],
                         ",".join(map(str, lost[1])))
            except (ApiError, ApiUnavailable, EpochError, MalleTrainError) as exc:
                log.info("epoch %s: could not tell the daemon of silent peers (%s); the next "
                         "check-in does", lost[0], exc)
            finally:
                side.close()

    def act(self, reply: CheckInReply) -> int | None:
        """Carry out one order; returns an exit code when the launcher must exit."""
        order = reply.order
        if order.kind is OrderKind.RUN and self.inplace and self.workers is not None \
                and self.workers.poll() is None:
            if self.state != LauncherState.RUNNING:  # started ahead: give it the report channel first
                self._report_channel(reply)
            if self.epoch != order.epoch:  # the live process re-forms in place
                self._relay(order)
        elif order.kind is OrderKind.RUN and not (self.state == LauncherState.RUNNING and self.epoch == order.epoch):
            if self.workers is not None:
                self._stop(f"epoch {order.epoch} replaces epoch {self.epoch}")
            self._start(order, reply)
        elif order.kind is OrderKind.CHECKPOINT and order.request is not None \
                and order.request > self.ckpt_seen:
            self._request_checkpoint(order.request)
        elif order.kind is OrderKind.STOP and self.workers is not None:
            self._stop(order.reason)
        elif order.kind is OrderKind.STOP:
            self.state, self.epoch, self.rc = LauncherState.IDLE, None, None
        elif order.kind is OrderKind.EXIT:
            if self.workers is not None:
                self._stop(order.reason)
            log.info("exit: %s", order.reason)
            return int(order.rc or 0)
        return None

    def _report_key(self, reply: CheckInReply) -> tuple[str, str]:
        """The job's report key (unwrapped) and the daemon's report address from a reply."""
        wrapped, report_addr = reply.key, reply.report_addr or ""
        if wrapped is None:
            raise ApiError("run order without a key; asking again")
        key_hex = self.munge.decode(wrapped).payload.strip()
        if len(key_hex) != 64 or any(c not in "0123456789abcdef" for c in key_hex):
            raise ApiError("the daemon sent a malformed report key")
        return key_hex, str(report_addr)

    def _start(self, order: Order, reply: CheckInReply) -> None:
        key_hex, report_addr = self._report_key(reply)
        env = worker_env(self.base_env, self.ident.job, order, key_hex, report_addr,
                         self.checkpoint_dir, self.control_dir)
        local: Sequence[Mapping[str, str]] = ({},)
        if self.inplace:  # the node's processes, kept across epochs: no torchrun
            env[training.ENV_INPLACE] = "1"
            local = local_envs(self.nproc_per_node, order.rank, order.world)
            argv = list(self.command)
            self._relay(order)
        else:
            argv = torchrun_argv(order, self.command, self.nproc_per_node,
                                 torchrun=self.torchrun,
                                 log_dir=str(Path(self.control_dir) / "torchrun"))
        log.info("epoch %s: rank %s of %s, master %s:%s", order.epoch, order.rank, order.world,
                 order.master, order.port)
        self.workers = Workers(argv, env, int(order.epoch or 0), local_envs=local)
        self.state, self.epoch, self.rc = LauncherState.RUNNING, order.epoch, None

    def prestart(self) -> None:
        """In place: start the node's training processes ahead of their epoch. The check-ins
        say ``ready: false`` until all of them are ready (torch imported, model built), so the
        daemon does not place the node and the members keep training meanwhile; they pause only
        for the re-form itself."""
        if not self.inplace or self.workers is not None:
            return
        env = dict(self.base_env)
        env.update({training.ENV_JOB: self.ident.job, training.ENV_INPLACE: "1",
                    training.ENV_CHECKPOINT_DIR: self.checkpoint_dir,
                    training.ENV_CONTROL_DIR: self.control_dir})
        folder = Path(self.control_dir)  # the last processes' files
        for stale in (control.READY_NAME, control.MEMBERSHIP_NAME, control.LOST_NAME,
                      control.PEERS_LOST_NAME,
                      *(p.name for p in folder.glob(f"{control.READY_NAME}.*"))):
            with contextlib.suppress(FileNotFoundError):
                (folder / stale).unlink()
        self.workers = Workers(list(self.command), env, 0,
                               local_envs=local_envs(self.nproc_per_node))
        self._prestarted = time.monotonic()
        if self.nproc_per_node == 1:
            log.info("training process started ahead of its epoch")
        else:
            log.info("%d training processes started ahead of their epoch", self.nproc_per_node)

    def ready(self) -> bool:
        """In place: whether the node can be placed (all its processes are ready, or it gave
        up waiting after ``ready_timeout_s`` and lets the daemon decide)."""
        if not self.inplace or self.state == LauncherState.RUNNING:
            return True
        if control.is_ready(self.control_dir, self.nproc_per_node):
            return True
        return self.workers is None or self.workers.poll() is not None \
            or time.monotonic() - self._prestarted > self.ready_timeout_s

    def _report_channel(self, reply: CheckInReply) -> None:
        key_hex, report_addr = self._report_key(reply)
        path = Path(self.control_dir) / training.REPORT_CHANNEL_NAME
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{report_addr} {key_hex}\n")
        os.replace(tmp, path)

    def _relay(self, order: Order) -> None:
        """In place: hand the order to the live training process (membership file)."""
        assert order.epoch is not None and order.rank is not None and order.world is not None
        control.write_membership(self.control_dir, control.Membership(
            epoch=order.epoch, rank=order.rank, world=order.world, master=order.master or "",
            port=order.port or 0, abandon=bool(order.abandon)))
        log.info("epoch %s: rank %s of %s in place, master %s:%s%s%s", order.epoch, order.rank,
                 order.world, order.master, order.port, " (abandon)" if order.abandon else "",
                 f", {self.nproc_per_node} processes" if self.nproc_per_node > 1 else "")
        self.state, self.epoch, self.rc = LauncherState.RUNNING, order.epoch, None

    def _stop(self, reason: str) -> None:
        assert self.workers is not None
        log.info("epoch %s: stopping workers (%s)", self.epoch, reason)
        if self.inplace and self.workers.poll() is None and self.workers.stopped():
            # a process its peers found silent because it was stopped: it never reaches a
            # step boundary, and until it is gone its node cannot join again (the daemon
            # waits for this launcher to say so), nor its store release the members still
            # waiting on it: killed at once instead of after leave_grace_s (30 s)
            log.info("epoch %s: a training process is stopped (SIGSTOP): killed at once",
                     self.epoch)
        elif self.inplace and self.workers.poll() is None:
            # leave at the next step boundary, so the others stop there too (the node's
            # processes all read this file and leave together)
            control.write_membership(self.control_dir,
                                         control.Membership(epoch=(self.epoch or 0) + 1))
            deadline = time.monotonic() + self.leave_grace_s
            while self.workers.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        self.workers.stop()
        self.workers = None
        self.state, self.epoch, self.rc = LauncherState.IDLE, None, None

    def _request_checkpoint(self, request: int) -> None:
        flag = Path(self.control_dir) / training.REQUEST_NAME
        flag.write_text(f"{request}\n")
        now_ns = time.time_ns()
        os.utime(flag, ns=(now_ns, now_ns))
        self.ckpt_seen = request
        log.info("epoch %s: checkpoint requested (%d)", self.epoch, request)

    # ----- the loop ------------------------------------------------------------------------
    def _nap(self, seconds: float) -> None:
        """Sleep, but wake early when the workers exit, or when a process started ahead of its
        epoch becomes ready (both are news for the daemon)."""
        deadline = time.monotonic() + seconds
        waiting_ready = self.inplace and self.state != LauncherState.RUNNING and self.workers is not None \
            and not control.is_ready(self.control_dir, self.nproc_per_node)
        while time.monotonic() < deadline:
            if self.state == LauncherState.RUNNING and self.workers is not None \
                    and self.workers.poll() is not None:
                return
            if waiting_ready and control.is_ready(self.control_dir, self.nproc_per_node):
                return
            nap = READY_POLL_S if waiting_ready else 0.1
            self.sleep(min(nap, max(0.0, deadline - time.monotonic())))

    def run(self) -> int:
        stop = threading.Event()
        if self.inplace:
            threading.Thread(target=self._tell_lost_peers, args=(stop,), daemon=True,
                             name="malletrain-lost-peers").start()
        try:
            return self._loop()
        finally:
            stop.set()

    def _loop(self) -> int:
        backoff = self.poll_s
        away_since: float | None = None
        while True:
            if self.inplace and self.workers is None and self.state == LauncherState.IDLE:
                self.prestart()  # a node that left (or is new) gets its next process ready
            self._observe()
            try:
                reply = self.checkin()
                code = self.act(reply)
            except ApiUnavailable as exc:
                if away_since is None:
                    away_since = time.monotonic()
                    log.warning("%s; epoch %s keeps running, retrying", exc, self.epoch)
                if self.state == LauncherState.EXITED and self.rc == 0 \
                        and time.monotonic() - away_since > 60:
                    return 0
                self._nap(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, self.max_backoff_s,
                              IN_PLACE_MAX_BACKOFF_S if self.inplace else math.inf)
                continue
            except (ApiError, EpochError, MalleTrainError) as exc:
                self.refusals += 1
                log.warning("%s", exc)
                if self.refusals >= 10 and self.state != LauncherState.RUNNING:
                    log.error("giving up after %d refusals in a row", self.refusals)
                    self.shutdown()
                    return 2
                self._nap(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            if away_since is not None:
                log.info("reconnected to the daemon")
            away_since, backoff, self.refusals = None, self.poll_s, 0
            if code is not None:
                return code
            # a held check-in already waited for news: ask again at once
            self._nap(0.05 if self._held > 0 else self.poll_s)

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.stop(grace_s=0.2)
            self.workers = None


def _daemon_address(flag: str | None, env: Mapping[str, str]) -> tuple[tuple[str, int], str]:
    cfg = config.load(env={k: v for k, v in env.items() if k != ENV_DAEMON})
    text = flag or env.get(ENV_DAEMON, "")
    if not text:
        if cfg.daemon.api_host in ("", "0.0.0.0", "::"):
            raise MalleTrainError(f"where is the daemon? set {ENV_DAEMON}=HOST:PORT or pass "
                                  "--daemon (the config's api_host is a wildcard)")
        text = f"{cfg.daemon.api_host}:{cfg.daemon.api_port}"
    return parse_address(text, cfg.daemon.api_port), cfg.munge.socket


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="malletrain-run",
        description="Run one node of an elastic MalleTrain job: epochs of torchrun directed "
                    "by the daemon.",
        epilog="example: malletrain-run python train.py --epochs 10")
    p.add_argument("--daemon", help=f"daemon HOST:PORT (default: ${ENV_DAEMON}, else the "
                   "config file's api_host:api_port)")
    p.add_argument("--munge-socket", help="munged socket (default: the config's munge.socket)")
    p.add_argument("--checkpoint-dir", help="shared checkpoint folder (default: "
                   "$MALLETRAIN_CHECKPOINT_DIR, else malletrain-<job> in the submit folder)")
    p.add_argument("--nproc-per-node", default="1",
                   help="training processes per node: a number (with GPUs, one per GPU) or "
                   "auto (one per visible GPU, counted from CUDA_VISIBLE_DEVICES or the "
                   "/dev/nvidiaN files; 1 without GPUs); default 1")
    p.add_argument("--poll-s", type=float, default=2.0, help="seconds between check-ins")
    p.add_argument("--inplace", action="store_true",
                   help="keep the training processes alive across epochs (the script uses "
                   "malletrain_core.worker.inplace.Elastic); no torchrun: the launcher starts "
                   "--nproc-per-node processes itself")
    p.add_argument("--torchrun", help="the torchrun command, split like a shell would "
                   "(default: this Python's torch.distributed.run)")
    p.add_argument("--debug", action="store_true", help="debug logging")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, stream=sys.stderr,
                        format="malletrain-run: %(message)s")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = os.environ
    control_dir = ""
    try:
        if not command:
            raise MalleTrainError("no training command; usage: malletrain-run [options] -- "
                                  "python train.py ARGS")
        if args.poll_s <= 0:
            raise MalleTrainError("--poll-s must be > 0")
        nproc = nproc_per_node(args.nproc_per_node, env)
        ident = identity_from_env(env)
        (host, port), cfg_socket = _daemon_address(args.daemon, env)
        secret = env.get(jobsecret.ENV_SECRET)
        munge: Munge | jobsecret.JobSecretAuth = Munge(args.munge_socket or cfg_socket) \
            if not secret else jobsecret.JobSecretAuth(ident.job, secret)
        submit_dir = job_variable(env, "submit_dir") or "."
        ckpt = args.checkpoint_dir or env.get(training.ENV_CHECKPOINT_DIR) or str(
            Path(submit_dir) / f"malletrain-{ident.job}")
        control_dir = tempfile.mkdtemp(prefix=f"malletrain-{ident.job}-{ident.task}-")
        torchrun = shlex.split(args.torchrun) if args.torchrun else TORCHRUN
        launcher = Launcher(ident, command, TcpClient(host, port, munge), munge,
                            checkpoint_dir=str(Path(ckpt).resolve()), control_dir=control_dir,
                            poll_s=args.poll_s, nproc_per_node=nproc,
                            node_addr=env.get(ENV_NODE_ADDR, ""), torchrun=torchrun,
                            inplace=args.inplace)
    except MalleTrainError as exc:
        print(f"malletrain-run: error: {exc}", file=sys.stderr)
        return 2

    def _terminate(signum: int, _frame: FrameType | None) -> None:
        launcher.shutdown()
        shutil.rmtree(control_dir, ignore_errors=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    try:
        return launcher.run()
    finally:
        launcher.shutdown()
        shutil.rmtree(control_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
