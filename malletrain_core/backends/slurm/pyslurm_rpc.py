"""The reads and actions of the Slurm backend made through pyslurm, in whichever process has a
matching pyslurm: the daemon's own, or a long-lived process that runs this file under another
Python (``python -I pyslurm_rpc.py``: standard library and pyslurm only, so it imports no
sibling module), one JSON request and one JSON answer per line (:func:`main`).
:class:`~.pyslurm_reader.PyslurmSource` is the daemon's side of it.

Reads: :func:`snapshot` asks slurmctld through pyslurm (``Nodes.load()``, ``Jobs.load()``: two
RPCs) and writes what it got in the exact text formats the poll's commands print
(``slurm_parse.SINFO_FORMAT``, ``SQUEUE_FORMAT``, ``PLAN_FORMAT``), so the same parsers, and
the same golden files, serve both paths.

Actions: the backend's ``scontrol hold|release|requeuehold [Incomplete] A_[i,j]``, its grow's
``scontrol update JobId=A_i ReqNodeList=N StartTime=now TimeLimit=M`` and ``scancel A`` are
the same RPCs made in this process (:class:`Actions`), one per job list as scontrol makes them.
pyslurm's own ``Job(id).hold()/release()/modify()/requeue()`` take an integer job id, and an
integer names a whole array when it is the array's id or the record of its still-pending
tasks (slurmctld's ``update_job_str``): one task of an array can only be named ``A_i``. So the
per-task actions call the libslurm that pyslurm loaded (``slurm_update_job2``,
``slurm_requeue2``: string job ids) through ctypes, with ``job_desc_msg_t``'s layout per
release from :data:`JOB_DESC` (checked against each release's slurm.h by the matrix tests);
``scancel`` of whole arrays is pyslurm's ``Job(A).cancel()``. Failures come back as the text
scontrol prints on stderr, so the backend's error handling is the commands'.

"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
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


def _squeue_rows(jobs: Any, keep: Any) -> tuple[list[str], list[str]]:
    """(squeue rows of the jobs ``keep(job)`` accepts, plan rows of every pending job)."""
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
                        f"{job.scheduled_nodes or NULL}|{job.partition}|"
                        f"{job.state_reason or 'None'}|{_time(job.submit_time)}")
        if not keep(job):
            continue
        for index in indices:
            cols = [job.id, aid if aid is not None else job.id,
                    "N/A" if index is None else index, job.state, job.allocated_nodes or "",
                    _duration(job.time_limit), job.requeue_count or 0,
                    job.priority if job.priority is not None else 0, job.user_name or "",
                    job.state_reason or "None", job.admin_comment or NULL]
            squeue.append("|".join(str(c) for c in cols))
    return squeue, plan


def snapshot(pyslurm: Any, partition: str) -> dict[str, str]:
    """The texts of ``sinfo -h -N -p P -o SINFO_FORMAT``, ``squeue -h -r -t all -p P -O
    SQUEUE_FORMAT`` and ``squeue -h -t PD --start -o PLAN_FORMAT`` (times as Unix seconds)."""
    nodes = pyslurm.Nodes.load()
    jobs = pyslurm.Jobs.load()
    sinfo = [f"{n.name}|{node_code(n.state)}" for n in sorted(
        nodes.values(), key=lambda n: n.name) if partition in (n.partitions or [])]
    squeue, plan = _squeue_rows(jobs, lambda job: job.partition == partition)
    return {"sinfo": "\n".join(sinfo) + "\n", "squeue": "\n".join(squeue) + "\n",
            "plan": "\n".join(plan) + "\n"}


def tasks(pyslurm: Any, arrays: Sequence[str]) -> str:
    """The text of ``squeue -h -r -t all -j A,B -O SQUEUE_FORMAT`` (one RPC)."""
    wanted = {int(a) for a in arrays}
    squeue, _ = _squeue_rows(pyslurm.Jobs.load(), lambda job: (
        job.array_id if job.array_id is not None else job.id) in wanted)
    return "\n".join(squeue) + ("\n" if squeue else "")


# ---------------------------------------------------------------------------- actions
JOB_DESC: dict[str, dict[str, int]] = {
    "24.11": {"size": 912, "alloc_sid": 36, "begin_time": 80, "job_id_str": 344,
              "priority": 504, "req_nodes": 544, "time_limit": 660},
    "25.11": {"size": 944, "alloc_sid": 48, "begin_time": 88, "job_id_str": 352,
              "priority": 512, "req_nodes": 552, "time_limit": 692},
}
"""``sizeof(job_desc_msg_t)`` and the ``offsetof`` of the fields the actions set, per release
series (x86_64; the ABI is fixed within a series). tests/slurm/test_pyslurm_act.py compiles a
probe against each release's slurm.h and compares. A series not listed: actions through the
commands."""
INFINITE = 0xFFFFFFFF
JOB_RUNNING = 1  # requeue only a task still running: scontrol's "Incomplete"
JOB_REQUEUE_HOLD = 1 << 11


class _ArrayResp(ctypes.Structure):
    _fields_ = [("count", ctypes.c_uint32), ("ids", ctypes.POINTER(ctypes.c_char_p)),
                ("codes", ctypes.POINTER(ctypes.c_uint32)),
                ("messages", ctypes.POINTER(ctypes.c_char_p))]


def split_job_list(text: str) -> list[str]:
    """``9_[0,2],10_1`` → ``['9_[0,2]', '10_1']`` (commas inside brackets kept): one RPC each,
    as scontrol sends them."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in [*out, cur] if p]


