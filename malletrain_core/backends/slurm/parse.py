"""All parsing of Slurm's output, in one module (verified against Slurm 22.05 to 26.05).

Formatted ``squeue``/``sinfo`` output is the most stable interface across Slurm releases
(the JSON schemas move with every release, and 22.05's ``squeue --json`` ignores filters).
Every parser here is defensive: a line it cannot read is skipped and logged, never a crash,
since one odd job in a site's queue must not stop the daemon. Golden fixtures per Slurm
version live in ``tests/golden/slurm/<version>/``.

Times: Slurm prints local time (``2026-11-21T09:23:51``) unless ``SLURM_TIME_FORMAT`` says
otherwise; :func:`parse_time` reads that and Unix seconds (``SLURM_TIME_FORMAT=%s``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...errors import ValidationError
from ...hostlist import EMPTY_MARKERS, expand
from ..states import NodeState, TaskState
from .states import node_state, task_state

log = logging.getLogger(__name__)

TAG_PREFIX = "malletrain:"
"""What job_submit.lua writes at the start of an elastic job's admin_comment."""

# squeue -O field names (22.05 man squeue). admin_comment comes last: it is the only free
# text, so a '|' inside it cannot shift the other columns.
SQUEUE_FIELDS = ("JobID", "ArrayJobID", "ArrayTaskID", "State", "NodeList", "TimeLimit",
                 "RestartCnt", "PriorityLong", "UserName", "Reason", "admin_comment")
SQUEUE_FORMAT = ",".join(f"{name}:|" for name in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:"
"""``squeue -O`` argument: ``Name:|`` is "no padding, then a '|'" (verified on 22.05)."""

SINFO_FORMAT = "%N|%T"
"""``sinfo -N -o`` argument: one line per node, the long state with its flag suffix."""

PLAN_FORMAT = "%i|%F|%S|%Y|%P|%r|%V"
"""``squeue -t PD --start -o`` argument: job, array job, planned start, SchedNodes, partition,
pending reason, submit time."""

HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "job requeued in held state",
                          "job_requeued_in_held_state"})

_NODE_FLAG_CHARS = "*~#%!@$^-+"
_UNUSABLE_FLAGS = set("*~#%!@$^")
"""Not responding, powered down/up/ing, rebooting, maintenance: not a node to give out."""

_warned: set[str] = set()


def warn_once(key: str, msg: str, *args: object) -> None:
    """Log a warning the first time ``key`` is seen (one odd line must not flood the log)."""
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


# --------------------------------------------------------------------------- scalars

def parse_time(text: str) -> float | None:
    """Slurm timestamp → Unix seconds; ``None`` for N/A, Unknown, None, (null)."""
    text = text.strip()
    if not text or text in ("N/A", "Unknown", "None", "(null)", "0"):
        return None
    if text.isdigit():
        return float(text)
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        warn_once(f"time:{text}", "cannot read Slurm time %r: unset SLURM_TIME_FORMAT or set "
                   "it to 'standard' for the MalleTrain daemon", text)
        return None


def parse_duration(text: str) -> float | None:
    """Slurm duration (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, minutes) → seconds.

    ``None`` for UNLIMITED, INFINITE, NOT_SET, N/A and anything unreadable.
    """
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NOT_SET", "N/A", "NONE"):
        return None
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3:
        warn_once(f"dur:{text}", "cannot read Slurm duration %r", text)
        return None
    nums = [int(p) for p in parts]
    if len(nums) == 1:
        secs = nums[0] * 60
    elif len(nums) == 2:
        secs = nums[0] * 60 + nums[1]
    else:
        secs = nums[0] * 3600 + nums[1] * 60 + nums[2]
    return float(days * 86400 + secs)


