"""``malletrain admin check`` against the real PBS server: the harness's complex (the steps of
docs/pbs.md) passes; a disabled hook and a missing entry queue each fail with one line that
says how to fix it, and that fix makes the check pass again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import HOOK_FREQ_S

from devtools.localcluster.pbs import REPO, PbsComplex


def admin_check(pbs: PbsComplex, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "malletrain.toml"
    config.write_text(f'[daemon]\nbatch_system = "pbs"\nhook_socket = "{pbs.hook_socket}"\n'
                      f'[pbs]\nbin_dir = "{pbs.bin_dir}"\njob_key_file = "{pbs.job_key_file}"\n')
    return subprocess.run([sys.executable, "-m", "malletrain_core", "admin", "check",
                           "--config", str(config), *extra], capture_output=True, text=True,
                          env=pbs.env, cwd=REPO, timeout=120, check=False)


def verdicts(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    return {c["check"]: c for c in json.loads(proc.stdout)["checks"]}


def test_the_harness_complex_passes(pbs: PbsComplex, tmp_path: Path) -> None:
    proc = admin_check(pbs, tmp_path, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = verdicts(proc)
    assert json.loads(proc.stdout)["ok"] is True
    for name in ("queue mt_preemptable", "queue malletrain", "hook mt_queuejob",
                 "hook mt_periodic", "hook mt_modifyvnode", "hook mt_jobobit",
                 "hook mt_postqueuejob", "hook mt_modifyjob", "hook mt_launch", "preempt_order",
                 "preempt_prio"):
        assert got[name]["status"] == "OK", got[name]
    # PBS's default scheduler: no estimated start times, which is said, not failed.
    assert got["strict_ordering"]["status"] == "WARN"
    text = admin_check(pbs, tmp_path)
    assert text.returncode == 0 and "OK      hook mt_modifyjob" in text.stdout, text.stdout


def test_a_disabled_hook_and_a_missing_queue_fail_with_their_fix(pbs: PbsComplex,
                                                                 tmp_path: Path) -> None:
    try:
        pbs.qmgr("set hook mt_periodic enabled = false", "delete queue malletrain")
        proc = admin_check(pbs, tmp_path)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        bad = [ln for ln in proc.stdout.splitlines() if not ln.startswith(("OK", "WARN"))]
        assert bad == [
            "MISSING queue malletrain      the entry queue users submit to does not exist; "
            'fix: qmgr -c "create queue malletrain queue_type = route" (then docs/pbs.md, '
            "Install step 1)",
            'WRONG   hook mt_periodic      disabled; fix: qmgr -c "set hook mt_periodic '
            'enabled = true"'], proc.stdout
        got = verdicts(admin_check(pbs, tmp_path, "--json"))
        assert got["hook mt_periodic"]["fix"] == 'qmgr -c "set hook mt_periodic enabled = true"'
        # The fixes said, applied as said, make it pass.
        pbs.qmgr("set hook mt_periodic enabled = true")
        pbs.install_malletrain(freq_s=HOOK_FREQ_S)
        assert admin_check(pbs, tmp_path).returncode == 0
    finally:
        pbs.install_malletrain(freq_s=HOOK_FREQ_S)
        pbs.qmgr("set hook mt_periodic enabled = true")
