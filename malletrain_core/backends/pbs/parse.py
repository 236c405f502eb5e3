"""Reading PBS's own output: ``pbsnodes -a -F json`` and ``qstat -f -t -F json``, and what a
record says on its own (a subjob being requeued, a vnode taken, an array's request as the
queuejob hook set it).

Both are parsed defensively. OpenPBS has printed JSON that ``json.loads`` refuses: backslashes
before characters JSON does not escape (``\\'``, ``\\,`` from job environments), numbers with
leading zeros (``"foo":005`` for an environment value of 005) and raw control characters.
Those are repaired; anything still unreadable, or of the wrong shape, raises
:class:`~malletrain_core.errors.CommandError` naming the command and the place, never a bare
traceback. One odd node or job entry is skipped with a warning instead of failing the poll.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import CommandError
from ...events import JobRequest
from ..states import NodeState, TaskState, translate

log = logging.getLogger(__name__)

PBS_NODE_STATES: dict[str, NodeState] = {
    "free": NodeState.IDLE,
    "job-busy": NodeState.BUSY, "job-exclusive": NodeState.BUSY, "job-sharing": NodeState.BUSY,
    "resv-exclusive": NodeState.BUSY, "busy": NodeState.BUSY,
    "offline": NodeState.DOWN, "offline_by_mom": NodeState.DOWN, "down": NodeState.DOWN,
    "stale": NodeState.DOWN, "state-unknown": NodeState.DOWN, "unresolvable": NodeState.DOWN,
    "provisioning": NodeState.DOWN, "wait-provisioning": NodeState.DOWN,
    "maintenance": NodeState.DOWN, "sleep": NodeState.DOWN, "initializing": NodeState.DOWN,
}
"""One pbsnodes state word → node state; a node with several words takes the worst."""

PBS_JOB_STATES: dict[str, TaskState] = {
    "Q": TaskState.PENDING, "W": TaskState.PENDING, "T": TaskState.PENDING,
    "H": TaskState.HELD,
    "R": TaskState.RUNNING, "B": TaskState.RUNNING, "S": TaskState.RUNNING,
    "U": TaskState.RUNNING,
    "E": TaskState.ENDING,
    "X": TaskState.DONE, "F": TaskState.DONE, "M": TaskState.DONE,
}
"""qstat ``job_state`` letter → task state (B: an array with a started subjob; X: a finished
subjob; F: a finished job, shown with ``-x``; M: moved to another server)."""

_RANK = {NodeState.DOWN: 3, NodeState.UNKNOWN: 2, NodeState.BUSY: 1, NodeState.IDLE: 0}
_BAD_ESCAPE = re.compile(r'\\(["\\/bfnrtu])|\\')
_LEADING_ZERO = re.compile(r'(:\s*)(-?0\d+(?:\.\d+)?)(\s*[,}\]\n])')


ACTIVE = (TaskState.RUNNING, TaskState.ENDING)
"""The states of a subjob that holds its vnode."""
RERUN_SUBSTATES = frozenset((60, 61, 62, 63))
"""The substates of a job PBS is requeuing (``JOB_SUBSTATE_RERUN`` to ``RERUN3``: its output
kept, staged out, its files and its record on the mom deleted), after a preemption by requeue,
a ``qrerun`` or a node fault. Its processes are gone, but qstat still shows it ``E`` (or ``R``)
for about a second (0.9 s on the local complex) before ``Q``."""
MIN_VAR, MAX_VAR = "MALLETRAIN_MIN_NODES", "MALLETRAIN_MAX_NODES"
MODEL_VAR, PROFILE_VAR = "MALLETRAIN_MODEL", "MALLETRAIN_PROFILE"
TRAINER_VAR = "MALLETRAIN_TRAINER"


def pbs_node_state(words: Sequence[str]) -> NodeState:
    """The node state for pbsnodes' words (``["down", "offline"]`` → DOWN)."""
    table: dict[str, Any] = dict(PBS_NODE_STATES)
    states = [NodeState(translate(table, w, "pbs node", NodeState.UNKNOWN).value)
              for w in words if w]
    if not states:
        return NodeState.UNKNOWN
    return max(states, key=lambda s: _RANK.get(s, 2))


def pbs_task_state(code: str) -> TaskState:
    """The task state for a qstat ``job_state`` letter."""
    table: dict[str, Any] = dict(PBS_JOB_STATES)
    return translate(table, code, "pbs job", TaskState.UNKNOWN)  # type: ignore[return-value]


