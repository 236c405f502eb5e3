"""The training-side API: what a user's ``train.py`` calls.

    from malletrain_core.worker import training

    session = training.Session()                 # reads what malletrain-run set up
    state = session.resume()                     # last checkpoint, at any world size, or None
    lr = training.scale_lr(0.1, global_batch=batch * session.world_size, reference_batch=256)
    for step in ...:
        ...one optimiser step...
        session.report(samples=batch * session.world_size)   # the one line in the loop
        if session.should_checkpoint():
            session.checkpoint({"model": model_state, "optimizer": opt_state}, step)

``report`` never blocks: rank 0 sends at most one signed datagram every ``report_interval_s``.
Checkpoints are written by rank 0 only, atomically (temporary file, fsync, rename), hold
plain (un-wrapped) state so any world size can load them, and are taken periodically and
when the daemon asks (before a planned rescale), never on SIGTERM: the worker exits at once so
the batch system's own job is not delayed. Outside MalleTrain (no launcher environment) the
same script runs as a plain single-process training: reports go nowhere.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..wire import reports

ENV_JOB = "MALLETRAIN_JOB_ID"
ENV_EPOCH = "MALLETRAIN_EPOCH"
ENV_REPORT_ADDR = "MALLETRAIN_REPORT_ADDR"
ENV_REPORT_KEY = "MALLETRAIN_REPORT_KEY"
ENV_CHECKPOINT_DIR = "MALLETRAIN_CHECKPOINT_DIR"
ENV_CONTROL_DIR = "MALLETRAIN_CONTROL_DIR"
ENV_INPLACE = "MALLETRAIN_INPLACE"
ENV_LAUNCHER_PID = "MALLETRAIN_LAUNCHER_PID"
CHECKPOINT_NAME = "checkpoint.pt"
REQUEST_NAME = "checkpoint-request"
REPORT_CHANNEL_NAME = "report-channel"   # "ADDR KEYHEX", for a process started before its key
RESTART_EXIT_CODE = 75
"""In place, a training process that takes the restart path (a new membership it cannot join
in process) exits with this code, and ``malletrain-run --inplace`` starts it again at once."""


def scale_lr(base_lr: float, global_batch: int, reference_batch: int) -> float:
    """The linear scaling rule: the learning rate grows with the global batch size."""
    if reference_batch <= 0 or global_batch <= 0:
        raise ValueError("batch sizes must be positive")
    return base_lr * global_batch / reference_batch


def _start_ticks(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), which
    tells it apart from a later process given the same pid; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name, in parentheses, may hold spaces
    return fields[19] if len(fields) > 19 else None


def watch_launcher(env: Mapping[str, str], poll_s: float = 1.0) -> threading.Thread | None:
    """End this process soon after the node's launcher is gone.

    ``malletrain-run`` starts the training command in a session of its own and stops the whole
    tree itself when the batch system ends the job with SIGTERM. A batch system that kills the
    job's processes without one (PBS's ``qdel -Wforce``, a kill after the grace time) ends the
    launcher alone: its torchrun and workers would go on training on a node the job no longer
    holds. So every process with ``MALLETRAIN_LAUNCHER_PID`` in its environment watches that
    process (pid and start time) and leaves with exit code 1 once it has ended. Returns the
    daemon thread, or None where there is nothing to watch (no launcher, or no ``/proc``)."""
    global _watching
    try:
        pid = int(env.get(ENV_LAUNCHER_PID, ""))
    except ValueError:
        return None
    if _watching is not None and _watching.is_alive():
        return _watching  # one watch per process, however many sessions it makes
    ticks = _start_ticks(pid)
    def leave() -> None:
        print(f"malletrain: the launcher (pid {pid}) has ended: exiting", file=sys.stderr,
              flush=True)
        os._exit(1)

    if pid <= 1 or ticks is None:
        if pid > 1 and Path("/proc/self/stat").exists():  # gone before we looked
            leave()
        return None

    def watch() -> None:
        while _start_ticks(pid) == ticks:
            time.sleep(poll_s)
        leave()

    _watching = threading.Thread(target=watch, name="malletrain-launcher-watch", daemon=True)
    _watching.start()
    return _watching


_watching: threading.Thread | None = None


def exit_on_sigterm() -> None:
    """Exit at once on SIGTERM (the preempting job waits for us; checkpoints are periodic)."""
    def _handler(signum: int, _frame: object) -> None:
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, _handler)


def _unwrap(state: Any) -> Any:
    """Strip DistributedDataParallel's ``module.`` prefix so any world size can load it."""
    if isinstance(state, Mapping) and state and all(isinstance(k, str) for k in state):
        if all(k.startswith("module.") for k in state):
            return {k[len("module."):]: v for k, v in state.items()}
        return {k: _unwrap(v) for k, v in state.items()}
    return state


