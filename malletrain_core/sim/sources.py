"""Where traces come from: the named data sets, SWF batch logs, ALCF job logs and synthetic
traces.

* an SWF log is replayed as idle nodes: a job runs from submit + wait to that + run time on
  nodes placed deterministically (lowest free node numbers first) on a machine of a given
  size; nodes no job holds are idle;
* an ALCF job log (the CSV files of ALCF's public "Directory of Job Logs", one row per job) is
  replayed the same way, each job holding its nodes from START_TIMESTAMP to END_TIMESTAMP;
* a synthetic trace alternates, per node, idle fragments drawn from the real Summit fragment
  lengths and busy periods sized for a chosen idle fraction;
* :func:`load_trace` resolves ``summit``, ``swf``, ``synthetic`` or a file's path.
"""

from __future__ import annotations

import csv
import heapq
import math
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import InputFileError
from .accounting import AccountingFilter, load_accounting_trace, looks_like_accounting
from .measured import shared_dir
from .traces import (
    DAY_S,
    SUMMIT_SKIP_EVENTS,
    Trace,
    _open_text,
    cache_path,
    from_transitions,
    load_cached,
    read_idle_csv,
    save_cached,
)

SUMMIT_FILE = ("data", "summit", "summit_idle_events.csv.gz")
FRAGMENTS_FILE = ("data", "summit", "fragments.npy")
SWF_FILE = ("data", "swf", "theta_2023.swf")
THETA_NODES = 4360