def minutes_within(seconds: float) -> int:
    """Whole minutes that end no later than ``seconds`` (Slurm's TimeLimit unit)."""
    return max(0, int(seconds // 60))


def _int(text: str, default: int = 0) -> int:
    text = text.strip()
    return int(text) if text.isdigit() else default


def _nodes(text: str) -> tuple[str, ...]:
    text = text.strip()
    if text in EMPTY_MARKERS:
        return ()
    try:
        return tuple(expand(text))
    except ValidationError:
        warn_once(f"hl:{text}", "cannot read Slurm hostlist %r: ignored", text)
        return ()


# --------------------------------------------------------------------------- the tag

@dataclass(frozen=True)
class ElasticTag:
    """The elastic request job_submit.lua wrote into admin_comment."""

    min_nodes: int
    max_nodes: int
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.options.get("model", "")

    @property
    def profile(self) -> bool:
        """False when the user opted out of profiling (``profile=no``)."""
        return self.options.get("profile", "yes").lower() not in ("no", "0", "false", "off")


def parse_tag(text: str) -> ElasticTag | None:
    """``malletrain:min=LO,max=HI[,key=value...]`` → :class:`ElasticTag`; ``None`` if untagged.

    Raises :class:`ValidationError` for a tag that is there but cannot be meant.
    """
    text = text.strip()
    if not text.startswith(TAG_PREFIX):
        return None
    body = text[len(TAG_PREFIX):]
    opts: dict[str, str] = {}
    for item in body.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValidationError("admin_comment", repr(text),
                                  f"{item!r} is not key=value; job_submit.lua writes "
                                  "malletrain:min=LO,max=HI[,key=value...]")
        opts[key] = value
    try:
        lo, hi = int(opts.pop("min")), int(opts.pop("max"))
    except KeyError as exc:
        raise ValidationError("admin_comment", repr(text), f"{exc.args[0]}= is missing") from None
    except ValueError:
        raise ValidationError("admin_comment", repr(text), "min and max must be whole "
                              "numbers") from None
    if lo < 1 or hi < lo:
        raise ValidationError("admin_comment", repr(text), f"min={lo},max={hi} needs "
                              "1 <= min <= max")
    return ElasticTag(lo, hi, opts)


# --------------------------------------------------------------------------- squeue

@dataclass(frozen=True)
class TaskRow:
    """One line of the poll's ``squeue -r -O SQUEUE_FORMAT``: one job or array task."""

    job_id: str
    array_id: str
    index: int | None
    state_code: str
    state: TaskState
    nodes: tuple[str, ...]
    time_limit_s: float | None
    restarts: int
    priority: int
    user: str
    reason: str
    admin_comment: str

    @property
    def key(self) -> str:
        """``A_i`` for an array task, the job id otherwise (what scontrol accepts)."""
        return f"{self.array_id}_{self.index}" if self.index is not None else self.job_id

    @property
    def held(self) -> bool:
        """Priority 0: Slurm will not start it (pending) or will bring it back held (running)."""
        return self.priority == 0 or self.reason in HELD_REASONS

    @property
    def node(self) -> str | None:
        return self.nodes[0] if self.nodes else None


def parse_squeue(text: str) -> list[TaskRow]:
    """Rows of ``squeue -h -r -O SQUEUE_FORMAT``; unreadable lines are skipped and logged."""
    rows = []
    n = len(SQUEUE_FIELDS)
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = line.split("|", n - 1)
        if len(cols) != n or not cols[0].strip().isdigit():
            warn_once(f"sq:{line[:60]}", "squeue line not understood, skipped: %r", line[:200])
            continue
        jid, aid, tid, st, nl, tl, rc, prio, user, reason, comment = (c.strip() for c in cols)
        index = int(tid) if tid.isdigit() else None
        rows.append(TaskRow(
            job_id=jid, array_id=aid if aid.isdigit() else jid, index=index,
            state_code=st, state=task_state(st), nodes=_nodes(nl),
            time_limit_s=parse_duration(tl), restarts=_int(rc),
            priority=_int(prio, default=-1), user=user, reason=reason,
            admin_comment="" if comment in ("(null)", "N/A") else comment))
    return rows


# --------------------------------------------------------------------------- sinfo

@dataclass(frozen=True)
class NodeRow:
    """One line of ``sinfo -h -N -o SINFO_FORMAT``."""

    name: str
    state_code: str
    state: NodeState

    @property
    def flags(self) -> str:
        return self.state_code[len(self.state_code.rstrip(_NODE_FLAG_CHARS)):]

    @property
    def usable(self) -> bool:
        """Free for MalleTrain: idle or planned, responding, powered up, not rebooting."""
        return (self.state in (NodeState.IDLE, NodeState.PLANNED)
                and not _UNUSABLE_FLAGS.intersection(self.flags))

    @property
    def completing(self) -> bool:
        """A job is still leaving the node: neither free nor taken yet."""
        return self.state_code.lower().startswith(("completing", "comp"))


def parse_sinfo(text: str) -> dict[str, NodeRow]:
    """Node name → row; a node listed twice (two partitions) keeps its first line."""
    nodes: dict[str, NodeRow] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, code = line.strip().partition("|")
        if not sep or not name or not code or any(c in name for c in "[],"):
            warn_once(f"si:{line[:60]}", "sinfo line not understood, skipped: %r", line[:200])
            continue
        nodes.setdefault(name, NodeRow(name, code, node_state(code)))
    return nodes


# --------------------------------------------------------------------------- backfill plan

@dataclass(frozen=True)
class PlanRow:
    """A waiting job's planned start and the nodes the backfill plan holds for it."""

    job_id: str
    array_id: str
    start: float | None
    nodes: tuple[str, ...]
    partition: str
    reason: str = ""
    """Why it waits (``%r``): ``None`` before Slurm first looked at it; "" when unknown."""
    submit: float | None = None


def parse_plan(text: str) -> list[PlanRow]:
    """Rows of ``squeue -h -t PD --start -o PLAN_FORMAT`` (also the five columns before the
    reason and submit time were added: both unknown)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split("|")]
        if len(cols) != 5 and len(cols) < 7:
            warn_once(f"pl:{line[:60]}", "plan line not understood, skipped: %r", line[:200])
            continue
        jid, aid, start, sched, part = cols[:5]
        # A reason with a "|" in it (a free-text description) spans several columns.
        reason, submit = ("|".join(cols[5:-1]), parse_time(cols[-1])) if len(cols) > 5 \
            else ("", None)
        rows.append(PlanRow(jid, aid, parse_time(start), _nodes(sched), part, reason, submit))
    return rows


def hole_ends(plan: Iterable[PlanRow], exclude: Iterable[str] = ()) -> dict[str, float]:
    """Node → earliest planned start of a waiting job on it (the end of that node's hole).

    ``exclude`` names array job ids whose plans do not count (MalleTrain's own tasks).
    """
    skip = set(exclude)
    ends: dict[str, float] = {}
    for row in plan:
        if row.start is None or row.array_id in skip:
            continue
        for node in row.nodes:
            if node not in ends or row.start < ends[node]:
                ends[node] = row.start
    return ends


# --------------------------------------------------------------------------- scontrol

_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")

FREE_TEXT_KEYS = frozenset({"SubmitLine", "Comment", "AdminComment", "SystemComment",
                            "Command"})
"""Values a user writes: they may hold `` word=`` (``SubmitLine=sbatch --wrap "x y=1"``,
printed from 25.11 on), so they end only at a key Slurm prints (:data:`JOB_KEYS`)."""
JOB_KEYS = frozenset("""
    JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset HetJobIdSet JobName
    UserId GroupId MCS_label Priority Nice Account QOS WCKey JobState Reason Dependency
    Requeue Restarts BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin
    SubmitTime EligibleTime AccrueTime StartTime EndTime Deadline PreemptEligibleTime
    PreemptTime SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition AllocNode:Sid
    ReqNodeList ExcNodeList NodeList SchedNodeList BatchHost NumNodes NumCPUs NumTasks
    CPUs/Task ReqB:S:C:T TRES ReqTRES AllocTRES Socks/Node NtasksPerN:B:S:C CoreSpec
    MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode Features Reservation DelayBoot
    OverSubscribe Exclusive Contiguous Licenses LicensesAlloc Network Command SubmitLine
    WorkDir Comment AdminComment SystemComment StdErr StdIn StdOut Power TresPerNode
    TresPerTask TresPerJob TresPerSocket TresBind TresFreq CpusPerTres MemPerTres MailUser
    MailType NtasksPerTRES Container ContainerID ResvPorts BurstBuffer BurstBufferState
    CPU_IDs Mem GRES Nodes Prefer ClusterFeatures CpuFreq""".split())


def parse_scontrol_show_job(text: str) -> list[dict[str, str]]:
    """Records of ``scontrol -o show job``: one ``Key=Value ...`` line per job.

    Values may contain spaces (``Reason``, ``Command``, 25.11's ``SubmitLine``); a value runs
    to the next `` Key=``, a free-text value (:data:`FREE_TEXT_KEYS`) to the next key Slurm
    prints.
    """
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line or "=" not in line:
            continue
        marks = list(_KV.finditer(line))
        rec: dict[str, str] = {}
        i = 0
        while i < len(marks):
            m = marks[i]
            j = i + 1
            if m.group(1) in FREE_TEXT_KEYS:
                while j < len(marks) and marks[j].group(1) not in JOB_KEYS:
                    j += 1
            end = marks[j].start() if j < len(marks) else len(line)
            rec.setdefault(m.group(1), line[m.end():end].strip())
            i = j
        if rec:
            records.append(rec)
    return records


_ERR_LINE = re.compile(r"^\s*([0-9][0-9_\[\],\-]*)\s*:\s*(.+?)\s*$")


def parse_scontrol_errors(stderr: str) -> dict[str, str]:
    """Per-job failures of a batched ``scontrol hold/release/requeuehold A_[i,j]``.

    22.05 reports each job of a list on its own stderr line (``7_5: Invalid job id
    specified``; the successful ones as ``7_1: No error``), a range of tasks as ``7_5-6``;
    26.05 prints array ids in the errors of the update and requeue RPCs as job lists,
    ``7_[5-6]`` (its CHANGELOG: "Fix the formatting of array job ids returned in error
    messages"). Both forms are read (:func:`expand_task_ids`). Returns job → message for the
    failures only; a failure not tied to a job comes back under the key ``""``.
    """
    errors: dict[str, str] = {}
    for line in stderr.splitlines():
        if not line.strip():
            continue
        m = _ERR_LINE.match(line)
        if m:
            if m.group(2).lower() != "no error":
                errors[m.group(1)] = m.group(2)
        else:
            errors.setdefault("", line.strip())
    return errors


def expand_task_ids(text: str) -> list[str]:
    """``7_[0-2,5]`` → ``['7_0', '7_1', '7_2', '7_5']``; ``7_1`` and ``12`` unchanged."""
    m = re.fullmatch(r"(\d+)_\[?([0-9,\-]+)\]?", text.strip())
    if not m:
        return [text.strip()]
    out: list[str] = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return [text.strip()]
        out.extend(f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return out


def fold_tasks(keys: Iterable[str]) -> str:
    """Task keys → one scontrol job list, e.g. ``['9_0', '9_2', '10_1']`` → ``9_[0,2],10_1``.

    Consecutive indices fold into ranges (``9_[0-3]``); plain job ids pass through.
    """
    by_array: dict[str, list[int]] = {}
    plain: list[str] = []
    for key in keys:
        aid, sep, idx = key.partition("_")
        if sep and aid.isdigit() and idx.isdigit():
            by_array.setdefault(aid, []).append(int(idx))
        else:
            plain.append(key)
    parts = []
    for aid in sorted(by_array, key=int):
        idxs = sorted(set(by_array[aid]))
        if len(idxs) == 1:
            parts.append(f"{aid}_{idxs[0]}")
            continue
        ranges, start, prev = [], idxs[0], idxs[0]
        for i in idxs[1:] + [None]:  # type: ignore[list-item]
            if i is not None and i == prev + 1:
                prev = i
                continue
            ranges.append(f"{start}-{prev}" if prev > start else f"{start}")
            if i is not None:
                start = prev = i
        parts.append(f"{aid}_[{','.join(ranges)}]")
    return ",".join(parts + sorted(set(plain)))


_SDIAG_RPC = re.compile(r"^\s*(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)\s+ave_time:(\d+)\s+"
                        r"total_time:(\d+)")

SDIAG_NODE_TYPES = frozenset({
    "MESSAGE_EPILOG_COMPLETE", "REQUEST_COMPLETE_BATCH_SCRIPT", "REQUEST_COMPLETE_PROLOG",
    "MESSAGE_NODE_REGISTRATION_STATUS", "REQUEST_STEP_COMPLETE", "REQUEST_JOB_STEP_CREATE",
    "REQUEST_JOB_ALLOCATION_INFO", "REQUEST_HET_JOB_ALLOC_INFO", "REQUEST_JOB_SBCAST_CRED",
    "REQUEST_JOB_READY", "MESSAGE_COMPOSITE", "REQUEST_STATS_INFO", "REQUEST_PING",
    "REQUEST_NODE_REGISTRATION_STATUS", "REQUEST_UPDATE_NODE",
})
"""RPC types the daemon's commands never send: from slurmd/slurmstepd (root, as job starts
and ends) and ``sdiag`` itself."""


def parse_sdiag_rpcs(text: str) -> dict[str, dict[str, dict[str, int]]]:
    """``sdiag``'s RPC tables: ``{"types"|"users": {name: {"count", "time_us"}}}`` (times are
    the total microseconds slurmctld spent on them)."""
    out: dict[str, dict[str, dict[str, int]]] = {"types": {}, "users": {}}
    part: str | None = None
    for line in text.splitlines():
        if "statistics by message type" in line:
            part = "types"
        elif "statistics by user" in line:
            part = "users"
        elif line.strip() and not line.startswith((" ", "\t")):
            part = None
        elif part is not None:
            m = _SDIAG_RPC.match(line)
            if m:
                out[part][m.group(1)] = {"count": int(m.group(3)), "time_us": int(m.group(5))}
    return out


def sdiag_daemon_share(stats: Mapping[str, Mapping[str, Mapping[str, int]]],
                       user: str = "root") -> dict[str, int]:
    """``user``'s RPCs minus :data:`SDIAG_NODE_TYPES`: a root daemon's own share when
    everyone else who talks to slurmctld runs as another user."""
    mine = stats["users"].get(user, {"count": 0, "time_us": 0})
    node = [v for k, v in stats["types"].items() if k in SDIAG_NODE_TYPES]
    return {"count": max(0, mine["count"] - sum(v["count"] for v in node)),
            "time_us": max(0, mine["time_us"] - sum(v["time_us"] for v in node))}