class Session:
    """One worker's view of its MalleTrain job (rank, world size, reporting, checkpoints)."""

    def __init__(self, checkpoint_every_s: float = 300.0, report_interval_s: float = 2.0,
                 env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time, handle_sigterm: bool = True) -> None:
        env = os.environ if env is None else env
        if "torch" in sys.modules:  # a training process, before it builds its optimizer
            from .startup import defer_dynamo

            defer_dynamo()
        self.job_id = env.get(ENV_JOB, "")
        self.epoch = int(env.get(ENV_EPOCH, "0"))
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.local_world_size = max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1))
        self.checkpoint_dir = Path(env.get(ENV_CHECKPOINT_DIR, "checkpoints"))
        control = env.get(ENV_CONTROL_DIR)
        self._control = Path(control) if control else None
        self._request = Path(control) / REQUEST_NAME if control else None
        self._request_seen = self._request_mtime()
        self._clock = clock
        self._every_s = checkpoint_every_s
        self._interval_s = report_interval_s
        self._last_ckpt_t = clock()
        self._last_send_t = 0.0
        self._seq = 0
        self._ckpt_ack: int | None = None
        self._save_error = ""
        self.samples = 0.0
        self.dropped_reports = 0
        self._key = bytes.fromhex(env[ENV_REPORT_KEY]) if env.get(ENV_REPORT_KEY) else b""
        self._addr: tuple[str, int] | None = None
        self._sock: socket.socket | None = None
        addr = env.get(ENV_REPORT_ADDR, "")
        if addr and self.job_id and self._key:
            host, _, port = addr.rpartition(":")
            self._addr = (host or "127.0.0.1", int(port))
        self._open_reports()
        if handle_sigterm:
            exit_on_sigterm()
        if env is os.environ:  # a real process, not a test's environment
            watch_launcher(env)

    def _open_reports(self) -> None:
        """The chief (rank 0) sends reports; other ranks hold no socket."""
        if self._addr is not None and self.rank == 0 and self._sock is None:
            family = socket.AF_INET6 if ":" in self._addr[0] else socket.AF_INET
            self._sock = socket.socket(family, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        elif self.rank != 0 and self._sock is not None:
            self._sock.close()
            self._sock = None

    def set_membership(self, epoch: int, rank: int, world_size: int) -> None:
        """The membership changed in place (see :mod:`.inplace`): report as the new rank."""
        self.epoch, self.rank, self.world_size = epoch, rank, world_size
        if self._addr is None and self._control is not None and self.job_id:
            try:  # started ahead of its first epoch: the launcher wrote the channel since
                addr, key = (self._control / REPORT_CHANNEL_NAME).read_text().split()
                host, _, port = addr.rpartition(":")
                self._addr, self._key = (host or "127.0.0.1", int(port)), bytes.fromhex(key)
            except (OSError, ValueError):
                pass
        self._open_reports()

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        """The job's node count, what a report's ``world`` says: the daemon sizes jobs in
        nodes, and a node may run several processes (``LOCAL_WORLD_SIZE``, set by torchrun and
        by ``malletrain-run --inplace --nproc-per-node``)."""
        return max(1, self.world_size // self.local_world_size)

    def report(self, samples: float, force: bool = False) -> None:
        """Count ``samples`` (global, this step) and send a report when one is due."""
        self.samples += samples
        now = self._clock()
        if self._sock is None or (not force and now - self._last_send_t < self._interval_s):
            return
        self._last_send_t = now
        self._seq += 1
        report = reports.Report(job=self.job_id, epoch=self.epoch, seq=self._seq, t=now,
                                samples=self.samples, world=self.nodes, rank=self.rank,
                                ckpt=self._ckpt_ack)
        try:
            self._sock.sendto(reports.sign(report, self._key), self._addr)  # type: ignore[arg-type]
            self._ckpt_ack = None
        except OSError:
            self.dropped_reports += 1

    def _request_mtime(self) -> float:
        if self._request is None:
            return 0.0
        try:
            return self._request.stat().st_mtime
        except OSError:
            return 0.0

    def should_checkpoint(self) -> bool:
        """True on the chief when the period has passed or the daemon asked for one."""
        if not self.is_chief:
            return False
        if self._clock() - self._last_ckpt_t >= self._every_s:
            return True
        return self._request_mtime() > self._request_seen

    def checkpoint(self, state: Mapping[str, Any], step: int) -> Path | None:
        """Save ``state`` atomically from the chief; returns the path (None on other ranks,
        and when the save failed).

        A folder that is full, read-only or gone does not stop training: the partial file is
        removed, the last complete checkpoint stays as it was, one line on stderr says why
        (once per distinct cause until a save succeeds again), and the next period tries
        again. The daemon is not told that a checkpoint was made, so a change it asked for
        waits for its checkpoint timeout and the job resumes from the last complete one."""
        if not self.is_chief:
            return None
        import torch

        final = self.checkpoint_dir / CHECKPOINT_NAME
        tmp = final.with_name(f".{CHECKPOINT_NAME}.{os.getpid()}.tmp")
        payload = {"state": _unwrap(dict(state)), "step": int(step), "samples": self.samples,
                   "world_size": self.world_size, "time": self._clock()}
        try:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                torch.save(payload, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except (OSError, RuntimeError) as exc:  # torch.save wraps write errors in RuntimeError
            self._checkpoint_failed(step, exc, tmp)
            return None
        self._save_error = ""
        self.checkpointed(step)
        return final

    def _checkpoint_failed(self, step: int, exc: BaseException, tmp: Path) -> None:
        try:
            tmp.unlink()
        except OSError:
            pass
        self._last_ckpt_t = self._clock()  # try again a period later, not at every step
        self._request_seen = self._request_mtime()  # the daemon's request was tried: it times out
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
            str(exc).splitlines()[0][:200]
        if cause != self._save_error:
            self._save_error = cause
            print(f"malletrain: checkpoint of step {step} to {self.checkpoint_dir} failed "
                  f"({cause}); training goes on and the last complete checkpoint is kept: "
                  "free space or fix the folder's permissions", file=sys.stderr, flush=True)

    def checkpointed(self, step: int) -> None:
        """A checkpoint of ``step`` is complete (written here or by a library such as
        ``torch.distributed.checkpoint``): restart the period and acknowledge it at once."""
        self._last_ckpt_t = self._clock()
        self._request_seen = self._request_mtime()
        self._ckpt_ack = int(step)
        self.report(0.0, force=True)

    def resume(self) -> dict[str, Any] | None:
        """The last checkpoint as ``{"state", "step", "samples", ...}``, or None."""
        path = self.checkpoint_dir / CHECKPOINT_NAME
        if not path.exists():
            return None
        import torch

        payload = torch.load(path, map_location="cpu", weights_only=False)
        self.samples = float(payload.get("samples", 0.0))
        return payload
