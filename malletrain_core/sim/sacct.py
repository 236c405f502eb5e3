"""Slurm's accounting as job runs: ``sacct --json`` and ``sacct -P`` output.

What to run on the site (``-D``: every run of a requeued or preempted job, not only its last;
``-X``: allocations, not steps; ``-a``: every user)::

    sacct -a -X -D -S 2026-10-01 -E 2026-11-01 --json > sacct.json
    sacct -a -X -D -S 2026-10-01 -E 2026-11-01 -P \\
          -o JobID,Partition,Reservation,State,NodeList,Start,End,AllocTRES > sacct.txt

``-P`` output needs its header (no ``-n``); ``JobID``, ``NodeList``, ``Start`` and ``End`` are
required, ``Partition``, ``Reservation``, ``State`` and ``AllocTRES`` (the GPUs a run held:
``gres/gpu=N``) are read when present, other columns are ignored (``-p``'s trailing ``|`` too). Its times are in the local time of the machine that
ran sacct (read here in this machine's; run both under the same ``TZ``, e.g. ``TZ=UTC sacct``)
or Unix seconds. The JSON form carries Unix seconds; its layout changed between Slurm releases
(plain numbers up to 23.02, ``{"set", "number"}`` objects after; ``state.current`` a string,
then a list), and both are read. Slurm 22.05's JSON gives a reservation's id but not its name
(``"name": 0``): such a run's reservation reads ``#<id>``; use the ``-P`` form to filter by name.

Step records (``JobID`` with a ``.``, when ``-X`` was left out) are skipped: the allocation's
own record already holds the nodes.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import InputFileError, ValidationError
from ..hostlist import MAX_NODES, expand
from .acctlog import AccountingLog, JobRun, Skips, Warn, _stderr, gpus_in_tres

REQUIRED = ("JOBID", "NODELIST", "START", "END")
OPTIONAL = ("PARTITION", "RESERVATION", "STATE", "ALLOCTRES")
UNSET = frozenset({"", "unknown", "none", "n/a", "(null)", "0"})


def looks_like_parsable(head: bytes) -> bool:
    """Whether a file starts with a ``sacct -P`` header naming its required columns."""
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").upper().split("|")
    return all(c in first for c in REQUIRED)


def _time(text: str) -> float | None:
    """A sacct time (``2026-11-27T02:15:52`` in local time, or Unix seconds) → Unix seconds;
    None when unset (``Unknown``, ``None``); ValueError when unreadable."""
    text = text.strip()
    if text.lower() in UNSET:
        return None
    if text.isdigit():
        return float(text)
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


_PLAIN = re.compile(r"[A-Za-z0-9_.-]+$")
_ONE_RANGE = re.compile(r"([A-Za-z0-9_.-]*)\[([0-9,-]+)\]([A-Za-z0-9_.-]*)$")


def _nodes(text: str) -> tuple[str, ...]:
    """A record's hostlist as node names. The common forms (``n01``, ``n[01-04,07]``, lists
    of them) are expanded here: ClusterShell (:func:`~malletrain_core.hostlist.expand`, which
    reads every other form) costs about 1 ms a list, minutes for a site's month; the names
    are the same."""
    text = text.strip()
    if text.lower() in ("none assigned", "none", "(null)", ""):
        return ()
    out: list[str] = []
    for part in re.split(r",(?![^\[]*\])", text):
        if _PLAIN.match(part):
            out.append(part)
            continue
        m = _ONE_RANGE.match(part)
        if m is None:
            return tuple(expand(text))
        head, body, tail = m.groups()
        for piece in body.split(","):
            lo, dash, hi = piece.partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()) or len(lo) + len(hi) > 12:
                raise ValidationError("hostlist", repr(text[:60]), f"bad range {piece!r}")
            a, b = int(lo), int(hi) if dash else int(lo)
            if b < a or len(out) + b - a >= MAX_NODES:
                raise ValidationError("hostlist", repr(text[:60]), f"bad range {piece!r}")
            width = len(lo)
            if a == b:
                out.append(head + str(a).zfill(width) + tail)
            else:
                out.extend(head + str(i).zfill(width) + tail for i in range(a, b + 1))
    return tuple(dict.fromkeys(out))


def _run(job: str, start: float | None, end: float | None, nodes: tuple[str, ...],
         partition: str, reservation: str, state: str, gpus: int = 0) -> JobRun | str | None:
    """The run, None when the job never ran, or why the record is unusable."""
    if start is None or not nodes:
        return None
    if end is not None and end < start:
        return f"job {job} ends ({end:.0f}) before it starts ({start:.0f})"
    if end is None and not state.upper().startswith(("RUNNING", "SUSPENDED", "REQUEUED",
                                                     "COMPLETING", "RESIZING")):
        return f"job {job} started but has no end and is not running (state {state or '?'})"
    return JobRun(job, start, end, nodes, partition, reservation, state, gpus)


def read_sacct_parsable(path: Path, warn: Warn | None = _stderr) -> AccountingLog:
    """Runs from ``sacct -P`` (or ``-p``) output with its header (see the module doc)."""
    skips = Skips(str(path), warn)
    runs: list[JobRun] = []
    records = not_run = 0
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as fh:
            reader = csv.reader(fh, delimiter="|", quoting=csv.QUOTE_NONE)
            header = [h.strip().upper() for h in next(reader, [])]
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise InputFileError(str(path), f"no {', '.join(missing)} column in the first "
                                     "line: expected `sacct -P -o JobID,Partition,Reservation,"
                                     "State,NodeList,Start,End` output with its header (no -n)"
                                     ", `sacct --json` or a PBS accounting log", 1)
            col = {c: header.index(c) for c in REQUIRED + OPTIONAL if c in header}
            for line, row in enumerate(reader, start=2):
                if not row or row == [""]:
                    continue
                records += 1
                if len(row) != len(header):
                    skips.note(str(line), f"{len(row)} fields where the header has "
                               f"{len(header)} (a '|' inside a field? use --delimiter)")
                    continue
                job = row[col["JOBID"]].strip()
                if "." in job:
                    records -= 1  # a step: its allocation's record holds the nodes
                    continue
                get = {c: row[i].strip() for c, i in col.items()}
                try:
                    start, end = _time(get["START"]), _time(get["END"])
                    nodes = _nodes(get["NODELIST"])
                except (ValueError, OverflowError, ValidationError) as exc:
                    skips.note(str(line), f"job {job}: {exc}")
                    continue
                run = _run(job, start, end, nodes, get.get("PARTITION", ""),
                           get.get("RESERVATION", ""), get.get("STATE", ""),
                           gpus_in_tres(get.get("ALLOCTRES", "")))
                if isinstance(run, str):
                    skips.note(str(line), run)
                elif run is None:
                    not_run += 1
                else:
                    runs.append(run)
    except FileNotFoundError:
        raise InputFileError(str(path), "no such sacct file") from None
    except (OSError, csv.Error) as exc:
        raise InputFileError(str(path), f"unreadable sacct output: {exc}") from None
    skips.close()
    return AccountingLog(str(path), "sacct -P", runs, records, skips.count, not_run)


def _number(value: Any) -> float | None:
    """A JSON number of any sacct release: a plain number, or ``{"set": …, "number": …}``;
    None when unset or 0 (Slurm's "never")."""
    if isinstance(value, Mapping):
        if value.get("set") is False or value.get("infinite") is True:
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value is None:
            return None
        raise ValueError(f"{value!r} is not a number")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value) if value > 0 else None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if value is None:
        return ""
    raise ValueError(f"{str(value)[:40]!r} is not text")


