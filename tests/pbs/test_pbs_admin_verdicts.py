"""admin check's PBS verdicts on hand-written server answers (the real server: tests/pbs_real)."""

from __future__ import annotations

from malletrain_core.backends.pbs.checks import (
    check_hook,
    check_preemption,
    check_queue,
    parse_qmgr_list,
    sched_setting,
)

LIST_HOOK = """Hook pbs_cgroups
    type = site
    enabled = false
    event = execjob_begin,execjob_epilogue,
\texecjob_attach,
\texechost_startup
    alarm = 90

Hook mt_periodic
    enabled = true
    event = periodic
    freq = 3
"""
GOOD_QUEUE = {"queue_type": "Execution", "enabled": "True", "started": "False",
              "max_run_soft": "[o:PBS_ALL=0]", "kill_delay": 2}


def test_qmgr_lists_join_continued_event_lists() -> None:
    hooks = parse_qmgr_list(LIST_HOOK)
    assert hooks["pbs_cgroups"]["event"] == (
        "execjob_begin,execjob_epilogue,execjob_attach,exechost_startup")
    assert hooks["mt_periodic"] == {"enabled": "true", "event": "periodic", "freq": "3"}


def test_a_started_queue_without_soft_limit_gets_two_fixes() -> None:
    assert [c.status for c in check_queue("mt_preemptable", {"mt_preemptable": GOOD_QUEUE})] \
        == ["OK"]
    bad = dict(GOOD_QUEUE, started="True", max_run_soft=None, kill_delay=30)
    checks = check_queue("mt_preemptable", {"mt_preemptable": bad})
    assert [c.status for c in checks] == ["WRONG"] * 3
    assert checks[0].fix == 'qmgr -c "set queue mt_preemptable started = false"'
    assert "kill_delay = 2" in checks[2].fix
    [missing] = check_queue("mt_preemptable", {})
    assert missing.status == "MISSING" and "create queue mt_preemptable" in missing.fix


def test_a_hook_sending_elsewhere_than_the_daemon_listens_is_wrong() -> None:
    hooks = parse_qmgr_list(LIST_HOOK)
    script = "\"\"\"MalleTrain's PBS hooks: one script\"\"\""
    ok = check_hook("mt_periodic", "periodic", hooks, script, {"socket": "/run/a.sock"},
                    "/run/a.sock")
    assert ok.status == "OK" and "freq 3 s" in ok.detail
    other = check_hook("mt_periodic", "periodic", hooks, script, {"socket": "/run/b.sock"},
                       "/run/a.sock")
    assert other.status == "WRONG" and other.fix == "pbs_hooks/install.sh --socket /run/a.sock"
    assert check_hook("mt_periodic", "periodic", hooks, "print(1)", {}, "").status == "WRONG"
    assert check_hook("pbs_cgroups", "x", hooks, script, {}, "").fix.startswith("qmgr -c")
    assert check_hook("mt_jobobit", "jobobit", hooks, None, None, "").status == "MISSING"


def test_suspension_and_no_soft_limit_preemption_are_wrong() -> None:
    checks = {c.check: c for c in check_preemption(
        {"preempt_order": "SCR", "preempt_prio": "express_queue, normal_jobs"},
        "strict_ordering: true ALL\n")}
    assert checks["preempt_order"].status == "WRONG"
    assert checks["preempt_prio"].status == "WRONG"
    assert checks["strict_ordering"].status == "OK"
    assert sched_setting("# strict_ordering: true\nstrict_ordering: false\tALL\n",
                         "strict_ordering") == "false"
