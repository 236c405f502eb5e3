"""malletraind on the real PBS server with its poll set to 600 s: only the hooks' datagrams
can make it act. With the periodic hook disabled a submitted elastic job stays queued; with it
enabled the daemon starts the job's workers within a few seconds. Then each hint hook alone (the
other three disabled) makes the daemon act within 5 s: postqueuejob (a new job is grown),
modifyvnode (a node freed by a regular job is grown onto), jobobit (a worker that finished
ends its job)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from conftest import HOOK_FREQ_S

from devtools.localcluster.pbs import PbsComplex
from devtools.localcluster.pbs_helpers import now, start_daemon, state, subjob, submit, wait_state


@pytest.fixture
def daemon(pbs: PbsComplex) -> Iterator[Path]:
    """malletraind with the PBS backend, polling every 600 s; yields its log path."""
    started = start_daemon(pbs, poll_s=600.0)
    try:
        yield started.log
    finally:
        started.stop()
        pbs.qmgr(*(f"set hook {h} enabled = true" for h in HINT_HOOKS))


HINT_HOOKS = ("mt_periodic", "mt_modifyvnode", "mt_jobobit", "mt_postqueuejob")
ACT_WITHIN_S = 5.0


def only_hook(pbs: PbsComplex, hook: str | None) -> None:
    """Disable every hint hook but ``hook`` (the fixture enables them all again)."""
    pbs.qmgr(*(f"set hook {h} enabled = {'true' if h == hook else 'false'}"
               for h in HINT_HOOKS))


def running(pbs: PbsComplex, array: str, size: int) -> int:
    states = pbs.jobs(*(subjob(array, i) for i in range(1, size + 1)))
    return sum(1 for v in states.values() if v.get("job_state") == "R")


def test_the_periodic_hook_alone_wakes_a_daemon_that_polls_every_600_s(
        pbs: PbsComplex, test_user: str, daemon: Path) -> None:
    only_hook(pbs, None)
    # A periodic run already under way when the hook was disabled still sends its datagram,
    # which wakes the daemon: let it land before the job exists (it failed once without).
    time.sleep(HOOK_FREQ_S + 1)
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2",
                   "-v", "MALLETRAIN_PROFILE=0")
    time.sleep(2 * HOOK_FREQ_S + 2)
    assert running(pbs, array, 2) == 0, daemon.read_text()  # nothing told the daemon
    t0 = time.monotonic()
    pbs.qmgr("set hook mt_periodic enabled = true")
    waited = pbs.wait_for("a worker started by malletraind", lambda: running(pbs, array, 2) > 0,
                          HOOK_FREQ_S + 5)
    print(f"periodic hook re-enabled: first worker running {time.monotonic() - t0:.2f} s "
          f"later (freq {HOOK_FREQ_S} s, daemon poll 600 s)")
    assert waited <= HOOK_FREQ_S + 5
    assert f"job={array} grow" in daemon.read_text()


def test_the_postqueuejob_hook_alone_has_a_new_job_grown(pbs: PbsComplex, test_user: str,
                                                         daemon: Path) -> None:
    only_hook(pbs, "mt_postqueuejob")
    t0 = now()
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2",
                   "-v", "MALLETRAIN_PROFILE=0")
    waited = pbs.wait_for("a worker started", lambda: running(pbs, array, 2) > 0, 10)
    print(f"postqueuejob alone: first worker running {now() - t0:.2f} s after qsub")
    assert now() - t0 <= ACT_WITHIN_S and waited <= ACT_WITHIN_S, daemon.read_text()


def test_the_modifyvnode_hook_alone_grows_onto_a_node_a_regular_job_left(
        pbs: PbsComplex, test_user: str, daemon: Path) -> None:
    only_hook(pbs, "mt_modifyvnode")
    prod = [submit(pbs, test_user, "-q", "prod", "-l", "select=1:ncpus=2")
            for _ in range(pbs.moms)]
    for jid in prod:
        wait_state(pbs, jid, "R", 60)
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2",
                   "-v", "MALLETRAIN_PROFILE=0")
    time.sleep(1)
    node = str(pbs.jobs(prod[0])[prod[0]]["exec_host"]).split("/", 1)[0]
    pbs.run(["qdel", prod[0]])
    free_after = pbs.wait_for(f"{node} free", lambda: pbs.nodes()[node].get("state") == "free",
                              30, interval_s=0.05)
    t_free = now()
    pbs.wait_for("a worker started", lambda: running(pbs, array, 2) > 0, 10)
    acted = now() - t_free
    print(f"modifyvnode alone: {node} free {free_after:.2f} s after the regular job's qdel, "
          f"a worker running there {acted:.2f} s later")
    assert acted <= ACT_WITHIN_S, daemon.read_text()
    assert running(pbs, array, 2) == 1  # the one node that came free


def logged_at(log: Path, text: str) -> float:
    """The unix time of the daemon's first log line containing ``text``."""
    line = next(ln for ln in log.read_text().splitlines() if text in ln)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_the_jobobit_hook_alone_ends_a_job_whose_worker_finished(
        pbs: PbsComplex, test_user: str, daemon: Path) -> None:
    only_hook(pbs, "mt_postqueuejob")  # to have the workers started
    out = Path(tempfile.mkdtemp(prefix="jobobit-", dir=pbs.root))
    out.chmod(0o777)
    script = (f'if [ "$PBS_ARRAY_INDEX" = 1 ]; then sleep 4; date +%s.%N > {out}/done; '
              'exit 0; fi\nsleep 600\n')
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=2",
                   "-v", "MALLETRAIN_PROFILE=0", script=script)
    pbs.wait_for("both workers running", lambda: running(pbs, array, 2) == 2, 10)
    only_hook(pbs, "mt_jobobit")
    wait_state(pbs, subjob(array, 1), "X", 30)
    pbs.wait_for("malletraind's finish", lambda: f"job={array} finish" in daemon.read_text(),
                 10)
    # From the worker's exit to the daemon's qdel of the array: the mom's report (its poll),
    # the jobobit hook, the daemon's poll and decision.
    acted = logged_at(daemon, f"job={array} finish") - float((out / "done").read_text())
    print(f"jobobit alone: malletraind ended the job (qdel) {acted:.2f} s after its first "
          "worker exited 0")
    assert 0 < acted <= ACT_WITHIN_S, daemon.read_text()
    other = subjob(array, 2)
    pbs.wait_for("PBS ended the other worker", lambda: state(pbs, other) != "R", 30)
