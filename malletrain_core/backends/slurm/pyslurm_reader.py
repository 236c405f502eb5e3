"""How the daemon reaches a matching pyslurm (``slurm.pyslurm``): :func:`choose` decides once,
at start, between the commands and pyslurm; :class:`PyslurmSource` makes the backend's reads and
actions through it (:mod:`.pyslurm_rpc`), in this process or in a long-lived helper process.

pyslurm's MAJOR.MINOR must equal the cluster's. Where the daemon's own Python imports a
matching pyslurm, :class:`PyslurmSource` calls :mod:`.pyslurm_rpc` in-process. The local
cluster's newer releases run in a chroot whose libslurm needs a newer glibc than the host's,
so there the helper runs ``pyslurm_rpc.py`` under the chroot's Python, one JSON line per call.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ...errors import CommandError
from ...runner import CommandRunner
from . import pyslurm_rpc
from .pyslurm_rpc import Actions, handle, hello, make_actions, series


class PyslurmSource:
    """The backend's reads and actions through pyslurm: in-process (``argv`` None) or through a
    helper process that runs :mod:`.pyslurm_rpc` under a Python that imports a matching pyslurm
    (``argv``: e.g. ``["chroot", ROOT, "/opt/pyslurm-24.11/bin/python"]``)."""

    def __init__(self, argv: Sequence[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.argv = list(argv) if argv is not None else None
        self.env = env
        self._proc: Any = None  # the helper: a subprocess.Popen from CommandRunner.start
        self._lock = threading.Lock()
        self._pyslurm: Any = None
        self._actions: Actions | None = None
        self.version = ""
        self.slurm = ""
        """The controller's Slurm version, as slurmctld reported it."""
        self.no_actions = ""
        """Why the actions go through the commands ("" when they go through pyslurm)."""

    @property
    def acts(self) -> bool:
        return not self.no_actions

    def hello(self) -> None:
        """Load pyslurm (start the helper) and ask the controller's version: raises a
        CommandError when either fails."""
        if self.argv is None:
            with self._lock:
                self._in_process()
        else:
            with self._lock:
                self._helper()

    def _in_process(self) -> Any:
        if self._pyslurm is None:
            try:
                import pyslurm
                info = hello(pyslurm)
            except Exception as exc:  # ImportError, pyslurm's RPCError
                raise self._error(f"{type(exc).__name__}: {exc}") from exc
            self._actions, self.no_actions = make_actions(pyslurm)
            self.version, self.slurm, self._pyslurm = info["pyslurm"], info["slurm"], pyslurm
        return self._pyslurm

    def _helper(self) -> Any:
        if self._proc is None or self._proc.poll() is not None:
            assert self.argv is not None
            self._proc = CommandRunner(env=self.env).start(
                [*self.argv, "-I", os.path.abspath(pyslurm_rpc.__file__)])
            info = json.loads(self._read(self._proc))
            if "error" in info:
                self.close()
                raise self._error(info["error"])
            self.version, self.slurm = info["pyslurm"], info["slurm"]
            self.no_actions = info.get("no_actions", "")
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
        """A CommandError, as a failed command would be: the daemon retries at the next poll."""
        return CommandError([*(self.argv or ["pyslurm"]), "pyslurm_rpc"], None, "", "",
                            f"pyslurm: {reason}")

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request (see :func:`handle`) answered in this process or by the helper."""
        with self._lock:
            if self.argv is None:
                pyslurm = self._in_process()
                try:
                    return handle(pyslurm, self._actions, request)
                except Exception as exc:  # pyslurm's RPCError and what else a call may raise
                    raise self._error(f"{type(exc).__name__}: {exc}") from exc
            proc = self._helper()
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            answer = json.loads(self._read(proc))
        if "error" in answer:
            raise self._error(answer["error"])
        return dict(answer)

    def snapshot(self, partition: str) -> dict[str, str]:
        return self.call({"op": "snapshot", "partition": partition})

    def tasks(self, arrays: Sequence[str]) -> str:
        """``squeue -h -r -t all -j ARRAYS -O SQUEUE_FORMAT``."""
        return str(self.call({"op": "tasks", "arrays": list(arrays)})["squeue"])

    def _act(self, argv: list[str], request: dict[str, Any]) -> None:
        """An action; its failures raise the CommandError the command would have raised."""
        errors = self.call(request)["errors"]
        if errors:
            raise CommandError(argv, 1, "", "\n".join(errors) + "\n")

    def scontrol(self, verb: str, jobs: str) -> None:
        """``scontrol VERB JOBS`` (hold, release, requeuehold [Incomplete])."""
        self._act(["scontrol", *verb.split(), jobs], {"op": "scontrol", "verb": verb,
                                                      "jobs": jobs})

    def grow(self, key: str, node: str, minutes: int) -> None:
        """``scontrol update JobId=KEY ReqNodeList=NODE StartTime=now TimeLimit=MINUTES``."""
        self._act(["scontrol", "update", f"JobId={key}", f"ReqNodeList={node}"],
                  {"op": "grow", "key": key, "node": node, "minutes": int(minutes)})

    def cancel(self, arrays: Sequence[str]) -> None:
        """``scancel ARRAYS``."""
        self._act(["scancel", *arrays], {"op": "cancel", "arrays": list(arrays)})

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


def choose(setting: str, env: dict[str, str] | None = None) -> tuple[PyslurmSource | None, str]:
    """The one place that decides how the Slurm backend talks to slurmctld, from the
    ``slurm.pyslurm`` setting: (a source, or None for the commands; one line saying which and
    why). ``malletraind`` logs the line; ``malletrain admin check`` prints it.

    ``off``: the commands. ``auto``: pyslurm in this Python when it imports and its
    MAJOR.MINOR is the controller's (asked through pyslurm by a helper process of this Python
    first, once: see :func:`probe`; no Slurm command is started). Anything
    else is the command of a helper Python (split like a shell line, no shell), held to the
    same rule.
    """
    setting = setting.strip()
    if setting in ("", "off"):
        return None, "commands (slurm.pyslurm = \"off\")"
    where = "this Python" if setting == "auto" else f"helper {setting!r}"
    if setting == "auto":
        # First in a helper process of this Python (which asks in a forked child first): a
        # pyslurm of another release may end the process that loads it (see probe), and the
        # daemon must never be that process.
        trial = PyslurmSource([sys.executable], env=env)
        try:
            trial.hello()
        except Exception as exc:  # CommandError: as below
            return None, f"commands (no pyslurm in {where}: {' '.join(str(exc).split())})"
        finally:
            trial.close()
        if series(trial.version) != series(trial.slurm):
            return None, (f"commands (pyslurm {trial.version} in {where} does not match Slurm "
                          f"{trial.slurm}: MAJOR.MINOR must be equal)")
    src = PyslurmSource(None if setting == "auto" else shlex.split(setting), env=env)
    try:
        src.hello()
    except Exception as exc:  # CommandError: pyslurm does not import, or slurmctld is down
        src.close()
        # one line, whatever the import or the helper printed (a traceback, a linker error)
        return None, f"commands (no pyslurm in {where}: {' '.join(str(exc).split())})"
    if series(src.version) != series(src.slurm):
        src.close()
        return None, (f"commands (pyslurm {src.version} in {where} does not match Slurm "
                      f"{src.slurm}: MAJOR.MINOR must be equal)")
    acts = ("reads and actions" if src.acts else
            f"reads (actions through the commands: {src.no_actions})")
    return src, f"pyslurm {src.version} in {where}, Slurm {src.slurm}: {acts}"


def source_for(setting: str, runner: Any = None) -> PyslurmSource | None:
    """:func:`choose` for the daemon: the line is logged once."""
    src, line = choose(setting, getattr(runner, "env", None))
    logging.getLogger(__name__).log(logging.INFO if src is not None or setting.strip() in (
        "", "off") else logging.WARNING, "Slurm backend: %s", line)
    return src
