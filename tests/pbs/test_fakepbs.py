"""The fake ``pbs`` module itself: its contract must hold, or the hook tests prove nothing."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from pbs_testlib import FAKE, FIXTURES


@pytest.fixture
def fake() -> Iterator[ModuleType]:
    sys.path.insert(0, str(FAKE))
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "pbs" or
             k.startswith("pbs.")}
    try:
        yield importlib.import_module("pbs")
    finally:
        for k in [k for k in sys.modules if k == "pbs" or k.startswith("pbs.")]:
            del sys.modules[k]
        sys.modules.update(saved)
        sys.path.remove(str(FAKE))


def test_constants_are_pbs_values(fake):
    assert (fake.QUEUEJOB, fake.MODIFYJOB, fake.MOVEJOB, fake.RUNJOB) == (0x1, 0x2, 0x8, 0x10)
    assert (fake.PERIODIC, fake.MODIFYVNODE, fake.JOBOBIT) == (0x8000, 0x400000, 0x800000)
    assert (fake.EXECJOB_BEGIN, fake.EXECJOB_END, fake.EXECJOB_PRETERM) == (0x40, 0x200, 0x400)
    assert fake.ND_FREE == 0
    assert (fake.ND_OFFLINE, fake.ND_DOWN, fake.ND_JOBBUSY, fake.ND_JOB_EXCLUSIVE) == \
        (0x1, 0x2, 0x10, 0x40)
    assert (fake.ND_BUSY, fake.ND_RESV_EXCLUSIVE, fake.ND_STATE_MAINTENANCE, fake.ND_SLEEP) == \
        (0x80, 0x2000, 0x20000, 0x40000)
    assert (fake.LOG_DEBUG, fake.LOG_WARNING, fake.LOG_ERROR) == (5, 6, 7)
    assert fake.MOM_EVENTS & fake.PERIODIC == 0 and fake.MOM_EVENTS & fake.EXECJOB_BEGIN


def test_asking_an_event_for_a_parameter_it_lacks(fake):
    e = fake._Event(fake.PERIODIC, {"vnode_list": {}})
    assert e.vnode_list == {} and e.resv_list is None
    with pytest.raises(fake.EventIncompatibleError):
        e.job  # noqa: B018
    # It is an AttributeError, so getattr() with a default works as in PBS.
    assert getattr(e, "job", "none") == "none"
    with pytest.raises(fake.EventIncompatibleError):
        fake._Event(fake.QUEUEJOB, {"vnode_list": {}})


def test_accept_and_reject_raise_system_exit(fake):
    e = fake._Event(fake.QUEUEJOB, {"job": fake.job(None)})
    with pytest.raises(SystemExit) as ok:
        e.accept()
    assert ok.value.code == "0" and e._accepted
    with pytest.raises(SystemExit) as no:
        e.reject("too big")
    assert no.value.code == "255" and not e._accepted and e._reject_msg == "too big"
    # A broad `except Exception` cannot swallow it.
    with pytest.raises(SystemExit):
        try:
            e.accept()
        except Exception:  # noqa: BLE001
            pass


def test_unknown_attributes_and_resources_are_refused(fake):
    job = fake.job("1.svr")
    with pytest.raises(fake.UnsetAttributeNameError):
        job.Queue = "x"
    with pytest.raises(fake.UnsetResourceNameError):
        job.Resource_List["bogus"] = 1
    assert job.Resource_List["ncpus"] is None and job.Rerunable is None
    vnode = fake.vnode("n1")
    with pytest.raises(fake.UnsetAttributeNameError):
        vnode.status = "free"
    e = fake._Event(fake.MODIFYVNODE, {"vnode": vnode, "vnode_o": None})
    with pytest.raises(fake.BadAttributeValueError):
        e.vnode = vnode
    with pytest.raises(fake.UnsetAttributeNameError):
        e.colour = "red"


def test_duration_and_env_types(fake):
    assert int(fake.duration("01:02:03")) == 3723 and str(fake.duration(90)) == "00:01:30"
    assert fake.server().queue("q1") == "q1" and str(fake.server().queue("q1")) == "q1"


def run_fake(tmp_path: Path, fixture_text: str, script_text: str) -> tuple[int, str, str, str]:
    fixture, script = tmp_path / "in.txt", tmp_path / "hook.py"
    fixture.write_text(fixture_text)
    script.write_text(script_text)
    proc = subprocess.run(
        [sys.executable, "-m", "pbs", "--hook", "-i", str(fixture), "-L", str(tmp_path),
         "-l", "log", str(script)], capture_output=True, text=True, timeout=30, check=False,
        env={"PYTHONPATH": str(FAKE), "PYTHONDONTWRITEBYTECODE": "1"})
    log = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
    return proc.returncode, proc.stdout, proc.stderr, log


QJ = "pbs.event().type=queuejob\npbs.event().hook_name=t\npbs.event().alarm=1\n" \
     "pbs.event().job.queue=workq\n"


def test_runner_rejects_on_an_escaping_exception(tmp_path):
    rc, out, _, log = run_fake(tmp_path, QJ, "import pbs\nraise ValueError('boom')\n")
    assert rc == 0 and "pbs.event().accept=False" in out
    assert "encountered an exception, request rejected" in log and "boom" in log


def test_runner_accepts_a_script_that_just_ends(tmp_path):
    rc, out, _, _ = run_fake(tmp_path, QJ, "import pbs\npbs.event().job.Job_Name = 'x'\n")
    assert rc == 0 and "pbs.event().accept=True" in out and "job.Job_Name=x" in out


def test_runner_delivers_the_alarm_as_keyboard_interrupt(tmp_path):
    script = ("import pbs, time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n"
              "    pbs.logmsg(pbs.LOG_ERROR, 'got the alarm')\n    raise\n")
    rc, out, _, log = run_fake(tmp_path, QJ, script)
    assert rc == 0 and "pbs.event().accept=False" in out
    assert "got the alarm" in log and "alarm call while running queuejob hook 't'" in log


def test_runner_reads_triple_quoted_values_and_ignores_lines_without_equals(tmp_path):
    text = QJ + "this line has no equals sign and is skipped\n" \
                'pbs.event().job.comment="""two\nlines"""\n'
    script = "import pbs\nassert pbs.event().job.comment == 'two\\nlines'\n"
    rc, out, _, log = run_fake(tmp_path, text, script)
    assert rc == 0 and "accept=True" in out, log


@pytest.mark.parametrize("line, error", [
    ("pbs.event().colour=red", "unknown event attribute 'colour'"),
    ("pbs.event().jobs.id=1", "unknown object 'pbs.event().jobs'"),
    ("pbs.event().job.Queue=workq", "job attribute 'Queue' not found"),
    ('pbs.event().vnode_list["n1"].state=half-free', "unknown vnode state"),
])
def test_runner_refuses_bad_fixture_lines(tmp_path, line, error):
    rc, _, err, _ = run_fake(tmp_path, QJ + line + "\n", "import pbs\n")
    assert rc == 2 and error in err


def test_runner_refuses_parameters_the_event_lacks(tmp_path):
    text = "pbs.event().type=queuejob\npbs.event().vnode.state=free\n"
    rc, _, err, _ = run_fake(tmp_path, text, "import pbs\n")
    assert rc == 2 and "no parameter" in err


def test_every_fixture_is_readable(fake):
    from pbs import _hookinput
    for path in sorted(FIXTURES.glob("*.in")):
        event, fields = _hookinput.build_event(_hookinput.read_lines(path.read_text()))
        assert event.type in fake.EVENT_NAMES.values(), path.name
        assert int(fields["alarm"]) > 0, path.name
