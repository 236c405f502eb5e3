"""Launcher authentication without munge: a per-job secret in the job's private environment.

PBS sites may not run munge. There, the site keeps one random key (``[pbs] job_key_file``,
root-only, written by ``pbs_hooks/install.sh --job-key-file``), and each job's secret is
``HMAC-SHA256(site key, array id)``: the daemon computes it when a launcher calls, and PBS's
``execjob_launch`` hook (``mt_launch``, run as root by the mom, the key in its root-only hook
config) puts it into the job's environment as ``MALLETRAIN_JOB_SECRET`` just before the job
starts. Nothing is stored on the server, so ``qstat -f`` shows it to nobody; a process's
environment is readable only by its own user and root (``/proc/<pid>/environ``).

* :class:`JobSecretAuth` (the launcher) makes one credential per connection,
  ``MTJS1:<job>:<unix time>:<nonce>:<HMAC(secret, job|time|nonce|payload)>``, and unwraps the
  report key the daemon sends back. It offers the two calls of :class:`~.munge.Munge` the
  launcher uses (``encode``, ``decode``), so it stands in for it.
* :class:`JobSecretVerifier` (the daemon) checks a credential (the job known, the time within
  the TTL, the nonce never seen, the MAC) and answers the job owner's uid; it wraps the job's
  report key for that job alone.

Holding a job's secret proves "a process of this job (or root)", which is what a launcher needs
to be: it acts for the job's owner, for that job's check-ins. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigError, MalleTrainError
from .munge import Credential

ENV_SECRET = "MALLETRAIN_JOB_SECRET"
SCHEME = "job-secret"
PREFIX = "MTJS1"
WRAP_PREFIX = "MTJSK1:"
_LABEL = b"malletrain job secret\0"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class JobSecretError(MalleTrainError):
    """A job-secret credential that cannot be made or is refused; one line."""


def array_id(job: str) -> str:
    """``5[2].server`` -> ``5[].server``: a subjob's secret is its array's."""
    return re.sub(r"\[\d+\]", "[]", job, count=1)


def derive(site_key: bytes, job: str) -> str:
    """The job's secret (64 hex digits)."""
    return hmac.new(site_key, _LABEL + array_id(job).encode(), hashlib.sha256).hexdigest()


def read_key_file(path: str | Path) -> bytes:
    """The site key: at least 32 bytes as hex, in a file only its owner (root or the daemon's
    user) may read."""
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"pbs.job_key_file {p}: {exc.strerror}; create it with "
                          "pbs_hooks/install.sh --job-key-file") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"pbs.job_key_file {p} is readable by others (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); chmod 600 {p}")
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError(f"pbs.job_key_file {p} is owned by uid {st.st_uid}; chown it to root")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise ConfigError(f"pbs.job_key_file {p} must hold at least 32 bytes as hex; rewrite "
                          "it with pbs_hooks/install.sh --job-key-file")
    return key


def _mac(secret_hex: str, text: str) -> str:
    return hmac.new(bytes.fromhex(secret_hex), text.encode(), hashlib.sha256).hexdigest()


def _stream(secret_hex: str, label: bytes, nonce: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret_hex), label + nonce, hashlib.sha256).digest()


def wrap(secret_hex: str, key_hex: str) -> str:
    """The report key (64 hex digits), readable only with the job's secret."""
    nonce = secrets.token_bytes(16)
    body = bytes(a ^ b for a, b in zip(bytes.fromhex(key_hex), _stream(secret_hex, b"wrap",
                                                                        nonce), strict=True))
    tag = _stream(secret_hex, b"tag", nonce + body)[:16]
    return WRAP_PREFIX + (nonce + body + tag).hex()


def unwrap(secret_hex: str, wrapped: str) -> str:
    try:
        raw = bytes.fromhex(wrapped.removeprefix(WRAP_PREFIX))
    except ValueError:
        raw = b""
    if not wrapped.startswith(WRAP_PREFIX) or len(raw) != 64:
        raise JobSecretError("the daemon sent a malformed wrapped key (is it set up for job "
                             "secrets? see docs/pbs.md)")
    nonce, body, tag = raw[:16], raw[16:48], raw[48:]
    if not hmac.compare_digest(tag, _stream(secret_hex, b"tag", nonce + body)[:16]):
        raise JobSecretError("the report key was not wrapped with this job's secret")
    return bytes(a ^ b for a, b in zip(body, _stream(secret_hex, b"wrap", nonce),
                                       strict=True)).hex()


class JobSecretAuth:
    """The launcher's side; stands in for :class:`~.munge.Munge` (``encode``/``decode``)."""

    scheme = SCHEME

    def __init__(self, job: str, secret_hex: str) -> None:
        secret_hex = secret_hex.strip().lower()
        if not _HEX64.match(secret_hex):
            raise JobSecretError(f"{ENV_SECRET} is not 64 hex digits; it is set by PBS's "
                                 "mt_launch hook: run malletrain-run inside the job")
        self.job = array_id(job)
        self.secret = secret_hex

    def encode(self, payload: str = "", restrict_uid: int | None = None,
               ttl_s: int | None = None) -> str:
        t, nonce = int(time.time()), secrets.token_hex(16)
        return f"{PREFIX}:{self.job}:{t}:{nonce}:" + _mac(self.secret,
                                                          f"{self.job}|{t}|{nonce}|{payload}")

    def decode(self, wrapped: str) -> Credential:
        """The report key the daemon wrapped for this job."""
        return Credential(uid=os.getuid(), gid=os.getgid(),
                          payload=unwrap(self.secret, wrapped), ttl_s=0, encode_host="")


class JobSecretVerifier:
    """The daemon's side. ``owner_of(array id)`` is the job's owner uid, None if unknown."""

    def __init__(self, site_key: bytes, owner_of: Callable[[str], int | None],
                 ttl_s: int = 300, clock: Callable[[], float] = time.time) -> None:
        self.site_key = site_key
        self.owner_of = owner_of
        self.ttl_s = ttl_s
        self.clock = clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def decode(self, credential: str, payload: str) -> Credential:
        """Check a credential made for ``payload``; returns the job owner's uid in it."""
        parts = credential.split(":")
        if len(parts) != 5 or parts[0] != PREFIX:
            raise JobSecretError("malformed job-secret credential")
        job, t_text, nonce, mac = parts[1:]
        try:
            t = int(t_text)
        except ValueError:
            raise JobSecretError("malformed job-secret credential") from None
        expect = _mac(derive(self.site_key, job), f"{job}|{t}|{nonce}|{payload}")
        if not hmac.compare_digest(mac, expect):
            raise JobSecretError(f"wrong secret for job {job}: only that job's own processes "
                                 f"hold it ({ENV_SECRET}, set by PBS's mt_launch hook)")
        now = self.clock()
        if abs(now - t) > self.ttl_s:
            raise JobSecretError(f"job-secret credential expired or from the future ({now - t:+.0f}"
                                 " s); check clock sync")
        with self._lock:
            self._seen = {n: at for n, at in self._seen.items() if now - at <= 2 * self.ttl_s}
            if nonce in self._seen:
                raise JobSecretError("job-secret credential replayed")
            self._seen[nonce] = now
        owner = self.owner_of(job)
        if owner is None:
            raise JobSecretError(f"job {job} is not known to the daemon")
        return Credential(uid=owner, gid=-1, payload=payload, ttl_s=self.ttl_s,
                          encode_host="")

    def wrap(self, key_hex: str, job: str) -> str:
        return wrap(derive(self.site_key, job), key_hex)
