"""A site's own batch accounting as an idle-node trace: what each node really did.

SWF and ALCF logs carry node *counts*, so their replay has to place jobs on made-up nodes.
Slurm's ``sacct`` and PBS's accounting logs name each job's nodes, so here every node's busy
spans are the jobs that ran on it and its idle gaps are exact: a node is idle whenever no kept
job holds it. The readers (:mod:`.sacct`, :mod:`.pbsacct`) turn records into
:class:`JobRun` s; this module filters them (:class:`AccountingFilter`: the partitions or
queues and reservations an admin counts), notes malformed records (:class:`Skips`: one line
each, counted, never an exception) and builds the :class:`~.traces.Trace`.

The machine is the nodes the kept records name, plus any the caller lists (a node no job ever
ran on is idle all along, but no record names it: give it with ``nodes``). The trace runs from
the earliest start to the latest end among the kept runs unless the caller gives a window; a
run whose end is unknown (still RUNNING when the log was taken) holds its nodes to the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputFileError
from . import pbsacct, sacct
from .acctlog import MAX_NOTED, AccountingLog, JobRun, Skips, Warn, _stderr
from .traces import Trace, from_transitions

__all__ = ["MAX_NOTED", "AccountingFilter", "AccountingLog", "JobRun", "Skips", "Warn",
           "load_accounting", "load_accounting_trace", "looks_like_accounting",
           "read_accounting", "runs_to_trace"]

def _names(values: Iterable[str]) -> frozenset[str]:
    return frozenset(v.strip() for v in values if v and v.strip())


@dataclass(frozen=True)
class AccountingFilter:
    """Which runs hold nodes: only ``partitions`` (Slurm partitions, PBS queues; empty: all),
    none of ``skip_partitions``; only ``reservations`` (empty: any, or none), none of
    ``skip_reservations``. A run outside every reservation has reservation ``""``."""

    partitions: frozenset[str] = frozenset()
    skip_partitions: frozenset[str] = frozenset()
    reservations: frozenset[str] = frozenset()
    skip_reservations: frozenset[str] = frozenset()

    @classmethod
    def of(cls, partitions: Iterable[str] = (), skip_partitions: Iterable[str] = (),
           reservations: Iterable[str] = (), skip_reservations: Iterable[str] = ()
           ) -> AccountingFilter:
        return cls(_names(partitions), _names(skip_partitions), _names(reservations),
                   _names(skip_reservations))

    def keeps(self, run: JobRun) -> bool:
        if self.partitions and run.partition not in self.partitions:
            return False
        if run.partition in self.skip_partitions:
            return False
        if self.reservations and run.reservation not in self.reservations:
            return False
        return not (run.reservation and run.reservation in self.skip_reservations)

    def describe(self) -> str:
        parts = []
        for label, names in (("partitions", self.partitions),
                             ("not partitions", self.skip_partitions),
                             ("reservations", self.reservations),
                             ("not reservations", self.skip_reservations)):
            if names:
                parts.append(f"{label} {','.join(sorted(names))}")
        return "; ".join(parts) or "every partition and reservation"


def runs_to_trace(name: str, runs: Sequence[JobRun], nodes: Iterable[str] = (),
                  start: float | None = None, end: float | None = None) -> Trace:
    """The idle trace of ``runs`` (already filtered): each node idle except while a run holds
    it, over ``[start, end]`` (default: the runs' earliest start to their latest end)."""
    names = sorted(set(nodes).union(n for r in runs for n in r.nodes))
    if not names:
        raise ValueError("no node")
    index = {n: i for i, n in enumerate(names)}
    begin = min(r.start for r in runs) if start is None else start
    ends = [r.end if r.end is not None else r.start for r in runs]
    finish = max(ends) if end is None else end
    finish = max(finish, begin)
    count = sum(len(r.nodes) for r in runs)
    node = np.empty(count, np.int64)
    s = np.empty(count)
    e = np.empty(count)
    i = 0
    for r in runs:
        k = len(r.nodes)
        node[i:i + k] = [index[n] for n in r.nodes]
        s[i:i + k] = r.start
        e[i:i + k] = finish if r.end is None else r.end
        i += k
    keep = (e > s) & (e > begin) & (s < finish)
    node, s, e = node[keep], np.maximum(s[keep], begin), np.minimum(e[keep], finish)
    m_node, m_start, m_end = _merge(node, s - begin, e - begin)
    t = np.concatenate((m_start, m_end)) + begin
    n = np.concatenate((m_node, m_node))
    idle = np.concatenate((np.zeros(len(m_start), bool), np.ones(len(m_end), bool)))
    at_end = t >= finish  # a node busy up to the end stays busy in the trace
    return from_transitions(name, names, np.arange(len(names)), t[~at_end], n[~at_end],
                            idle[~at_end], start=begin, end=finish)


def _merge(node: np.ndarray, start: np.ndarray, end: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of each node's busy spans (times ≥ 0), vectorised: sorted by node then
    start, a span opens a new busy stretch where it starts after every earlier span of its
    node ended (a running maximum of the ends, kept apart per node by an offset)."""
    if not len(node):
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    order = np.lexsort((start, node))
    node, start, end = node[order], start[order], end[order]
    width = float(end.max()) + 1.0
    reach = np.maximum.accumulate(end + node * width) - node * width
    first = np.ones(len(node), bool)
    first[1:] = (node[1:] != node[:-1]) | (start[1:] > reach[:-1])
    groups = np.flatnonzero(first)
    last = np.append(groups[1:], len(node)) - 1
    return node[groups], start[groups], reach[last]


def read_accounting(path: str | Path, warn: Warn | None = _stderr) -> AccountingLog:
    """Read a Slurm ``sacct`` dump (``--json`` or ``-P`` with a header) or a PBS accounting
    log, whichever ``path`` holds; a file with no usable record is refused with one line
    naming what was expected."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except FileNotFoundError:
        raise InputFileError(str(path), "no such accounting file") from None
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read: {exc.strerror}") from None
    text = head.lstrip()
    if text.startswith((b"{", b"[")):
        log = sacct.read_sacct_json(path, warn)
    elif pbsacct.looks_like_pbs(head):
        log = pbsacct.read_pbs_accounting(path, warn)
    else:
        log = sacct.read_sacct_parsable(path, warn)
    if not log.runs:
        raise InputFileError(str(path), f"no usable record ({log.records} read, "
                             f"{log.skipped} malformed, {log.not_run} never ran): expected "
                             f"{EXPECTED}")
    return log


EXPECTED = ("`sacct --json` output, `sacct -P -X -D -a -o JobID,Partition,Reservation,State,"
            "NodeList,Start,End` output with its header, or PBS accounting log lines "
            "(`MM/DD/YYYY HH:MM:SS;E;id;... start=… end=… exec_vnode=…`)")


def looks_like_accounting(path: Path) -> bool:
    """Whether ``path`` starts like one of the logs :func:`read_accounting` reads (so that
    ``--trace FILE`` picks the reader without a flag)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    text = head.lstrip()
    return (text.startswith((b"{", b"[")) or pbsacct.looks_like_pbs(head)
            or sacct.looks_like_parsable(head))


def load_accounting_trace(path: str | Path, filt: AccountingFilter | None = None,
                          nodes: Iterable[str] = (), warn: Warn | None = _stderr) -> Trace:
    """The idle trace of an accounting file, its runs filtered by ``filt``."""
    return load_accounting(path, filt, nodes, warn)[0]


def load_accounting(path: str | Path, filt: AccountingFilter | None = None,
                    nodes: Iterable[str] = (), warn: Warn | None = _stderr
                    ) -> tuple[Trace, AccountingLog]:
    """:func:`load_accounting_trace`, with the log it was read from (all of its runs)."""
    log = read_accounting(path, warn)
    filt = filt or AccountingFilter()
    kept = [r for r in log.runs if filt.keeps(r)]
    if not kept:
        seen = sorted({r.partition for r in log.runs})[:8]
        raise InputFileError(str(path), f"no run left after the filter ({filt.describe()}); "
                             f"the log's partitions/queues: {', '.join(seen) or 'none'}")
    return runs_to_trace(Path(path).name, kept, nodes), log
