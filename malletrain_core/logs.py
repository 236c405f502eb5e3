"""Log lines that name their job: every record about a job carries ``job=ID``.

The convention, for every module of the daemon:

* ``log.info("grow %s", nodes, extra={"job": job_id})``, or
* ``job_log(log, job_id).info("grow %s", nodes)`` for several lines about one job, or
* the older ``log.info("job %s: grow %s", job_id, nodes)``, which :class:`JobFilter` turns
  into the same record (``job`` attribute set, prefix removed from the message); a message
  that names ``job %s`` or ``task %s`` further on is tagged with that argument.

:func:`configure` installs a handler whose lines read
``2026-01-01 12:00:00,000 INFO malletrain_core.daemon.core: job=123 grow n[01-04]``, so that
``journalctl -u malletraind | grep job=123`` finds everything about job 123.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import IO, Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(jobtag)s%(message)s"
JOURNAL_FORMAT = "%(levelname)s %(name)s: %(jobtag)s%(message)s"
"""Under systemd (``$JOURNAL_STREAM`` set) the journal stamps every line itself."""
_PREFIX = "job %s"


_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?"
                   r"[diouxXeEfFgGcrsa%]")
_JOB_ARG = re.compile(r"\b(?:job|task|subjob) %[sr]")


def _job_in_message(record: logging.LogRecord) -> object | None:
    """The argument standing for ``job %s`` in a %-style message, if there is one."""
    msg, args = record.msg, record.args
    if not isinstance(msg, str) or not isinstance(args, tuple) or not args:
        return None
    match = _JOB_ARG.search(msg)
    if match is None:
        return None
    index = sum(1 for spec in _SPEC.findall(msg[:match.end() - 2]) if spec != "%%")
    return args[index] if index < len(args) else None


def _tag(record: logging.LogRecord) -> None:
    """Set ``job`` and ``jobtag`` on ``record``, moving a ``job %s:`` prefix into the tag."""
    job = getattr(record, "job", None)
    if job is None and isinstance(record.msg, str) and record.msg.startswith(_PREFIX) \
            and isinstance(record.args, tuple) and record.args:
        rest = record.msg[len(_PREFIX):]
        if rest.startswith(":") or rest.startswith(" ") or not rest:
            job = record.args[0]
            record.msg = rest.lstrip(": ").lstrip() or "-"
            record.args = record.args[1:]
    if job is None:
        job = _job_in_message(record)
    record.job = job
    record.jobtag = "" if job is None else f"job={job} "


class JobFilter(logging.Filter):
    """Gives every record ``job`` (the id, or ``None``); lets every record through.

    It never rewrites the message: records are shared by every handler (and by test
    capture), so the prefix is moved into the tag by :class:`JobFormatter`, on a copy.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job", None) is None:
            copy = logging.makeLogRecord(record.__dict__)
            _tag(copy)
            record.job = copy.job  # type: ignore[attr-defined]
        return True


class JobFormatter(logging.Formatter):
    """Formats a copy of each record with ``jobtag`` (``"job=ID "`` or ``""``); without an
    explicit ``job``, a message that starts ``job %s:`` loses that prefix to the tag, and one
    that mentions ``job %s`` (or ``task %s``) elsewhere is tagged as it is."""

    def format(self, record: logging.LogRecord) -> str:
        copy = logging.makeLogRecord(record.__dict__)
        if isinstance(copy.msg, str) and copy.msg.startswith(_PREFIX):
            copy.job = None  # re-derived from the prefix, which moves into the tag
        _tag(copy)
        return super().format(copy)


class JobAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger whose every line is about one job."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(kwargs.get("extra") or {})
        extra.setdefault("job", (self.extra or {}).get("job"))
        kwargs["extra"] = extra
        return msg, kwargs


def job_log(logger: logging.Logger, job_id: str) -> JobAdapter:
    """``logger``, with ``job=job_id`` on every line."""
    return JobAdapter(logger, {"job": job_id})


def configure(level: str | int = "info", stream: IO[str] | None = None,
              fmt: str | None = None) -> logging.Handler:
    """Log to ``stream`` (stderr: the journal under systemd) with the job tag; returns the
    handler installed on the root logger (replacing earlier handlers)."""
    if fmt is None:
        fmt = JOURNAL_FORMAT if stream is None and os.environ.get("JOURNAL_STREAM") else FORMAT
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(JobFilter())
    handler.setFormatter(JobFormatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
