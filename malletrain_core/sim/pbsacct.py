"""PBS's accounting log as job runs: the server's ``server_priv/accounting/YYYYMMDD`` files.

Each line is ``MM/DD/YYYY HH:MM:SS;T;job id;attr=value attr=value …``. A run is what a job did
between its start and its end on the vnodes of its ``exec_vnode``
(``(n01:ncpus=2)+(n02:ncpus=2)``; ``exec_host``, ``n01/0*2+n02/0*2``, when exec_vnode is
missing). The records that close a run carry all of it:

* ``E`` (the job ended) and ``R`` (it was rerun: requeued, e.g. preempted) have ``start=``,
  ``end=`` and the vnodes; an ``R`` record without ``end=`` ends at the record's own time;
  ``start=0`` is the server's "not started": it clears the start time when it sends a job to
  its MOMs and sets it when they report it running, so a job requeued in between (preempted
  at once, a MOM that refused it) closes with 0; such a run takes the start of its ``S``
  record, and one without is counted as never run;
* ``S`` (started) opens a run; one no ``E``/``R`` of the same job follows was still running
  when the log was taken and holds its vnodes to the log's end;
* other records (``Q`` queued, ``D`` deleted, ``A`` aborted, reservations' ``B``/``Y``/``K``…)
  hold nothing.

A run's partition is its ``queue``; its reservation ``resvID`` (or ``resvname``) when it ran in
one. Several daily files are read in the order given (``--trace`` takes one file; concatenate
a month's with ``cat 202610* > october.acct``). The record times are in the server's local time
(read here in this machine's); ``start=`` and ``end=`` are Unix seconds, so the runs do not
depend on it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from ..errors import InputFileError
from .acctlog import AccountingLog, JobRun, Skips, Warn, _stderr

_LINE = re.compile(rb"^\d\d/\d\d/\d{4} \d\d:\d\d:\d\d;[A-Za-z];")
_ATTR = re.compile(r'([A-Za-z_][\w.]*)=("[^"]*"|\S*)')
_VNODE = re.compile(r"[(+]([^:()+]+)")
CLOSING = ("E", "R")


def looks_like_pbs(head: bytes) -> bool:
    """Whether a file's first non-empty line is a PBS accounting record."""
    for line in head.splitlines():
        if line.strip():
            return bool(_LINE.match(line.strip()))
    return False


def _attrs(text: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in _ATTR.findall(text)}


def vnodes(attrs: dict[str, str]) -> tuple[str, ...]:
    """The vnodes of a record, in order, each once: from exec_vnode, else exec_host."""
    vnode = attrs.get("exec_vnode", "")
    if vnode:
        names = [n.strip() for n in _VNODE.findall("+" + vnode)]
    else:
        names = [part.split("/", 1)[0].strip()
                 for part in attrs.get("exec_host", "").split("+")]
    return tuple(dict.fromkeys(n for n in names if n))


def gpus_of(attrs: dict[str, str]) -> int:
    """The GPUs a run asked for: ``Resource_List.ngpus``, else the ``ngpus=`` of its
    exec_vnode's chunks; 0 when neither says."""
    try:
        asked = int(attrs.get("Resource_List.ngpus", "0") or 0)
    except ValueError:
        asked = 0
    if asked > 0:
        return asked
    return sum(int(n) for n in re.findall(r"ngpus=(\d+)", attrs.get("exec_vnode", "")))


def _seconds(text: str | None) -> float | None:
    if text is None or text in ("", "0"):  # 0: not started (see the module doc)
        return None
    value = int(text)  # ValueError: reported with the record
    if not 0 < value < 2**40:
        raise ValueError(f"{text!r} is not a time in Unix seconds")
    return float(value)


def _stamp(text: str) -> float:
    return time.mktime(time.strptime(text, "%m/%d/%Y %H:%M:%S"))


def read_pbs_accounting(path: Path, warn: Warn | None = _stderr) -> AccountingLog:
    """Runs from a PBS accounting log (see the module doc)."""
    skips = Skips(str(path), warn)
    runs: list[JobRun] = []
    open_runs: dict[str, JobRun] = {}
    records = not_run = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line, text in enumerate(fh, start=1):
                text = text.strip()
                if not text:
                    continue
                parts = text.split(";", 3)
                if len(parts) < 3 or not _LINE.match(text.encode()):
                    skips.note(str(line), "not a PBS accounting record (MM/DD/YYYY "
                               "HH:MM:SS;T;job id;attributes)")
                    continue
                kind, job = parts[1], parts[2]
                try:
                    at = _stamp(parts[0])
                except (ValueError, OverflowError):
                    skips.note(str(line), f"record time {parts[0]!r} is not MM/DD/YYYY "
                               "HH:MM:SS")
                    continue
                if kind not in CLOSING and kind != "S":
                    continue
                records += 1
                attrs = _attrs(parts[3] if len(parts) > 3 else "")
                try:
                    start, end = _seconds(attrs.get("start")), _seconds(attrs.get("end"))
                except ValueError as exc:
                    skips.note(str(line), f"job {job}: start/end: {exc}")
                    continue
                nodes = vnodes(attrs)
                queue = attrs.get("queue", "")
                resv = attrs.get("resvID", attrs.get("resvname", ""))
                if kind == "S":
                    if start is None or not nodes:
                        skips.note(str(line), f"job {job}: S record without start= or "
                                   "exec_vnode=")
                        continue
                    open_runs[job] = JobRun(job, start, None, nodes, queue, resv, "RUNNING",
                                            gpus_of(attrs))
                    continue
                opened = open_runs.pop(job, None)
                if start is None and opened is not None:
                    start = opened.start
                if not nodes and opened is not None:
                    nodes = opened.nodes
                if end is None and kind == "R":
                    end = at
                if start is None or not nodes:
                    not_run += 1  # ended or requeued before it ever ran
                    continue
                if end is None:
                    skips.note(str(line), f"job {job}: {kind} record without end=")
                    continue
                if end < start:
                    skips.note(str(line), f"job {job} ends ({end:.0f}) before it starts "
                               f"({start:.0f})")
                    continue
                runs.append(JobRun(job, start, end, nodes, queue or (opened.partition if
                                   opened else ""), resv, "ENDED" if kind == "E" else "RERUN",
                                   gpus_of(attrs) or (opened.gpus if opened else 0)))
    except FileNotFoundError:
        raise InputFileError(str(path), "no such PBS accounting log") from None
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read: {exc.strerror}") from None
    runs.extend(open_runs.values())  # still running when the log was taken
    skips.close()
    return AccountingLog(str(path), "PBS accounting", runs, records, skips.count, not_run)
