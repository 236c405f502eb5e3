"""Launchers without munge (no munged runs in the complex): each job's secret arrives in its
processes' environment through mt_launch (execjob_launch, on the moms), and malletraind, in the
server's network namespace, takes it instead of a munge credential. Inside a real subjob started
by the daemon on a mom: the right secret is accepted as the job's owner, a wrong one and none
(munge absent) are refused with one line; another user cannot read the secret from the
process, and qstat shows it to nobody."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localcluster.pbs import REPO, PbsComplex
from devtools.localcluster.pbs_helpers import Daemon, start_daemon, submit
from malletrain_core.jobsecret import ENV_SECRET, derive, read_key_file

OTHER_USER = "mtuser2"
PROBE = '''
import json, os, sys, time
from malletrain_core.jobsecret import ENV_SECRET, JobSecretAuth
from malletrain_core.munge import Munge
from malletrain_core.worker.client import TcpClient
out = sys.argv[1]
host, port = os.environ["MALLETRAIN_DAEMON"].rsplit(":", 1)
job = os.environ["PBS_ARRAY_ID"]
def attempt(auth):
    client = TcpClient(host, int(port), auth, timeout_s=10)
    try:
        client.connect()
        return {"ok": True, "uid": client.uid}
    except Exception as exc:
        return {"ok": False, "error": str(exc)}
    finally:
        client.close()
res = {"has_secret": ENV_SECRET in os.environ, "uid": os.getuid(), "pid": os.getpid(),
       "right": attempt(JobSecretAuth(job, os.environ.get(ENV_SECRET, "0" * 64))),
       "wrong": attempt(JobSecretAuth(job, "5" * 64)),
       "absent": attempt(Munge(socket=os.path.join(out, "no-munged.sock")))}
name = os.path.join(out, "probe-" + os.environ["PBS_ARRAY_INDEX"] + ".json")
with open(name + ".tmp", "w") as fh:
    json.dump(res, fh)
os.rename(name + ".tmp", name)
time.sleep(120)
'''


@pytest.fixture
def other_user() -> str:
    if subprocess.run(["id", OTHER_USER], capture_output=True, check=False).returncode != 0:
        proc = subprocess.run(["useradd", "-m", OTHER_USER], capture_output=True, text=True,
                              check=False)
        if proc.returncode not in (0, 9):
            pytest.fail(f"cannot create user {OTHER_USER}: {proc.stderr.strip()}")
    return OTHER_USER


@pytest.fixture
def ns_daemon(pbs: PbsComplex) -> Iterator[Daemon]:
    daemon = start_daemon(pbs, poll_s=2.0, in_server_ns=True)
    try:
        yield daemon
    finally:
        daemon.stop()


def test_launchers_authenticate_by_their_jobs_secret(pbs: PbsComplex, test_user: str,
                                                      other_user: str,
                                                      ns_daemon: Daemon) -> None:
    out = Path(tempfile.mkdtemp(prefix="jobsecret-", dir=pbs.root))
    out.chmod(0o777)
    (out / "probe.py").write_text(PROBE)
    script = (f"cd {REPO} && PYTHONPATH={REPO} /usr/bin/python3 {out}/probe.py {out}\n")
    # -J 1-1 is refused by qsub: the smallest array has two workers; one answer is enough.
    array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-2", "-l", "select=1:ncpus=1",
                   "-v", f"MALLETRAIN_PROFILE=0,MALLETRAIN_DAEMON={ns_daemon.address}",
                   script=script)
    pbs.wait_for("the probe's answers", lambda: any(out.glob("probe-*.json")), 60)
    res = json.loads(next(out.glob("probe-*.json")).read_text())
    owner = int(subprocess.run(["id", "-u", test_user], capture_output=True, text=True,
                               check=True).stdout)
    print(f"job-secret probe in {array}: {res}")
    assert res["has_secret"] is True
    assert res["right"] == {"ok": True, "uid": owner}, ns_daemon.log.read_text()
    for case, fragment in (("wrong", f"wrong secret for job {array}"),
                           ("absent", "munge")):
        assert res[case]["ok"] is False, res
        assert fragment in res[case]["error"] and "\n" not in res[case]["error"], res[case]
    # The secret in the job's processes is the one the daemon derives from the site key.
    environ = Path(f"/proc/{res['pid']}/environ").read_bytes().split(b"\0")
    secret = derive(read_key_file(pbs.job_key_file), array)
    assert f"{ENV_SECRET}={secret}".encode() in environ
    # Another user cannot read it from the process...
    peek = subprocess.run(["runuser", "-u", other_user, "--", "cat",
                           f"/proc/{res['pid']}/environ"], capture_output=True, text=True,
                          check=False)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek.stderr
    assert secret not in peek.stdout
    # ...nor from PBS: the server never holds it, so qstat -f shows it to nobody, not even root.
    for user in (None, test_user, other_user):
        shown = pbs.run(["qstat", "-f", "-t", "-x", array], user=user, check=False)
        assert secret not in shown.stdout + shown.stderr and ENV_SECRET not in shown.stdout
    pbs.run(["qdel", array])