def _job_id(job: Mapping[str, Any]) -> str:
    array = job.get("array")
    base = job.get("job_id")
    if isinstance(array, Mapping):
        task = array.get("task_id")
        number = _number(task) if isinstance(task, Mapping) else task
        if isinstance(number, (int, float)) and not isinstance(number, bool) and number >= 0:
            parent = array.get("job_id")
            return f"{parent if isinstance(parent, int) and parent else base}_{int(number)}"
    if isinstance(base, bool) or not isinstance(base, int):
        raise ValueError(f"job_id {str(base)[:20]!r} is not a whole number")
    return str(base)


def _reservation(value: Any) -> str:
    if isinstance(value, Mapping):
        name = value.get("name")
        if isinstance(name, str):
            return name
        rid = value.get("id")
        return f"#{rid}" if isinstance(rid, int) and not isinstance(rid, bool) and rid else ""
    return _text(value)


def _json_run(job: Any) -> JobRun | str | None:
    if not isinstance(job, Mapping):
        return f"{type(job).__name__} where a job object was expected"
    try:
        jid = _job_id(job)
        times = job.get("time")
        if not isinstance(times, Mapping):
            return f"job {jid}: no time object"
        start, end = _number(times.get("start")), _number(times.get("end"))
        state = job.get("state")
        current = _text(state.get("current")) if isinstance(state, Mapping) else _text(state)
        nodes = _nodes(_text(job.get("nodes")))
        partition = _text(job.get("partition"))
        reservation = _reservation(job.get("reservation"))
    except (ValueError, OverflowError, ValidationError) as exc:
        return f"job {job.get('job_id', '?')!s:.20}: {exc}"
    return _run(jid, start, end, nodes, partition, reservation, current, _json_gpus(job))


def _json_gpus(job: Mapping[str, Any]) -> int:
    """The GPUs of ``tres.allocated`` (``{"type": "gres", "name": "gpu", "count": N}``; a
    typed ``gpu:a100`` entry beside the plain one not counted twice); 0 when absent."""
    tres = job.get("tres")
    rows = tres.get("allocated") if isinstance(tres, Mapping) else None
    if not isinstance(rows, list):
        return 0
    counts: dict[str, int] = {}
    for r in rows:
        if isinstance(r, Mapping) and r.get("type") == "gres" and \
                str(r.get("name", "")).split(":")[0] == "gpu":
            n = _number(r.get("count"))
            counts[str(r.get("name"))] = counts.get(str(r.get("name")), 0) + int(n or 0)
    return counts["gpu"] if "gpu" in counts else sum(counts.values())


def read_sacct_json(path: Path, warn: Warn | None = _stderr) -> AccountingLog:
    """Runs from ``sacct --json`` output (see the module doc)."""
    skips = Skips(str(path), warn)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(str(path), "no such sacct file") from None
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read: {exc.strerror}") from None
    try:
        data = json.load(io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="replace"))
    except (ValueError, RecursionError) as exc:
        raise InputFileError(str(path), f"not JSON ({str(exc)[:80]}): expected `sacct --json` "
                             "output; a sacct dump cut short is refused whole, take it "
                             "again") from None
    jobs = data.get("jobs") if isinstance(data, Mapping) else data
    if not isinstance(jobs, list):
        raise InputFileError(str(path), "no \"jobs\" list: expected `sacct --json` output")
    runs: list[JobRun] = []
    not_run = 0
    for i, job in enumerate(jobs):
        run = _json_run(job)
        if isinstance(run, str):
            skips.note(f"jobs[{i}]", run)
        elif run is None:
            not_run += 1
        else:
            runs.append(run)
    skips.close()
    return AccountingLog(str(path), "sacct --json", runs, len(jobs), skips.count, not_run)
