"""The local OpenPBS complex itself: separate moms on their own addresses, jobs as a user,
preemption by ``prod`` through requeue, and start/stop that leave nothing behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localcluster.pbs import SUBNET, PbsComplex
from devtools.localcluster.pbs_helpers import complex_root, job, state, subjob, submit, wait_state


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user (the job's owner, PBS's datastore user) can reach."""
    path = Path(tempfile.mkdtemp(prefix="mt-pbs-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_eight_nodes_are_separate_moms_with_their_own_addresses(pbs: PbsComplex) -> None:
    nodes = pbs.nodes()
    assert sorted(nodes) == pbs.node_names
    assert all(v["state"] == "free" for v in nodes.values())
    moms = {}
    for node, ns in pbs.mom_ns.items():
        comms = [Path(f"/proc/{p}/comm").read_text().strip() for p in pbs.ns_pids(ns)]
        assert comms.count("pbs_mom") == 1, (node, comms)
        addr = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "eth0"],
                              capture_output=True, text=True, check=True).stdout
        moms[node] = addr.split()[3].split("/")[0]
    assert len(set(moms.values())) == pbs.moms
    assert moms == {n: pbs.addr[n] for n in pbs.node_names}
    # None of the complex's addresses is on the host's own interfaces.
    host = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                          check=True).stdout
    assert f" {SUBNET}." not in host


def test_a_job_spans_four_moms_as_the_user(pbs: PbsComplex, test_user: str,
                                           shared_dir: Path) -> None:
    out = shared_dir
    # A job's PATH is the mom's (/bin:/usr/bin): PBS's own commands by their full path.
    script = (f"echo USER $(id -un)\nsort -u $PBS_NODEFILE | sed 's/^/HOST /'\n"
              f"{pbs.exec_dir}/bin/pbsdsh -- /bin/sh -c 'ip -4 -o addr show eth0'\n")
    j = submit(pbs, test_user, "-l", "select=4:ncpus=1", "-l", "place=scatter",
               "-o", str(out / "job.out"), "-j", "oe", script=script)
    wait_state(pbs, j, "F", 60)
    attrs = job(pbs, j)
    text = (out / "job.out").read_text()
    assert attrs["Exit_status"] == 0, (attrs, text)
    words = [ln.split(None, 1) for ln in text.splitlines() if ln.strip()]
    assert ["USER", test_user] in words, text
    hosts = [w[1] for w in words if w[0] == "HOST"]
    # pbsdsh's tasks write to the job's output directly: "2: eth0    inet 198.18.0.11/24 ..."
    addrs = [ln.split(" inet ", 1)[1].split("/")[0] for ln in text.splitlines()
             if " inet " in ln]
    assert len(hosts) == 4 and set(hosts) <= set(pbs.node_names), text
    # pbsdsh ran one task on each mom: each saw its own namespace's address.
    assert sorted(addrs) == sorted(pbs.addr[h] for h in hosts), text


def test_prod_preempts_by_requeue(pbs: PbsComplex, test_user: str) -> None:
    """Every node busy with preemptable jobs; a prod job of 2 nodes starts, and the jobs it
    preempted are back in their queue, queued (not held), having run once."""
    plain = [submit(pbs, test_user, "-l", "select=1:ncpus=2") for _ in range(4)]
    array = submit(pbs, test_user, "-J", "1-4", "-l", "select=1:ncpus=2")
    for j in (*plain, *(subjob(array, i) for i in range(1, 5))):
        wait_state(pbs, j, "R")
    prod = submit(pbs, test_user, "-q", "prod", "-l", "select=2:ncpus=2")
    waited = wait_state(pbs, prod, "R", 60)
    print(f"prod started {waited:.2f} s after qsub (requeue preemption)")
    back = [j for j in (*plain, *(subjob(array, i) for i in range(1, 5))) if state(pbs, j) == "Q"]
    assert len(back) == 2, back
    for j in back:
        attrs = job(pbs, j)
        assert attrs["queue"] == "preemptable"
        if "[" not in j:  # a plain job keeps its record: run once, not held
            assert attrs["run_count"] == 1 and attrs["Hold_Types"] == "n", attrs


def test_start_is_idempotent_and_stop_leaves_nothing(pbs_session: PbsComplex) -> None:
    """A second, small complex beside the session's: start twice, stop twice."""
    root = complex_root()
    cx = PbsComplex(moms=1, root=root)
    try:
        assert not cx.start().already_running
        assert cx.start().already_running
        assert cx.is_running() and pbs_session.is_running()
        assert json.loads((root / "complex.json").read_text())["prefix"] == cx.prefix
    finally:
        cx.stop()
        shutil.rmtree(root, ignore_errors=True)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert cx.prefix not in listed
    assert not any(Path("/etc/netns", ns).exists() for ns in cx.namespaces)
    assert cx.stop() >= 0 and not cx.is_running()
    assert pbs_session.is_running()  # the other complex is untouched