def _fail(argv: Sequence[str], text: str, why: str) -> CommandError:
    return CommandError(list(argv), 0, text[:2000], "",
                        reason=f"unreadable output: {why}; run it by hand to see what PBS printed")


def load_json(text: str, argv: Sequence[str]) -> dict[str, Any]:
    """A PBS ``-F json`` document, repaired where PBS is known to print broken JSON."""
    if not text.strip():
        raise _fail(argv, text, "empty output where a JSON document was expected")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as first:
        fixed = _BAD_ESCAPE.sub(lambda m: m.group(0) if m.group(1) else "", text)
        fixed = _LEADING_ZERO.sub(r'\1"\2"\3', fixed)
        try:
            doc = json.loads(fixed, strict=False)
        except json.JSONDecodeError:
            raise _fail(argv, text, f"not JSON ({first.msg} at line {first.lineno} column "
                        f"{first.colno})") from None
        log.warning("%s: repaired malformed JSON from PBS (%s at line %d)",
                    " ".join(argv[:2]), first.msg, first.lineno)
    if not isinstance(doc, dict):
        raise _fail(argv, text, f"a JSON object expected, got {type(doc).__name__}")
    return doc


def _section(doc: Mapping[str, Any], key: str, argv: Sequence[str], text: str) -> dict[str, Any]:
    section = doc.get(key, {})
    if not isinstance(section, dict):
        raise _fail(argv, text, f"{key!r} is a {type(section).__name__}, not an object")
    return section


def vnode_names(spec: object) -> tuple[str, ...]:
    """Vnode names in an exec_vnode string ``(n1:ncpus=4)+(n2:ncpus=4+n3:mem=1gb)``."""
    names: list[str] = []
    for chunk in str(spec or "").replace("(", "").replace(")", "").split("+"):
        name = chunk.split(":", 1)[0].strip()
        if name and name not in names:
            names.append(name)
    return tuple(names)


def array_size(spec: str) -> int:
    """Indices in an ``-J`` range ``X-Y[:Z]``; 0 when it is not one."""
    m = re.fullmatch(r"\s*(\d+)-(\d+)(?::(\d+))?\s*", spec or "")
    if not m:
        return 0
    lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
    return len(range(lo, hi + 1, step)) if step > 0 and hi >= lo else 0


def _int(value: object, default: int | None = None) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class PbsNode:
    """One vnode as pbsnodes shows it."""

    name: str
    words: tuple[str, ...]
    state: NodeState
    jobs: tuple[str, ...] = ()
    resv: str = ""
    queue: str = ""
    resources: Mapping[str, Any] = field(default_factory=dict)

    def usable(self, queue: str) -> bool:
        """Free in PBS's sense (no state bit), no job, no reservation, not another queue's."""
        return (self.words == ("free",) and not self.jobs and not self.resv
                and self.queue in ("", queue))


def parse_pbsnodes(text: str, argv: Sequence[str] = ("pbsnodes",)) -> dict[str, PbsNode]:
    """``pbsnodes -a -F json`` → vnode name → :class:`PbsNode`."""
    nodes = _section(load_json(text, argv), "nodes", argv, text)
    out: dict[str, PbsNode] = {}
    for name, attrs in nodes.items():
        if not isinstance(attrs, dict) or not isinstance(attrs.get("state"), str):
            log.warning("pbsnodes: vnode %r has no readable state: skipped", name)
            continue
        words = tuple(w.strip().lower() for w in attrs["state"].split(",") if w.strip())
        jobs = attrs.get("jobs") or ()
        if isinstance(jobs, str):
            jobs = jobs.split(",")
        # 23.06's JSON lists bare ids, its text form "<id>/<cpu slot>": either is read.
        jobs = [str(j).split("/", 1)[0].strip() for j in jobs]
        resources = attrs.get("resources_available")
        out[str(name)] = PbsNode(
            str(name), words, pbs_node_state(words), tuple(dict.fromkeys(j for j in jobs if j)),
            str(attrs.get("resv") or ""), str(attrs.get("queue") or ""),
            resources if isinstance(resources, dict) else {})
    return out


