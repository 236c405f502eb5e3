"""An in-place job under the real PBS server: a preempted member is left out as its launcher
goes, not when PBS's requeue ends.

One in-place job (``qsub -q malletrain -J 1-3``, ``malletrain-run --inplace``,
tests/workers/inplace_train.py over gloo) on the 3 vnodes a prod blocker leaves idle; a prod job
pinned to one of them makes PBS requeue that subjob. Its mom kills the launcher at the Rerun,
the launcher's held check-in closes, and the daemon starts the next epoch without that vnode
(in place, abandoning the step in flight) at once: the daemon logs it, and the survivors' next
epoch has world 2 and lost no step. Without that, the daemon learns of it from the ``jobobit``
hook at the end of the requeue (about a second later) or from the survivors' heartbeat, and
logs no such line. The job then grows back in place when the prod job is deleted.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.e2e_paths import TRAIN, world_epoch
from bench.e2e_pbs import ended, state_of, training_script
from bench.e2e_pbs_paths import running
from devtools.localcluster.pbs import PbsComplex
from devtools.localcluster.pbs_helpers import Daemon, job_number, start_daemon, wait_state
from devtools.runlogs.inplace_logs import change, daemon_epochs, problems, read

pytestmark = [pytest.mark.torch]

MOMS, WORKERS = 8, 3
QUIET = ("-o", "/dev/null", "-e", "/dev/null")


@pytest.fixture
def inplace_daemon(request: pytest.FixtureRequest, pbs: PbsComplex) -> Iterator[Daemon]:
    pbs.qmgr("set server acl_roots = root")  # this machine's torch: a root-only Python
    daemon = start_daemon(pbs, poll_s=2.0, in_server_ns=True,
                          extra_toml="[profiler]\nenabled = false\n")
    try:
        yield daemon
    finally:
        daemon.stop()
        pbs.qmgr("unset server acl_roots")
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(daemon.log_tail())


def test_a_preempted_member_is_left_out_as_its_launcher_goes(
        pbs: PbsComplex, inplace_daemon: Daemon) -> None:
    work = Path(tempfile.mkdtemp(prefix="inplace-", dir=pbs.root))
    work.chmod(0o777)
    blocker = pbs.qsub("-q", "prod", "-l", f"select={MOMS - WORKERS}:ncpus=2", "-l",
                       "place=scatter", *QUIET, script="sleep 100000\n")
    wait_state(pbs, blocker, "R", 60)
    array = pbs.qsub("-q", "malletrain", "-J", f"1-{WORKERS}", "-l", "select=1:ncpus=2", *QUIET,
                     "-v", f"MALLETRAIN_PROFILE=0,MALLETRAIN_DAEMON={inplace_daemon.address}",
                     script=training_script(work, TRAIN, inplace=True))
    num = job_number(array)

    def at_world(world: int, after: int) -> int:
        return world_epoch(work, num, world, after, lambda: len(running(pbs, array, WORKERS)),
                           240.0)

    full = at_world(WORKERS, -1)
    vnode = running(pbs, array, WORKERS)[-1]
    prod = pbs.qsub("-q", "prod", "-l", f"select=1:ncpus=2:vnode={vnode}", *QUIET,
                    script="sleep 100000\n")
    smaller = at_world(WORKERS - 1, full)
    wait_state(pbs, prod, "R", 60)
    pbs.run(["qdel", "-Wforce", prod])
    again = at_world(WORKERS, smaller)
    pbs.run(["qdel", "-Wforce", array, blocker])
    for job in (array, blocker):
        pbs.wait_for(f"{job} gone (still {state_of(pbs, job)})", lambda j=job: ended(pbs, j),
                     60, interval_s=0.5)

    text = inplace_daemon.log.read_text(errors="replace")
    gone = re.findall(r"node (\S+): its launcher closed its check-in \(its task ended\); "
                      rf"epoch {full} goes on without it", text)
    assert gone == [vnode], f"the daemon did not see {vnode}'s launcher go ({gone})"
    epochs = daemon_epochs(text, array)
    assert epochs.get(full + 1) == (WORKERS - 1, "inplace", True), epochs
    log = read(work, num)
    _, lost = change(log, full, smaller)
    assert lost <= 1, f"the preemption lost {lost} steps (at most the one in flight)"
    assert epochs.get(again, (0, ""))[:2] == (WORKERS, "inplace"), epochs
    assert problems(log, 8) == []
