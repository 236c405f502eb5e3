"""A simulated PBS at the subprocess boundary, for the backend contract suite.

:class:`PbsSim` answers ``pbsnodes -a -F json`` and ``qstat -f [-t] -F json <queue>`` from an
in-memory state with the keys OpenPBS prints (tests/pbs/golden/ is loaded into it and rendered
back by tests/test_backend_contract.py), and changes that state on ``qrun -a -H``, ``qrerun``
and ``qdel`` as PBS does for the subjobs of an array in a stopped queue.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

from malletrain_core.backends.pbs import parse as pp
from malletrain_core.backends.pbs.backend import PbsBackend
from malletrain_core.runner import CommandRunner

QUEUE, SERVER = "mt_preemptable", "pbs-server"
SUBSTATES = {"Q": 10, "R": 42, "X": 92}
"""The substate OpenPBS shows a subjob in each state the simulation sets; it requeues a subjob
at once, without the requeue's own substates (60-63) in between."""
HEAD = {"timestamp": 1763717400, "pbs_version": "23.06.06", "pbs_server": SERVER}


@dataclass
class Vnode:
    state: str = "free"
    jobs: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)  # anything else pbsnodes printed


@dataclass
class Job:
    """An array (``N[].server``) or a subjob (``N[i].server``) as qstat -f shows it."""

    state: str
    owner: str
    name: str = "train"
    queue: str = QUEUE
    array: bool = False
    indices: str = ""
    env: dict[str, Any] = field(default_factory=dict)
    array_id: str = ""
    index: int | None = None
    vnode: str = ""
    run_count: int = 0
    exit_status: int | None = None
    substate: int | None = None

    def render(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"Job_Name": self.name, "Job_Owner": f"{self.owner}@login1",
                               "job_state": self.state, "queue": self.queue, "server": SERVER,
                               "euser": self.owner}
        if self.array:
            doc.update(Variable_List=self.env, array="True",
                       array_indices_submitted=self.indices)
        if self.vnode:
            doc["exec_vnode"] = f"({self.vnode}:ncpus=64)"
        if self.array_id:
            doc.update(array_id=self.array_id, array_index=self.index, run_count=self.run_count)
        if self.exit_status is not None:
            doc["Exit_status"] = self.exit_status
        if self.substate is not None:
            doc["substate"] = self.substate
        return doc