def read_swf(path: str | os.PathLike[str], machine_nodes: int = THETA_NODES,
             name: str | None = None, use_cache: bool = True) -> Trace:
    """An SWF log replayed as idle nodes: a job holds ``allocated`` nodes (else ``requested``)
    from submit + wait to that + run time; busy counts above ``machine_nodes`` are clipped."""
    path = Path(path)
    if machine_nodes < 1:
        raise InputFileError(str(path), f"machine size {machine_nodes} must be ≥ 1")
    cache = cache_path(path, f"swf-{machine_nodes}") if use_cache and path.is_file() else None
    if cache is not None and cache.is_file():
        cached = load_cached(name or path.name, cache)
        if cached is not None:
            return cached
    jobs: list[tuple[float, float, int]] = []
    try:
        with open(path, encoding="utf-8", errors="strict") as fh:
            for line, text in enumerate(fh, start=1):
                text = text.strip()
                if not text or text.startswith(";"):
                    continue
                fields = text.split()
                if len(fields) < 9:
                    raise InputFileError(str(path), f"{len(fields)} fields; an SWF line has 18 "
                                         "whitespace-separated fields", line)
                try:
                    submit, wait, run = float(fields[1]), float(fields[2]), float(fields[3])
                    alloc, req = int(float(fields[4])), int(float(fields[7]))
                    if not math.isfinite(submit + wait + run):
                        raise ValueError("not finite")
                except (ValueError, OverflowError):
                    raise InputFileError(str(path), "fields 2-5 and 8 must be numbers "
                                         f"(got {' '.join(fields[1:8])!r})", line) from None
                size = alloc if alloc > 0 else req
                if submit < 0 or wait < 0 or run <= 0 or size <= 0:
                    continue  # unknown (-1) or empty jobs hold no nodes
                jobs.append((submit + wait, submit + wait + run, size))
    except FileNotFoundError:
        raise InputFileError(str(path), "no such SWF file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(str(path), f"cannot read: {exc}") from None
    if not jobs:
        raise InputFileError(str(path), "no job with a start, a run time and nodes")
    trace = placed_jobs(name or path.name, jobs, machine_nodes)
    if cache is not None:
        save_cached(trace, cache)
    return trace


ALCF_START, ALCF_END = "START_TIMESTAMP", "END_TIMESTAMP"
ALCF_SIZES = ("NODES_USED", "NODES_REQUESTED")
"""The columns an ALCF job log must have: the start and end of each job and its node count
(NODES_USED where positive, else NODES_REQUESTED; either column may be absent, not both)."""


ALCF_MARKERS = frozenset((ALCF_START, ALCF_END, "QUEUED_TIMESTAMP", "JOB_NAME") + ALCF_SIZES)


def is_alcf_header(header: list[str]) -> bool:
    """Whether a CSV header is meant as an ALCF job log's (it names one of its columns), so
    that a log missing a required column is told which one."""
    return not ALCF_MARKERS.isdisjoint(h.strip().upper() for h in header)


def _alcf_time(text: str) -> float | None:
    """Seconds since the epoch of an ALCF timestamp (``2023-09-01 12:34:56`` in UTC, optionally
    with fractional seconds, a ``T`` or an offset; or plain epoch seconds); None when empty."""
    text = text.strip()
    if not text or text.upper() in ("NULL", "NONE", "NAN"):
        return None
    try:
        return float(text)
    except ValueError:
        pass
    stamp = datetime.fromisoformat(text)  # ValueError: reported with the row by the caller
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def read_alcf_csv(path: str | os.PathLike[str], machine_nodes: int = THETA_NODES,
                  name: str | None = None, use_cache: bool = True) -> Trace:
    """An ALCF job log (CSV with a header, ``.csv`` or ``.csv.gz``) replayed as idle nodes: a job
    holds NODES_USED nodes (else NODES_REQUESTED) from START_TIMESTAMP to END_TIMESTAMP, placed
    as :func:`read_swf` places them. Rows of jobs that never started (no start, no end, an end
    before the start, or no nodes) hold no nodes; other columns are ignored."""
    path = Path(path)
    if machine_nodes < 1:
        raise InputFileError(str(path), f"machine size {machine_nodes} must be ≥ 1")
    if not path.is_file():
        raise InputFileError(str(path), "no such ALCF job log")
    cache = cache_path(path, f"alcf-{machine_nodes}") if use_cache else None
    if cache is not None and cache.is_file():
        cached = load_cached(name or path.name, cache)
        if cached is not None:
            return cached
    jobs: list[tuple[float, float, int]] = []
    with _open_text(path) as fh:
        try:
            reader = csv.reader(fh)
            header = [h.strip().upper() for h in next(reader, [])]
            missing = [c for c in (ALCF_START, ALCF_END) if c not in header]
            sizes = [header.index(c) for c in ALCF_SIZES if c in header]
            if not sizes:
                missing.append(" or ".join(ALCF_SIZES))
            if missing:
                raise InputFileError(str(path), f"missing column {', '.join(missing)}: an ALCF "
                                     f"job log needs {ALCF_START}, {ALCF_END} and "
                                     f"{' or '.join(ALCF_SIZES)} in its header", 1)
            i_start, i_end = header.index(ALCF_START), header.index(ALCF_END)
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) != len(header):
                    raise InputFileError(str(path), f"{len(row)} fields where the header has "
                                         f"{len(header)}", line)
                try:
                    start, end = _alcf_time(row[i_start]), _alcf_time(row[i_end])
                except ValueError:
                    raise InputFileError(str(path), f"{ALCF_START} {row[i_start]!r} or "
                                         f"{ALCF_END} {row[i_end]!r} is not a time like "
                                         "2023-09-01 12:34:56 (UTC) or epoch seconds",
                                         line) from None
                counts = []
                for i in sizes:
                    try:
                        counts.append(int(float(row[i])) if row[i].strip() else 0)
                    except ValueError:
                        raise InputFileError(str(path), f"{header[i]} {row[i]!r} is not a "
                                             "node count", line) from None
                size = next((c for c in counts if c > 0), 0)
                if start is None or end is None or end <= start or size <= 0:
                    continue  # never ran, or ran on nothing: holds no nodes
                jobs.append((start, end, size))
        except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
            raise InputFileError(str(path), f"unreadable job log: {exc}") from None
    if not jobs:
        raise InputFileError(str(path), "no job with a start, an end after it and nodes")
    trace = placed_jobs(name or path.name, jobs, machine_nodes)
    if cache is not None:
        save_cached(trace, cache)
    return trace


