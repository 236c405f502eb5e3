"""Munge credentials through a private munged: round trip, restriction, refusals."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time

import pytest

from malletrain_core.munge import Munge, MungeError, PrivateMunged
from malletrain_core.runner import CommandRunner

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge not installed")


def nobody_uid() -> int | None:
    """The uid of ``nobody`` when we are root and can act as it; else None."""
    if os.getuid() != 0 or shutil.which("runuser") is None:
        return None
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None


@pytest.fixture(scope="module")
def munged():
    with tempfile.TemporaryDirectory(prefix="mt-munge-") as d, PrivateMunged(d) as m:
        yield m


def test_round_trip_gives_our_uid_and_payload(munged):
    m = munged.client()
    cred = m.encode("hello world", ttl_s=60)
    assert cred.startswith("MUNGE:")
    got = m.decode(cred)
    assert (got.uid, got.gid, got.payload) == (os.getuid(), os.getgid(), "hello world")
    assert got.ttl_s == 60


def test_replayed_credential_is_refused(munged):
    m = munged.client()
    cred = m.encode("x")
    m.decode(cred)
    with pytest.raises(MungeError, match="replayed"):
        m.decode(cred)


def test_credential_from_another_key_is_refused(munged):
    with tempfile.TemporaryDirectory(prefix="mt-munge-") as d:
        other = PrivateMunged(d).start()
        foreign = other.client().encode("x")
        other.stop()  # wait: munged writes its seed file as it exits, into the folder
    with pytest.raises(MungeError, match="refused"):
        munged.client().decode(foreign)


@pytest.mark.parametrize("garbage", ["MUNGE:AAAA:", "not a credential", "MUNGE:" + "Z" * 200])
def test_garbled_credentials_are_refused_in_one_line(munged, garbage):
    with pytest.raises(MungeError) as err:
        munged.client().decode(garbage)
    assert "\n" not in str(err.value) and "refused" in str(err.value)


@pytest.mark.parametrize("bad", ["", "MUNGE:a\nb", "M" * 9000])
def test_malformed_input_never_reaches_unmunge(bad):
    class Boom(CommandRunner):
        def _spawn(self, argv, timeout_s, input):
            raise AssertionError("unmunge must not run")

    with pytest.raises(MungeError, match="malformed"):
        Munge("/nonexistent", runner=Boom()).decode(bad)


def test_expired_credential_is_refused(munged):
    m = munged.client()
    cred = m.encode("x", ttl_s=1)
    time.sleep(2.2)
    with pytest.raises(MungeError, match="expired"):
        m.decode(cred)


def test_missing_munged_says_how_to_fix_it(tmp_path):
    with pytest.raises(MungeError, match="munged"):
        Munge(str(tmp_path / "no.socket")).encode("x")


def test_restricted_credential_decodes_only_for_its_user(munged):
    uid = nobody_uid()
    if uid is None:
        pytest.skip("needs root, runuser and a 'nobody' user")
    m = munged.client()
    with pytest.raises(MungeError, match="another user"):
        m.decode(m.encode("secret", restrict_uid=uid))
    cred = m.encode("secret", restrict_uid=uid)
    out = subprocess.run(["runuser", "-u", "nobody", "--", "unmunge", "-S", munged.socket],
                         input=cred, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("\n\nsecret")