class PbsSim(CommandRunner):
    """One PBS server: vnodes, the stopped queue ``mt_preemptable`` and its job arrays; a World
    of the contract suite (tests/backend_contract.py)."""

    name = "pbs"

    def __init__(self) -> None:
        super().__init__()
        self.vnodes: dict[str, Vnode] = {}
        self.jobs: dict[str, Job] = {}
        self.next_id = 123
        self.calls: list[list[str]] = []

    @classmethod
    def from_capture(cls, qstat: str, pbsnodes: str) -> PbsSim:
        """The state captured qstat/pbsnodes documents show."""
        sim = cls()
        for name, attrs in json.loads(pbsnodes)["nodes"].items():
            rest = {k: v for k, v in attrs.items() if k not in ("state", "jobs")}
            sim.vnodes[name] = Vnode(attrs["state"], list(attrs.get("jobs", [])), rest)
        for jid, a in json.loads(qstat).get("Jobs", {}).items():
            node = pp.vnode_names(a.get("exec_vnode"))
            sim.jobs[jid] = Job(
                a["job_state"], a["euser"], a["Job_Name"], a["queue"], a.get("array") == "True",
                a.get("array_indices_submitted", ""), dict(a.get("Variable_List", {})),
                a.get("array_id", ""), a.get("array_index"), node[0] if node else "",
                a.get("run_count", 0), a.get("Exit_status"), a.get("substate"))
        return sim

    # ------------------------------------------------------------------ rendering
    def qstat(self, subjobs: bool | None = None) -> str:
        """``qstat -f -F json QUEUE``: the arrays; with ``-t`` (``subjobs``) their subjobs but,
        as OpenPBS 23.06 prints it given a queue, not the arrays. None: both (captures)."""
        jobs = {j: job.render() for j, job in self.jobs.items() if job.queue == QUEUE
                and (subjobs is None or ("[]" not in j) == subjobs)}
        return json.dumps({**HEAD, "Jobs": jobs} if jobs else HEAD, indent="\t")

    def pbsnodes(self) -> str:
        nodes = {}
        for name, v in sorted(self.vnodes.items()):
            doc = {"Mom": f"{name}.cluster", "state": v.state, **v.attrs}
            doc.setdefault("resources_available", {"host": name, "vnode": name})
            if v.jobs:
                doc["jobs"] = list(v.jobs)
            nodes[name] = doc
        return json.dumps({**HEAD, "nodes": nodes}, indent="\t")

    # ------------------------------------------------------------------ the world
    def submit(self, min_nodes: int, max_nodes: int, owner: str) -> str:
        """``qsub -q malletrain -J 0-(HI-1)``, routed by the queuejob hook to the stopped queue."""
        aid = f"{self.next_id}[].{SERVER}"
        self.next_id += 1
        env = {"MALLETRAIN_MIN_NODES": min_nodes, "MALLETRAIN_MAX_NODES": max_nodes}
        self.jobs[aid] = Job("Q", owner, array=True, indices=f"0-{max_nodes - 1}", env=env)
        for i in range(max_nodes):
            self.jobs[aid.replace("[]", f"[{i}]")] = Job("Q", owner, array_id=aid, index=i)
        return aid

    def _place(self, sid: str, node: str) -> None:
        job = self.jobs[sid]
        job.state, job.vnode, job.run_count = "R", node, job.run_count + 1
        job.substate = SUBSTATES["R"]
        self.vnodes[node] = Vnode("job-exclusive", [sid], self.vnodes[node].attrs)
        self.jobs[job.array_id].state = "B"

    def _unplace(self, sid: str, state: str) -> None:
        job = self.jobs[sid]
        vnode = self.vnodes.get(job.vnode)
        if vnode is not None and sid in vnode.jobs:
            vnode.jobs.remove(sid)
            vnode.state = "job-exclusive" if vnode.jobs else "free"
        job.state, job.substate = state, SUBSTATES.get(state)
        if state == "Q":
            job.vnode = ""

    def take(self, node: str) -> None:
        """A preempting job starts on ``node``: a subjob there is requeued."""
        for sid, job in self.jobs.items():
            if job.state == "R" and job.vnode == node:
                self._unplace(sid, "Q")
        self.vnodes[node] = Vnode("job-exclusive", [f"{self.next_id}.{SERVER}"],
                                  self.vnodes[node].attrs)
        self.next_id += 1

    def free(self, node: str) -> None:
        attrs = self.vnodes[node].attrs if node in self.vnodes else {}
        self.vnodes[node] = Vnode("free", [], attrs)

    add_node = free

    def running(self, aid: str) -> set[str]:
        return {j.vnode for j in self.jobs.values() if j.array_id == aid and j.state == "R"}

    def backend(self) -> PbsBackend:
        return PbsBackend(self, queue=QUEUE)

    def complete(self, aid: str) -> None:
        """Training done: the running subjobs exit 0 (finished subjobs show as X)."""
        for sid, job in self.jobs.items():
            if job.array_id == aid and job.state == "R":
                self._unplace(sid, "X")
                job.exit_status = 0

    def cancel(self, aid: str) -> None:
        """``qdel`` by the owner."""
        self.delete(aid)

    def delete(self, aid: str) -> bool:
        """``qdel`` of an array: its running subjobs are killed, the array leaves qstat."""
        if aid not in self.jobs:
            return False
        for sid in [s for s, j in self.jobs.items() if j.array_id == aid]:
            if self.jobs[sid].state == "R":
                self._unplace(sid, "X")
            del self.jobs[sid]
        del self.jobs[aid]
        return True

    # ------------------------------------------------------------------ commands
    def _spawn(self, argv: list[str], timeout_s: float,
               input: str | None) -> subprocess.CompletedProcess[str]:  # noqa: A002
        self.calls.append(list(argv))
        out, err = "", ""
        if argv == ["pbsnodes", "-a", "-F", "json"]:
            out = self.pbsnodes()
        elif argv == ["qstat", "-f", "-t", "-F", "json", QUEUE]:
            out = self.qstat(subjobs=True)
        elif argv == ["qstat", "-f", "-F", "json", QUEUE]:
            out = self.qstat(subjobs=False)
        elif argv[:3] == ["qrun", "-a", "-H"]:
            node, sid = argv[3].strip("()"), argv[4]
            job = self.jobs.get(sid)
            if job is None or job.state != "Q":
                err = f"qrun: Request invalid for state of job {sid}\n"
            elif node not in self.vnodes or self.vnodes[node].state != "free":
                err = f"qrun: Node(s) specified are not available {sid}\n"
            else:
                self._place(sid, node)
        elif argv[0] == "qrerun":
            job = self.jobs.get(argv[1])
            if job is None or job.state != "R":
                err = f"qrerun: Request invalid for state of job {argv[1]}\n"
            else:
                self._unplace(argv[1], "Q")
        elif argv[0] == "qdel":
            if not self.delete(argv[1]):
                err = f"qdel: Unknown Job Id {argv[1]}\n"
        else:
            raise FileNotFoundError(argv[0])
        return subprocess.CompletedProcess(argv, 1 if err else 0, out, err)
