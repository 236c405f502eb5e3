"""Helpers shared by the real-PBS tests: submitting as the test user, waiting for states."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from malletrain_core.localcluster.pbs import REPO, PbsComplex

SLEEP = "sleep 600\n"
QUIET = ("-o", "/dev/null", "-e", "/dev/null")


def submit(cx: PbsComplex, user: str, *args: str, script: str = SLEEP) -> str:
    """``qsub`` as ``user`` (output discarded unless ``-o`` is given); returns the job id."""
    extra = () if "-o" in args else QUIET
    return cx.qsub(*args, *extra, user=user, script=script)


def job(cx: PbsComplex, job_id: str) -> dict[str, object]:
    """One job's (or subjob's) attributes, history included; {} when PBS has no record."""
    return cx.jobs(job_id).get(job_id, {})


def state(cx: PbsComplex, job_id: str) -> str:
    return str(job(cx, job_id).get("job_state", ""))


def wait_state(cx: PbsComplex, job_id: str, want: str, timeout_s: float = 30.0) -> float:
    """Wait until ``job_id`` is in state ``want`` (``R``, ``Q``, ``F``...); seconds waited."""
    return cx.wait_for(f"{job_id} in state {want}", lambda: state(cx, job_id) == want,
                       timeout_s, interval_s=0.1)


def subjob(array_id: str, index: int) -> str:
    """``12[].pbsserver`` -> ``12[3].pbsserver``."""
    return array_id.replace("[]", f"[{index}]")


def server_log(cx: PbsComplex) -> str:
    """The server's log (every day's file), for what hooks wrote."""
    logs = sorted((cx.home() / "server_logs").glob("*"))
    return "".join(p.read_text(errors="replace") for p in logs)


def fill(cx: PbsComplex, user: str, queue: str = "mt_preemptable") -> str:
    """An array with one subjob started (``qrun -H``) on every node; returns the array id."""
    array = submit(cx, user, "-q", "malletrain" if queue == "mt_preemptable" else queue,
                   "-J", f"1-{cx.moms}", "-l", "select=1:ncpus=2")
    for i, node in enumerate(cx.node_names, 1):
        cx.run(["qrun", "-H", f"({node})", subjob(array, i)])
    for i in range(1, cx.moms + 1):
        wait_state(cx, subjob(array, i), "R")
    return array


def now() -> float:
    return time.monotonic()


def complex_root() -> Path:
    """A fresh directory for one complex: under the checkout's ignored ``.cluster/`` (PBS
    refuses a PBS_HOME below a directory others may write, such as /tmp)."""
    base = REPO / ".cluster"
    base.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pbs-test-", dir=base))
    root.chmod(0o755)
    return root
