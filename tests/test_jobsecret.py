"""Launcher authentication without munge (jobsecret.py): credentials, the key wrap, the key
file, and the daemon's TCP API taking a job secret instead of a munge credential."""

from __future__ import annotations

import pytest

from malletrain_core.daemon.api import Dispatcher, TcpApiServer
from malletrain_core.errors import ConfigError
from malletrain_core.jobsecret import (
    JobSecretAuth,
    JobSecretError,
    JobSecretVerifier,
    array_id,
    derive,
    read_key_file,
)
from malletrain_core.munge import Munge
from malletrain_core.wire.api import AUTH_PAYLOAD, ApiError
from malletrain_core.worker.client import TcpClient

KEY = bytes(range(32))
JOB = "7[].pbsserver"
OWNER = 1234


def verifier(**kw) -> JobSecretVerifier:
    return JobSecretVerifier(KEY, lambda job: OWNER if job == JOB else None, **kw)


def test_a_subjob_holds_its_arrays_secret_and_jobs_differ() -> None:
    assert array_id("7[3].pbsserver") == JOB and array_id(JOB) == JOB
    assert derive(KEY, "7[3].pbsserver") == derive(KEY, JOB)
    assert derive(KEY, JOB) != derive(KEY, "8[].pbsserver")
    assert derive(KEY, JOB) != derive(bytes(32), JOB)


def test_the_right_secret_is_accepted_as_the_jobs_owner() -> None:
    cred = JobSecretAuth("7[2].pbsserver", derive(KEY, JOB)).encode(AUTH_PAYLOAD)
    assert verifier().decode(cred, AUTH_PAYLOAD).uid == OWNER


@pytest.mark.parametrize("secret, fragment", [
    (derive(KEY, "8[].pbsserver"), "wrong secret for job 7[].pbsserver"),
    (derive(bytes(32), JOB), "wrong secret for job 7[].pbsserver"),
])
def test_a_wrong_secret_is_refused_in_one_line(secret: str, fragment: str) -> None:
    cred = JobSecretAuth(JOB, secret).encode(AUTH_PAYLOAD)
    with pytest.raises(JobSecretError, match=fragment.replace("[", r"\[").replace("]", r"\]")) \
            as err:
        verifier().decode(cred, AUTH_PAYLOAD)
    assert "\n" not in str(err.value)


def test_replayed_expired_unknown_and_malformed_credentials_are_refused() -> None:
    v = verifier(ttl_s=60, clock=lambda: 1e9)
    auth = JobSecretAuth(JOB, derive(KEY, JOB))
    head, _t, nonce, _mac = auth.encode(AUTH_PAYLOAD).rsplit(":", 3)
    from malletrain_core.jobsecret import _mac as mac  # noqa: PLC0415 - a forged clock
    fresh = f"{head}:{int(1e9)}:{nonce}:" + mac(auth.secret, f"{JOB}|{int(1e9)}|{nonce}|"
                                                           f"{AUTH_PAYLOAD}")
    assert v.decode(fresh, AUTH_PAYLOAD).uid == OWNER
    with pytest.raises(JobSecretError, match="replayed"):
        v.decode(fresh, AUTH_PAYLOAD)
    with pytest.raises(JobSecretError, match="expired"):
        v.decode(auth.encode(AUTH_PAYLOAD), AUTH_PAYLOAD)  # made now, checked at 1e9
    other = JobSecretAuth("9[].pbsserver", derive(KEY, "9[].pbsserver"))
    with pytest.raises(JobSecretError, match="not known to the daemon"):
        verifier().decode(other.encode(AUTH_PAYLOAD), AUTH_PAYLOAD)
    with pytest.raises(JobSecretError, match="malformed"):
        verifier().decode("MUNGE:abc", AUTH_PAYLOAD)
    with pytest.raises(JobSecretError, match="not 64 hex digits"):
        JobSecretAuth(JOB, "short")


def test_the_report_key_is_readable_with_the_jobs_secret_only() -> None:
    key_hex = "ab" * 32
    wrapped = verifier().wrap(key_hex, JOB)
    assert key_hex not in wrapped
    assert JobSecretAuth(JOB, derive(KEY, JOB)).decode(wrapped).payload == key_hex
    with pytest.raises(JobSecretError, match="not wrapped with this job's secret"):
        JobSecretAuth(JOB, derive(KEY, "8[].pbsserver")).decode(wrapped)


def test_the_key_file_must_be_private_and_long_enough(tmp_path) -> None:
    path = tmp_path / "job.key"
    path.write_text(KEY.hex() + "\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_key_file(path)
    path.chmod(0o600)
    assert read_key_file(path) == KEY
    path.write_text("abcd")
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        read_key_file(path)
    with pytest.raises(ConfigError, match="install.sh --job-key-file"):
        read_key_file(tmp_path / "none")


@pytest.fixture
def server():
    d = Dispatcher()
    d.register("whoami", lambda uid, args: uid)
    srv = TcpApiServer(("127.0.0.1", 0), d, Munge(socket="/nonexistent/munge.sock"),
                       idle_timeout_s=5, job_secret=verifier())
    srv.start()
    yield srv
    srv.close()


def test_the_tcp_api_takes_a_job_secret_and_refuses_a_wrong_one(server) -> None:
    right = TcpClient("127.0.0.1", server.port, JobSecretAuth(JOB, derive(KEY, JOB)))
    assert right.call("whoami") == OWNER and right.uid == OWNER
    right.close()
    wrong = TcpClient("127.0.0.1", server.port, JobSecretAuth(JOB, derive(bytes(32), JOB)))
    with pytest.raises(ApiError, match=r"refused our credential: wrong secret for job") as err:
        wrong.call("whoami")
    assert "\n" not in str(err.value)


def test_a_daemon_without_a_job_key_refuses_job_secrets() -> None:
    srv = TcpApiServer(("127.0.0.1", 0), Dispatcher(), Munge(socket="/nonexistent/m.sock"),
                       idle_timeout_s=5)
    srv.start()
    try:
        client = TcpClient("127.0.0.1", srv.port, JobSecretAuth(JOB, derive(KEY, JOB)))
        with pytest.raises(ApiError, match="takes munge credentials only"):
            client.call("status")
    finally:
        srv.close()
