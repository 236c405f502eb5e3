"""malletraind on the real PBS server with its poll set to 600 s: only the hooks' datagrams
can make it act. With the periodic hook disabled a submitted elastic job stays queued; with it
enabled the daemon starts the job's workers within a few seconds."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HOOK_FREQ_S
from pbs_real_helpers import subjob, submit

from malletrain_core.localcluster.daemon import free_port
from malletrain_core.localcluster.pbs import PbsComplex


@pytest.fixture
def daemon(pbs: PbsComplex) -> Iterator[Path]:
    """malletraind with the PBS backend, polling every 600 s; yields its log path."""
    root = pbs.root / "malletraind"
    root.mkdir(exist_ok=True)
    config = root / "malletrain.toml"
    config.write_text(
        "[daemon]\nbatch_system = \"pbs\"\n"
        f"state_dir = \"{root / 'state'}\"\nhook_socket = \"{pbs.hook_socket}\"\n"
        f"api_socket = \"{root / 'api.sock'}\"\napi_host = \"127.0.0.1\"\n"
        f"api_port = {free_port()}\nadvertise_host = \"127.0.0.1\"\n"
        "poll_interval_s = 600.0\nmetrics_port = 0\nlog_level = \"info\"\n"
        f"[pbs]\nbin_dir = \"{pbs.bin_dir}\"\n")
    log = root / "daemon.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "malletrain_core.daemon", "--config",
                                 str(config)], env=pbs.env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        pbs.wait_for("malletraind started", lambda: "started: pbs backend" in log.read_text(),
                     20)
        time.sleep(1)  # its first poll is done: from now on only datagrams wake it
        yield log
    finally:
        proc.terminate()
        proc.wait(10)
        pbs.qmgr("set hook mt_periodic enabled = true")


def running(pbs: PbsComplex, array: str, size: int) -> int:
    states = pbs.jobs(*(subjob(array, i) for i in range(1, size + 1)))
    return sum(1 for v in states.values() if v.get("job_state") == "R")


def test_the_periodic_hook_alone_wakes_a_daemon_that_polls_every_600_s(
        pbs: PbsComplex, test_user: str, daemon: Path) -> None:
    pbs.qmgr("set hook mt_periodic enabled = false")
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