@dataclass(frozen=True)
class PbsJob:
    """One job, array or subjob as ``qstat -f -t -F json`` shows it."""

    id: str
    code: str
    state: TaskState
    queue: str
    owner: str
    name: str = ""
    is_array: bool = False
    array_id: str | None = None
    index: int | None = None
    indices: str = ""
    nodes: tuple[str, ...] = ()
    run_count: int = 0
    exit_status: int | None = None
    substate: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def node(self) -> str | None:
        return self.nodes[0] if self.nodes else None

    @property
    def requeuing(self) -> bool:
        """Shown active, but PBS is requeuing it (:data:`RERUN_SUBSTATES`)."""
        return self.state in ACTIVE and self.substate in RERUN_SUBSTATES


_SUBJOB = re.compile(r"^(\d+)\[(\d+)\](.*)$")


def parse_qstat(text: str, argv: Sequence[str] = ("qstat",)) -> dict[str, PbsJob]:
    """``qstat -f [-t] -F json`` → job id → :class:`PbsJob` (no ``Jobs`` key: no jobs)."""
    jobs = _section(load_json(text, argv), "Jobs", argv, text)
    out: dict[str, PbsJob] = {}
    for jid, attrs in jobs.items():
        if not isinstance(attrs, dict) or not isinstance(attrs.get("job_state"), str):
            log.warning("qstat: job %r has no readable job_state: skipped", jid)
            continue
        jid = str(jid)
        env = attrs.get("Variable_List")
        owner = str(attrs.get("euser") or str(attrs.get("Job_Owner") or "").split("@", 1)[0])
        sub = _SUBJOB.match(jid)
        array_id = attrs.get("array_id") or (f"{sub.group(1)}[]{sub.group(3)}" if sub else None)
        out[jid] = PbsJob(
            id=jid, code=attrs["job_state"].strip(), state=pbs_task_state(attrs["job_state"]),
            queue=str(attrs.get("queue") or ""), owner=owner, name=str(attrs.get("Job_Name", "")),
            is_array=str(attrs.get("array", "")).lower() == "true" and sub is None,
            array_id=str(array_id) if array_id and sub else None,
            index=_int(attrs.get("array_index"), int(sub.group(2)) if sub else None),
            indices=str(attrs.get("array_indices_submitted") or ""),
            nodes=vnode_names(attrs.get("exec_vnode")),
            run_count=_int(attrs.get("run_count"), 0) or 0,
            exit_status=_int(attrs.get("Exit_status")),
            substate=_int(attrs.get("substate")),
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {})
    return out


def job_number(job_id: str) -> tuple[int, str]:
    """A sort key: the job's number, then its id."""
    head = job_id.split("[", 1)[0].split(".", 1)[0]
    return (int(head) if head.isdigit() else 0, job_id)


def job_request(array: PbsJob, subjobs: Sequence[PbsJob]) -> JobRequest | None:
    """The engine's request for an array, from the variables the queuejob hook set."""
    max_nodes = array_size(array.indices) or len(subjobs)
    declared = _int(array.env.get(MAX_VAR))
    if declared is not None and 0 < declared < max_nodes:
        max_nodes = declared
    min_nodes = _int(array.env.get(MIN_VAR), 1)
    if max_nodes < 1 or min_nodes is None or not 1 <= min_nodes <= max_nodes:
        log.warning("job %s ignored: %s=%s with %d subjobs; the queuejob hook normally refuses "
                    "this", array.id, MIN_VAR, array.env.get(MIN_VAR), max_nodes)
        return None
    profile = array.env.get(PROFILE_VAR, "1").strip().lower() not in ("0", "no", "false")
    return JobRequest(array.id, min_nodes=min_nodes, max_nodes=max_nodes, owner=array.owner,
                      model=array.env.get(MODEL_VAR, ""), profile=profile,
                      trainer=array.env.get(TRAINER_VAR, ""))


def taken(vnode: PbsNode | None, ours: Collection[str], queue: str) -> str:
    """Why a worker may not be started on ``vnode`` now ("" when it may): gone, down,
    reserved, tied to another queue than ``queue``, or running a job that is not one of
    ``ours`` (our subjobs). A worker of ours still leaving it (a shrink just sent) does not
    count: PBS starts the new one once it is gone."""
    if vnode is None:
        return "gone"
    others = [j for j in vnode.jobs if j not in ours]
    if others:
        return f"jobs {','.join(others)}"
    if vnode.state is NodeState.DOWN or vnode.resv or vnode.queue not in ("", queue):
        return f"state {','.join(vnode.words)}" + (f", reservation {vnode.resv}"
                                                   if vnode.resv else "")
    return ""
