"""The poll's three reads through pyslurm instead of ``sinfo``/``squeue`` processes.

:func:`snapshot` asks slurmctld through pyslurm (``Nodes.load()``, ``Jobs.load()``: two RPCs)
and writes what it got in the exact text formats the poll's commands print
(``slurm_parse.SINFO_FORMAT``, ``SQUEUE_FORMAT``, ``PLAN_FORMAT``), so the same parsers, and
the same golden files, serve both paths.

pyslurm's MAJOR.MINOR must equal the cluster's. Where the daemon's own Python imports a
matching pyslurm, :class:`PyslurmSource` calls :func:`snapshot` in-process. The local
cluster's newer releases run in a chroot whose libslurm needs a newer glibc than the host's,
so there the same file runs as a long-lived helper in the chroot (``python -I
pyslurm_reader.py``: standard library and pyslurm only), one JSON line per poll.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

NULL = "(null)"

# The flags ``scontrol``/pyslurm print after the base state, and sinfo's one-character
# suffix for each (man sinfo, NODE STATE CODES).
_SUFFIX = {"NOT_RESPONDING": "*", "POWERED_DOWN": "~", "POWERING_UP": "#",
           "POWERING_DOWN": "%", "POWER_DOWN": "!", "REBOOT_REQUESTED": "@",
           "REBOOT_ISSUED": "^", "MAINTENANCE": "$"}


def node_code(state: str) -> str:
    """pyslurm's ``IDLE+PLANNED`` → sinfo's ``planned``; ``IDLE+NOT_RESPONDING`` → ``idle*``."""
    base, *flags = (state or "UNKNOWN").upper().split("+")
    if "DRAIN" in flags:
        word = "drained" if base in ("IDLE", "DOWN") else "draining"
    elif "COMPLETING" in flags:
        word = "completing"
    elif "FAIL" in flags:
        word = "fail" if base in ("IDLE", "DOWN") else "failing"
    elif "PLANNED" in flags and base == "IDLE":
        word = "planned"
    else:
        word = base.lower()
    return word + "".join(_SUFFIX[f] for f in flags if f in _SUFFIX)


def _duration(minutes: Any) -> str:
    return "UNLIMITED" if minutes is None else str(int(minutes))


def _task_ids(text: str) -> list[int]:
    """``0-2,5`` or ``[0-2,5]`` → [0, 1, 2, 5]."""
    out: list[int] = []
    for part in text.strip("[]").split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _time(value: Any) -> str:
    return str(int(value)) if value else "N/A"


def snapshot(pyslurm: Any, partition: str) -> dict[str, str]:
    """The texts of ``sinfo -h -N -p P -o SINFO_FORMAT``, ``squeue -h -r -t all -p P -O
    SQUEUE_FORMAT`` and ``squeue -h -t PD --start -o PLAN_FORMAT`` (times as Unix seconds)."""
    nodes = pyslurm.Nodes.load()
    jobs = pyslurm.Jobs.load()
    sinfo = [f"{n.name}|{node_code(n.state)}" for n in sorted(
        nodes.values(), key=lambda n: n.name) if partition in (n.partitions or [])]
    squeue: list[str] = []
    plan: list[str] = []
    for job in jobs.values():
        aid = job.array_id
        waiting = job.array_tasks_waiting
        task = job.array_task_id
        if aid is not None and task is None and not waiting:
            task = 0  # pyslurm reads a task id of 0 as "not set"
        if aid is not None and task is None:
            indices: list[int | None] = list(_task_ids(waiting))
        else:
            indices = [task]
        if job.state == "PENDING":
            key = str(job.id) if aid is None else (
                f"{aid}_{task}" if task is not None else f"{aid}_[{waiting}]")
            plan.append(f"{key}|{aid or job.id}|{_time(job.start_time)}|"
                        f"{job.scheduled_nodes or NULL}|{job.partition}")
        if job.partition != partition:
            continue
        for index in indices:
            cols = [job.id, aid if aid is not None else job.id,
                    "N/A" if index is None else index, job.state, job.allocated_nodes or "",
                    _duration(job.time_limit), job.requeue_count or 0,
                    job.priority if job.priority is not None else 0, job.user_name or "",
                    job.state_reason or "None", job.admin_comment or NULL]
            squeue.append("|".join(str(c) for c in cols))
    return {"sinfo": "\n".join(sinfo) + "\n", "squeue": "\n".join(squeue) + "\n",
            "plan": "\n".join(plan) + "\n"}


class PyslurmSource:
    """The poll's reads through pyslurm: in-process (``argv`` None) or through a helper
    process that runs this file under a Python that imports a matching pyslurm (``argv``:
    e.g. ``["chroot", ROOT, "/opt/pyslurm-24.11/bin/python"]``)."""

    def __init__(self, argv: Sequence[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.argv = list(argv) if argv is not None else None
        self.env = env
        self._proc: Any = None  # the helper: a subprocess.Popen from CommandRunner.start
        self._lock = threading.Lock()
        self.version = ""

    def _helper(self) -> Any:
        if self._proc is None or self._proc.poll() is not None:
            assert self.argv is not None
            from ..runner import CommandRunner
            self._proc = CommandRunner(env=self.env).start(
                [*self.argv, "-I", os.path.abspath(__file__)])
            self.version = json.loads(self._read(self._proc))["pyslurm"]
        return self._proc

    def _read(self, proc: Any) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            self._proc = None
            raise self._error(f"exited with code {proc.returncode} (a pyslurm that imports "
                              "and matches the cluster's Slurm? for the local cluster: "
                              "scripts/setup-slurm-matrix.sh pyslurm)")
        return line

    def _error(self, reason: str) -> Exception:
        """A CommandError, as a failed squeue would be: the daemon retries at the next poll."""
        from ..errors import CommandError
        return CommandError([*(self.argv or ["pyslurm"]), "pyslurm_reader"], None, "", "",
                            f"pyslurm read: {reason}")

    def snapshot(self, partition: str) -> dict[str, str]:
        if self.argv is None:
            import pyslurm
            self.version = pyslurm.__version__
            try:
                return snapshot(pyslurm, partition)
            except Exception as exc:  # pyslurm's RPCError and what else a read may raise
                raise self._error(f"{type(exc).__name__}: {exc}") from exc
        with self._lock:
            proc = self._helper()
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"partition": partition}) + "\n")
            proc.stdin.flush()
            answer = json.loads(self._read(proc))
        if "error" in answer:
            raise self._error(answer["error"])
        return dict(answer)

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(5)
            except Exception:  # subprocess.TimeoutExpired: it did not end with its stdin
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def source_for(setting: str, runner: Any = None) -> PyslurmSource | None:
    """The daemon's ``slurm.pyslurm`` setting → a source, or None for the commands.

    ``off``: None. ``auto``: in-process when ``import pyslurm`` works and its MAJOR.MINOR is
    the release of the Slurm commands ``runner`` runs (else None, logged once). Anything else
    is the command of a helper Python (split like a shell line, no shell).
    """
    import logging
    import shlex

    log = logging.getLogger(__name__)
    setting = setting.strip()
    if setting in ("", "off"):
        return None
    if setting != "auto":
        return PyslurmSource(shlex.split(setting), env=getattr(runner, "env", None))
    try:
        import pyslurm
    except ImportError as exc:
        log.info("pyslurm not importable (%s): the poll reads through squeue/sinfo", exc)
        return None
    from ...errors import CommandError
    from .release import SlurmRelease, detect
    try:
        cluster = detect(runner)
    except CommandError as exc:
        log.warning("cannot tell the Slurm release (%s): the poll reads through squeue/sinfo",
                    exc)
        return None
    mine = SlurmRelease.parse(pyslurm.__version__)
    if mine.series != cluster.series:
        log.warning("pyslurm %s does not match Slurm %s: the poll reads through squeue/sinfo",
                    pyslurm.__version__, cluster)
        return None
    log.info("the poll reads through pyslurm %s (Slurm %s)", pyslurm.__version__, cluster)
    return PyslurmSource()


def main() -> int:
    """Helper mode: one JSON request per stdin line, one JSON answer per stdout line."""
    import pyslurm
    print(json.dumps({"pyslurm": pyslurm.__version__}), flush=True)
    for line in sys.stdin:
        try:
            answer = snapshot(pyslurm, json.loads(line)["partition"])
        except Exception as exc:  # one failed read must not end the helper
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