def placed_jobs(name: str, jobs: list[tuple[float, float, int]], machine_nodes: int) -> Trace:
    """Jobs ``(start, end, nodes)`` on a machine of ``machine_nodes`` nodes named ``nid…``, each
    taking the lowest-numbered free nodes (clipped to what is free); the rest is idle."""
    width = len(str(machine_nodes - 1))
    names = [f"nid{i:0{width}d}" for i in range(machine_nodes)]
    # Ends before starts at equal times, so freed nodes can be reused at once.
    timeline = sorted([(s, 1, j) for j, (s, _, _) in enumerate(jobs)] +
                      [(e, 0, j) for j, (_, e, _) in enumerate(jobs)])
    free = list(range(machine_nodes))
    heapq.heapify(free)
    held: dict[int, list[int]] = {}
    t_out: list[float] = []
    n_out: list[int] = []
    v_out: list[bool] = []
    for t, kind, j in timeline:
        if kind == 0:
            for n in held.pop(j, ()):
                heapq.heappush(free, n)
                t_out.append(t)
                n_out.append(n)
                v_out.append(True)
        else:
            take = [heapq.heappop(free) for _ in range(min(jobs[j][2], len(free)))]
            held[j] = take
            t_out.extend([t] * len(take))
            n_out.extend(take)
            v_out.extend([False] * len(take))
    return from_transitions(name, names, np.arange(machine_nodes), np.array(t_out),
                            np.array(n_out), np.array(v_out), start=timeline[0][0])


def synthetic(nodes: int = 256, days: float = 2.0, seed: int = 0, idle_fraction: float = 0.083,
              fragments: np.ndarray | None = None, grid_s: float = 10.0) -> Trace:
    """A trace whose idle fragments are drawn from the Summit fragment lengths: each node
    alternates idle fragments and exponential busy periods whose mean gives ``idle_fraction``."""
    if nodes < 1 or days <= 0 or not 0 < idle_fraction < 1:
        raise InputFileError("synthetic", "needs nodes ≥ 1, days > 0 and 0 < idle fraction < 1")
    if fragments is None:
        path = shared_dir().joinpath(*FRAGMENTS_FILE)
        try:
            fragments = np.load(path)
        except (OSError, ValueError, EOFError) as exc:
            raise InputFileError(str(path), f"cannot read the fragment lengths: {exc}; set "
                                 "MALLETRAIN_SHARED to the folder holding data/summit") from None
    frags = np.asarray(fragments, dtype=np.float64)
    frags = frags[frags > 0]
    if not len(frags):
        raise InputFileError("synthetic", "no positive fragment length to sample from")
    rng = np.random.default_rng(seed)
    span = days * DAY_S
    busy_mean = frags.mean() * (1 - idle_fraction) / idle_fraction
    width = len(str(nodes - 1))
    names = [f"s{i:0{width}d}" for i in range(nodes)]
    initial = []
    t_out: list[np.ndarray] = []
    n_out: list[np.ndarray] = []
    v_out: list[np.ndarray] = []
    cycles = int(np.ceil(span / (frags.mean() + busy_mean))) * 2 + 4
    for n in range(nodes):
        idle_first = rng.random() < idle_fraction
        idle_len = rng.choice(frags, cycles)
        busy_len = rng.exponential(busy_mean, cycles)
        seq = np.empty(2 * cycles)
        if idle_first:
            seq[0::2], seq[1::2] = idle_len, busy_len
            initial.append(n)
        else:
            seq[0::2], seq[1::2] = busy_len, idle_len
        seq[0] *= rng.random()  # the first period began before the trace
        edges = np.round(np.cumsum(seq) / grid_s) * grid_s
        edges = edges[edges < span]
        flags = np.resize(np.array([not idle_first, idle_first]), len(edges))
        t_out.append(edges)
        n_out.append(np.full(len(edges), n))
        v_out.append(flags)
    return from_transitions(f"synthetic(nodes={nodes},seed={seed})", names,
                            np.array(initial, dtype=np.int64),
                            np.concatenate(t_out) if t_out else np.zeros(0),
                            np.concatenate(n_out) if n_out else np.zeros(0, np.int32),
                            np.concatenate(v_out) if v_out else np.zeros(0, bool),
                            start=0.0, end=span)


