"""install.sh: the qmgr directives it sends (golden), idempotence, refusals."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from pbs_testlib import GOLDEN, HERE

INSTALL = HERE.parent.parent / "pbs_hooks" / "install.sh"


def install(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "QMGR": str(HERE / "fake_qmgr.py"),
           "FAKE_QMGR_STATE": str(state)}
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def directives(state: Path) -> list[str]:
    return (state / "log").read_text().splitlines() if (state / "log").exists() else []


def test_first_install_sends_the_golden_directives(tmp_path):
    proc = install(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert directives(tmp_path) == (GOLDEN / "install_qmgr.txt").read_text().splitlines()
    hook = (tmp_path / "mt_periodic.malletrain_pbs.py").read_text()
    assert hook == (HERE.parent.parent / "pbs_hooks" / "malletrain_pbs.py").read_text()
    assert json.loads((tmp_path / "mt_queuejob.malletrain.json").read_text()) == {
        "socket": "/run/malletrain/hook.sock", "entry_queue": "malletrain",
        "queue": "mt_preemptable", "max_nodes": 0, "resv_margin_s": 3600}


def test_second_install_updates_in_place(tmp_path):
    assert install(tmp_path).returncode == 0
    first = len(directives(tmp_path))
    proc = install(tmp_path, "--max-nodes", "16", "--socket", "/var/run/mt/hook.sock")
    assert proc.returncode == 0, proc.stderr
    again = directives(tmp_path)[first:]
    assert not [d for d in again if d.startswith("create")]
    assert len(again) == first - 7
    cfg = json.loads((tmp_path / "mt_jobobit.malletrain.json").read_text())
    assert (cfg["max_nodes"], cfg["socket"]) == (16, "/var/run/mt/hook.sock")


def test_uninstall_deletes_only_what_exists(tmp_path):
    assert install(tmp_path, "--uninstall").returncode == 0
    assert not [d for d in directives(tmp_path) if d.startswith("delete")]
    assert install(tmp_path).returncode == 0
    assert install(tmp_path, "--uninstall").returncode == 0
    assert [d for d in directives(tmp_path) if d.startswith("delete")] == [
        "delete hook mt_queuejob", "delete hook mt_periodic", "delete hook mt_modifyvnode",
        "delete hook mt_jobobit", "delete hook mt_postqueuejob", "delete hook mt_modifyjob",
        "delete hook mt_epilogue"]


def test_bad_options_are_refused_before_touching_pbs(tmp_path):
    for args, fragment in [(["--max-nodes", "many"], "--max-nodes must be a whole number"),
                           (["--queue", "bad queue"], "--queue must be a PBS name"),
                           (["--socket", "relative.sock"], "--socket must be an absolute path"),
                           (["--colour"], "unknown option '--colour'")]:
        proc = install(tmp_path, *args)
        assert proc.returncode == 2 and fragment in proc.stderr
        assert proc.stderr.count("\n") == 1
    assert directives(tmp_path) == []
