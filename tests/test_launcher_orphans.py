"""A launcher killed without warning takes its training processes with it.

``malletrain-run`` starts its training command in a session of its own, so a batch system that
kills the job's session (PBS's ``qdel -Wforce``, a SIGKILL after the grace time) ends only the
launcher. Its direct child gets SIGKILL from the kernel (PR_SET_PDEATHSIG), and every process
that holds a ``training.Session`` watches the launcher's pid and leaves once it is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from malletrain_core.worker import training

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie child of ours counts as gone once reaped
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def test_the_launchers_child_dies_with_it() -> None:
    code = ("import os, sys, time\n"
            "from malletrain_core.worker.launcher import Workers\n"
            "w = Workers([sys.executable, '-c', 'import time; time.sleep(60)'], dict(os.environ), 0)\n"
            "print(w.proc.pid, flush=True)\n"
            "time.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert launcher.stdout is not None
        child = int(launcher.stdout.readline())
        assert not gone(child, 0.3), "the child must live while its launcher does"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(5)
        assert gone(child, 5), "the training command outlived its SIGKILLed launcher"
    finally:
        launcher.kill()


def test_a_session_leaves_once_its_launcher_is_gone(tmp_path: Path) -> None:
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker_code = ("import time\n"
                   "from malletrain_core.worker.training import Session\n"
                   "Session(handle_sigterm=False)\n"
                   "print('training', flush=True)\n"
                   "time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{training.ENV_LAUNCHER_PID: str(stand_in.pid),
                                                     training.ENV_CHECKPOINT_DIR: str(tmp_path)})
    worker = subprocess.Popen([sys.executable, "-c", worker_code], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "training\n"
        time.sleep(0.3)
        assert worker.poll() is None, "the worker must train while its launcher lives"
        stand_in.kill()
        stand_in.wait(5)
        assert worker.wait(5) == 1
        assert worker.stderr is not None
        assert f"the launcher (pid {stand_in.pid}) has ended: exiting" in worker.stderr.read()
    finally:
        stand_in.kill()
        worker.kill()


def test_no_launcher_no_watch() -> None:
    assert training.watch_launcher({}) is None
    assert training.watch_launcher({training.ENV_LAUNCHER_PID: "not a pid"}) is None
    assert training._start_ticks(os.getpid()) is not None
    assert training._start_ticks(2 ** 22 + 12345) is None