def libslurm_path() -> str:
    """The libslurm this process loaded (with pyslurm)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libslurm" in path and ".so" in path:
                return path
    raise OSError("no libslurm loaded in this process (import pyslurm first)")


class Actions:
    """The backend's actions as the RPCs scontrol and scancel make (see the module doc)."""

    def __init__(self, pyslurm: Any, series: str) -> None:
        layout = JOB_DESC.get(series)
        if not layout:
            raise OSError(f"job_desc_msg_t's layout for Slurm {series} is not known")
        self.pyslurm = pyslurm
        self.layout = layout
        lib = ctypes.CDLL(libslurm_path(), use_errno=True)  # libslurm reports in errno
        resp = ctypes.POINTER(ctypes.POINTER(_ArrayResp))
        lib.slurm_init_job_desc_msg.argtypes = [ctypes.c_void_p]
        lib.slurm_update_job2.argtypes = [ctypes.c_void_p, resp]
        lib.slurm_requeue2.argtypes = [ctypes.c_char_p, ctypes.c_uint32, resp]
        lib.slurm_free_job_array_resp.argtypes = [ctypes.POINTER(_ArrayResp)]
        lib.slurm_strerror.argtypes = [ctypes.c_int]
        lib.slurm_strerror.restype = ctypes.c_char_p
        self.lib = lib

    def _strerror(self, code: int) -> str:
        return (self.lib.slurm_strerror(code) or b"").decode(errors="replace")

    def _answer(self, rc: int, job: str, resp: Any) -> list[str]:
        """stderr lines as scontrol prints them for one job list."""
        if rc != 0:
            return [f"{self._strerror(ctypes.get_errno())} for job {job}"]
        lines: list[str] = []
        if resp:
            r = resp.contents
            for i in range(r.count):
                if r.codes[i]:
                    msg = r.messages[i] or self._strerror(r.codes[i]).encode()
                    lines.append(f"{(r.ids[i] or b'').decode()}: {msg.decode(errors='replace')}")
            self.lib.slurm_free_job_array_resp(resp)
        return lines

    def update(self, jobs: str, **fields: Any) -> list[str]:
        """``slurm_update_job2`` per job list; ``fields``: req_nodes, begin_time, time_limit,
        priority, alloc_sid."""
        errors: list[str] = []
        for job in split_job_list(jobs):
            desc = ctypes.create_string_buffer(self.layout["size"] + 64)
            self.lib.slurm_init_job_desc_msg(desc)
            keep = [ctypes.create_string_buffer(job.encode())]
            ctypes.c_void_p.from_buffer(desc, self.layout["job_id_str"]).value = \
                ctypes.addressof(keep[0])
            for name, value in fields.items():
                off = self.layout[name]
                if name == "req_nodes":
                    keep.append(ctypes.create_string_buffer(str(value).encode()))
                    ctypes.c_void_p.from_buffer(desc, off).value = ctypes.addressof(keep[-1])
                elif name == "begin_time":
                    ctypes.c_int64.from_buffer(desc, off).value = int(value)
                else:
                    ctypes.c_uint32.from_buffer(desc, off).value = int(value)
            resp = ctypes.POINTER(_ArrayResp)()
            rc = self.lib.slurm_update_job2(desc, ctypes.byref(resp))
            errors += self._answer(rc, job, resp)
        return errors

    def scontrol(self, verb: str, jobs: str) -> list[str]:
        """``scontrol hold|release|requeuehold [Incomplete] JOBS`` (hold: an admin hold)."""
        words = verb.split()
        if words[0] == "hold":
            return self.update(jobs, priority=0, alloc_sid=0)
        if words[0] == "release":
            return self.update(jobs, priority=INFINITE)
        if words[0] != "requeuehold" or words[1:] not in ([], ["Incomplete"]):
            raise ValueError(f"scontrol {verb}: not an action of the backend")
        flags = JOB_REQUEUE_HOLD | (JOB_RUNNING if words[1:] else 0)
        errors: list[str] = []
        for job in split_job_list(jobs):
            resp = ctypes.POINTER(_ArrayResp)()
            rc = self.lib.slurm_requeue2(job.encode(), flags, ctypes.byref(resp))
            errors += self._answer(rc, job, resp)
        return errors

    def grow(self, key: str, node: str, minutes: int) -> list[str]:
        """``scontrol update JobId=KEY ReqNodeList=NODE StartTime=now TimeLimit=MINUTES``."""
        return self.update(key, req_nodes=node, begin_time=time.time(), time_limit=minutes)

    def cancel(self, arrays: Sequence[str]) -> list[str]:
        """``scancel A B``: pyslurm's ``Job(A).cancel()`` (a whole array by its id)."""
        errors: list[str] = []
        for aid in arrays:
            try:
                self.pyslurm.Job(int(aid)).cancel()
            except Exception as exc:  # pyslurm.RPCError: that array's message, as scancel's
                errors.append(f"scancel: error: Kill job error on job id {aid}: {exc}")
        return errors


