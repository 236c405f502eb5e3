"""The live PBS server's own accounting log as a trace: prod jobs pinned to known moms, one of
them preempting a job of the preemptable queue (its ``R`` record), then the server's
``server_priv/accounting/YYYYMMDD`` read by :mod:`malletrain_core.sim.accounting`."""

from __future__ import annotations

import time
from pathlib import Path

from devtools.localcluster.pbs import PbsComplex
from devtools.localcluster.pbs_helpers import submit, wait_state
from devtools.waiting import wait_until
from malletrain_core.sim.accounting import (
    AccountingFilter,
    load_accounting_trace,
    read_accounting,
    runs_to_trace,
)


def started(log_path: Path, job_id: str, timeout_s: float) -> None:
    wait_until(f"the S record of {job_id} in {log_path}", lambda: log_path.exists()
               and f";S;{job_id};" in log_path.read_text(errors="replace"), timeout_s)


def test_the_servers_accounting_gives_each_vnode_its_own_jobs(pbs: PbsComplex,
                                                              test_user: str) -> None:
    day = time.strftime("%Y%m%d")
    low = submit(pbs, test_user, "-q", "preemptable", "-l", "select=1:ncpus=2:host=n03",
                 script="sleep 600\n")
    wait_state(pbs, low, "R", 60)
    log_path = pbs.root / "server" / "server_priv" / "accounting" / day
    # State R comes when the server sends the job; its start (the S record) only when the MOM
    # reports it running. Preempted before that, the R record says start=0: never ran.
    started(log_path, low, 60)
    one = submit(pbs, test_user, "-q", "prod", "-l", "select=1:ncpus=2:host=n01",
                 script="sleep 2\n")
    wide = submit(pbs, test_user, "-q", "prod", "-l", "select=1:ncpus=2:host=n02+1:ncpus=2:"
                  "host=n03", "-l", "place=scatter", script="sleep 2\n")
    for job_id in (one, wide):
        wait_state(pbs, job_id, "F", 120)
    said: list[str] = []
    log = read_accounting(log_path, said.append)
    assert said == [] and log.kind == "PBS accounting"
    runs = {r.job: r for r in log.runs}
    assert runs[one].nodes == ("n01",) and runs[one].partition == "prod"
    assert runs[wide].nodes == ("n02", "n03") and runs[wide].end > runs[wide].start
    preempted = [r for r in log.runs if r.job == low and r.state == "RERUN"]
    assert preempted and preempted[-1].nodes == ("n03",)
    assert preempted[-1].end <= runs[wide].start + 1  # requeued to make room for it
    trace = load_accounting_trace(log_path, AccountingFilter.of(partitions=["prod"]),
                                  warn=None)
    assert {"n01", "n02", "n03"} <= set(trace.node_names)
    assert low not in {r.job for r in log.runs if AccountingFilter.of(
        partitions=["prod"]).keeps(r)}
    ours = runs_to_trace("t", [runs[one], runs[wide]])
    busy = (runs[one].end - runs[one].start) + 2 * (runs[wide].end - runs[wide].start)
    assert ours.idle_node_seconds() == 3 * (ours.end - ours.start) - busy