def load_trace(spec: str, *, days: float | None = None, seed: int = 0,
               machine_nodes: int = THETA_NODES, synthetic_nodes: int = 256,
               skip_events: int | None = None,
               accounting: AccountingFilter | None = None) -> Trace:
    """A trace by name (``summit``, ``swf``, ``synthetic``) or path (``.swf``; a site's
    accounting, ``sacct --json``, ``sacct -P`` or a PBS accounting log, whatever its name, its
    runs filtered by ``accounting``; ``.csv`` or ``.csv.gz``: an ALCF job log when the header
    names its columns, such as START_TIMESTAMP, else the ``unix_time,node,idle`` format), cut
    to ``days``.

    ``skip_events`` defaults to 1,000 for the Summit trace (as BFTrainer's replayer) and to the
    events of the first day for job logs (SWF, ALCF: they start with an empty machine), else 0.
    """
    if spec == "summit":
        trace = read_idle_csv(_shared_file(SUMMIT_FILE), name="summit")
        return trace.window(days, SUMMIT_SKIP_EVENTS if skip_events is None else skip_events)
    if spec == "synthetic":
        trace = synthetic(nodes=synthetic_nodes, days=days or 2.0, seed=seed)
        return trace.window(None, skip_events or 0)
    if spec == "swf":
        return _swf_window(read_swf(_shared_file(SWF_FILE), machine_nodes, "swf"),
                           days, skip_events)
    path = Path(spec)
    if path.suffix == ".swf":
        return _swf_window(read_swf(path, machine_nodes), days, skip_events)
    if path.is_file() and not path.name.endswith(".gz") and looks_like_accounting(path):
        return load_accounting_trace(path, accounting).window(days, skip_events or 0)
    if path.name.endswith((".csv", ".csv.gz")):
        if path.is_file() and _csv_header_is_alcf(path):
            return _swf_window(read_alcf_csv(path, machine_nodes), days, skip_events)
        return read_idle_csv(path).window(days, skip_events or 0)
    if not path.exists():
        raise InputFileError(spec, "unknown trace; give summit, swf, synthetic or the path of a "
                             ".swf log, sacct --json or -P output, a PBS accounting log, an "
                             "ALCF job-log .csv or a unix_time,node,idle .csv[.gz] file")
    raise InputFileError(spec, "unknown trace format; use a .swf log, sacct --json or -P "
                         "output (with its header), a PBS accounting log, an ALCF job-log .csv "
                         "or a unix_time,node,idle .csv/.csv.gz file")


def _csv_header_is_alcf(path: Path) -> bool:
    with _open_text(path) as fh:
        try:
            return is_alcf_header(next(csv.reader(fh), []))
        except (OSError, EOFError, UnicodeDecodeError, csv.Error):
            return False  # read_idle_csv reports what is wrong with the file


def _shared_file(parts: tuple[str, ...]) -> Path:
    path = shared_dir().joinpath(*parts)
    if not path.is_file():
        raise InputFileError(str(path), "missing; set MALLETRAIN_SHARED to the folder that "
                             "holds data/summit and data/swf, or give a trace file's path")
    return path


def _swf_window(trace: Trace, days: float | None, skip_events: int | None) -> Trace:
    if skip_events is None:
        skip_events = int(np.searchsorted(trace.times, trace.start + DAY_S))
    return trace.window(days, skip_events)