def handle(pyslurm: Any, actions: Actions | None, request: dict[str, Any]) -> dict[str, Any]:
    """One request of the backend (a read or an action) → its answer."""
    op = request.get("op", "snapshot")
    if op == "snapshot":
        return snapshot(pyslurm, request["partition"])
    if op == "tasks":
        return {"squeue": tasks(pyslurm, request["arrays"])}
    if actions is None:
        raise OSError("no actions through pyslurm here")
    if op == "scontrol":
        return {"errors": actions.scontrol(request["verb"], request["jobs"])}
    if op == "grow":
        return {"errors": actions.grow(request["key"], request["node"], request["minutes"])}
    if op == "cancel":
        return {"errors": actions.cancel(request["arrays"])}
    raise ValueError(f"unknown request {op!r}")


def hello(pyslurm: Any) -> dict[str, str]:
    """pyslurm's version and the controller's (one RPC, no process)."""
    return {"pyslurm": pyslurm.__version__,
            "slurm": str(pyslurm.slurmctld.Config.load().version)}


def probe(attempt: Any = None, timeout_s: float = 60.0) -> dict[str, str]:
    """:func:`hello` in a forked child of this (single-threaded helper) process, so that the
    helper loads pyslurm only once it is known to work here: a pyslurm built for another Slurm
    release loads that release's libslurm, which ends its process (libslurm's ``fatal()``)
    when the cluster's plugins are of another version, e.g. 25.11's pyslurm on 26.05:
    "Incompatible Slurm plugin .../auth_munge.so version (26.05.3)". ``attempt`` (tests): what
    the child runs instead of importing pyslurm and asking. Returns hello's answer, or
    ``{"error": one line}`` with the child's error or its last words on stderr."""
    import signal
    import tempfile

    def ask() -> dict[str, str]:
        import pyslurm
        return hello(pyslurm)

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: its answer on ``out``, libslurm's words on ``err``
            code = 1
            try:
                os.dup2(err.fileno(), 2)
                try:
                    answer = (attempt or ask)()
                    code = 0
                except Exception as exc:  # ImportError, pyslurm's RPCError
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                os.write(out.fileno(), json.dumps(answer).encode())
            finally:
                os._exit(code)
        deadline = time.monotonic() + timeout_s
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"error": f"pyslurm gave no answer within {timeout_s:g} s"}
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        said_out = out.read().decode(errors="replace").strip()
        said_err = err.read().decode(errors="replace")
    if said_out:
        try:
            return dict(json.loads(said_out))
        except ValueError:
            pass
    try:
        from importlib.metadata import version
        which = f"pyslurm {version('pyslurm')}"
    except Exception:  # importlib.metadata.PackageNotFoundError, a broken installation
        which = "pyslurm"
    lines = [" ".join(x.split()) for x in said_err.splitlines() if x.strip()]
    said = "; ".join(lines[:1] + lines[-1:] if len(lines) > 2 else lines)  # the cause, the end
    code = os.waitstatus_to_exitcode(status)
    return {"error": f"{which} ended its process on loading (code {code}): "
                     f"{said[:400] or 'nothing said'}"}


def series(version: str) -> str:
    """``24.11.5`` → ``24.11``; pyslurm's ``23.2.1`` → ``23.02`` (as Slurm writes it)."""
    major, minor = (version.split(".") + ["0"])[:2]
    try:
        return f"{int(major):02d}.{int(minor):02d}"
    except ValueError:
        return version


def make_actions(pyslurm: Any) -> tuple[Actions | None, str]:
    """(the actions, "") or (None, why they go through the commands)."""
    try:
        return Actions(pyslurm, series(pyslurm.__version__)), ""
    except (OSError, AttributeError) as exc:
        return None, str(exc)


def main() -> int:
    """Helper mode: one JSON request per stdin line, one JSON answer per stdout line. The
    first line is :func:`hello`'s answer, asked by a :func:`probe` first."""
    info: dict[str, Any] = probe()
    if "error" in info or series(info["pyslurm"]) != series(info["slurm"]):
        print(json.dumps(info), flush=True)  # the daemon refuses it with this
        return 1
    try:
        import pyslurm
        info = hello(pyslurm)
    except Exception as exc:  # ImportError, a version mismatch, slurmctld down
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    actions, info["no_actions"] = make_actions(pyslurm)
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        try:
            answer = handle(pyslurm, actions, json.loads(line))
        except Exception as exc:  # one failed call must not end the helper
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
