"""Idle-node traces: when each node of a machine is left idle by the batch system.

A :class:`Trace` is a start state (the nodes idle at ``start``) and a sequence of steps, each a
time with the nodes that became idle and the nodes the batch system took back. This module
holds the type, its normalisation, the parse cache and the reader of per-node idle CSVs
(``unix_time,node,idle`` rows, gzip or plain: the Summit trace of BFTrainer/FreeTrain and
MalleTrain, or any file in that format); :mod:`.sources` adds SWF logs and synthetic traces.

Transitions are normalised when a trace is built: several transitions of one node at one time
collapse to the last, transitions at or before the start fold into the start state, and
transitions that do not change a node's state are dropped, so every step's ``added`` nodes
were busy before and every ``removed`` node was idle.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputFileError

SUMMIT_SKIP_EVENTS = 1000
"""The BFTrainer replayer skips the trace's first 1,000 event times; so do the figures here."""
DAY_S = 86400.0
_CACHE_VERSION = "2"


@dataclass(frozen=True)
class Trace:
    """Idle nodes over time: the state at ``start`` and the steps up to ``end``.

    ``times[s]`` is step s's time; its transitions are ``nodes[offsets[s]:offsets[s+1]]``
    (indices into ``node_names``) with ``idle`` True for a node that became idle.
    """

    name: str
    node_names: tuple[str, ...]
    start: float
    end: float
    initial: np.ndarray
    times: np.ndarray
    offsets: np.ndarray
    nodes: np.ndarray
    idle: np.ndarray

    @property
    def steps(self) -> int:
        return len(self.times)

    @property
    def span_s(self) -> float:
        return self.end - self.start

    def step(self, s: int) -> tuple[float, np.ndarray, np.ndarray]:
        """Step ``s`` as (time, indices of nodes that became idle, indices taken back)."""
        lo, hi = int(self.offsets[s]), int(self.offsets[s + 1])
        nodes, idle = self.nodes[lo:hi], self.idle[lo:hi]
        return float(self.times[s]), nodes[idle], nodes[~idle]

    def iter_steps(self) -> Iterator[tuple[float, np.ndarray, np.ndarray]]:
        for s in range(self.steps):
            yield self.step(s)

    def idle_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(interval starts, idle count in each interval); intervals end at the next start or
        at ``end``. The first interval starts at ``start`` with the initial state."""
        signed = np.where(self.idle, 1, -1).astype(np.int64)
        per_step = np.add.reduceat(signed, self.offsets[:-1]) if len(signed) else \
            np.zeros(0, np.int64)
        per_step[np.diff(self.offsets) == 0] = 0
        counts = len(self.initial) + np.concatenate(([0], np.cumsum(per_step)))
        starts = np.concatenate(([self.start], self.times))
        return starts, counts

    def idle_node_seconds(self) -> float:
        starts, counts = self.idle_counts()
        durations = np.diff(np.concatenate((starts, [self.end])))
        return float(np.dot(durations, counts))

    def window(self, days: float | None = None, skip_events: int = 0) -> Trace:
        """The trace with its first ``skip_events`` step times folded into the start state and
        cut ``days`` after the (new) start."""
        if skip_events < 0:
            raise ValueError("skip_events must be ≥ 0")
        trace = self
        if skip_events:
            k = min(skip_events, trace.steps)
            state = np.zeros(len(trace.node_names), bool)
            state[trace.initial] = True
            hi = int(trace.offsets[k])
            head_nodes, head_idle = trace.nodes[:hi][::-1], trace.idle[:hi][::-1]
            touched, last = np.unique(head_nodes, return_index=True)
            state[touched] = head_idle[last]
            new_start = float(trace.times[k - 1]) if k else trace.start
            trace = Trace(trace.name, trace.node_names, new_start, max(trace.end, new_start),
                          np.flatnonzero(state).astype(np.int32), trace.times[k:],
                          trace.offsets[k:] - hi, trace.nodes[hi:], trace.idle[hi:])
        if days is not None:
            if days <= 0:
                raise ValueError("days must be > 0")
            end = min(trace.end, trace.start + days * DAY_S)
            k = int(np.searchsorted(trace.times, end, side="left"))
            hi = int(trace.offsets[k])
            trace = Trace(trace.name, trace.node_names, trace.start, end, trace.initial,
                          trace.times[:k], trace.offsets[:k + 1], trace.nodes[:hi],
                          trace.idle[:hi])
        return trace

    def renamed(self, seed: int) -> Trace:
        """The same trace with node names permuted by ``seed``: placement breaks ties by name,
        so this turns "lowest name first" into an order unrelated to the nodes' history."""
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(self.node_names))
        width = len(str(max(len(self.node_names) - 1, 1)))
        names = tuple(f"n{int(p):0{width}d}" for p in perm)
        return Trace(self.name, names, self.start, self.end, self.initial, self.times,
                     self.offsets, self.nodes, self.idle)


def from_transitions(name: str, node_names: list[str] | tuple[str, ...], initial: np.ndarray,
                     times: np.ndarray, nodes: np.ndarray, idle: np.ndarray,
                     start: float | None = None, end: float | None = None) -> Trace:
    """Build a normalised trace from raw per-node transitions (any order within a time)."""
    times = np.asarray(times, dtype=np.float64)
    nodes = np.asarray(nodes, dtype=np.int32)
    idle = np.asarray(idle, dtype=bool)
    n_nodes = len(node_names)
    order = np.lexsort((np.arange(len(times)), times, nodes))
    t_s, n_s, v_s = times[order], nodes[order], idle[order]
    # Keep the last transition of each (node, time).
    last = np.ones(len(t_s), bool)
    if len(t_s) > 1:
        last[:-1] = (n_s[1:] != n_s[:-1]) | (t_s[1:] != t_s[:-1])
    t_s, n_s, v_s = t_s[last], n_s[last], v_s[last]
    # Drop transitions that repeat the node's previous state.
    state0 = np.zeros(n_nodes, bool)
    state0[np.asarray(initial, dtype=np.int64)] = True
    prev = np.empty(len(v_s), bool)
    if len(v_s):
        first = np.ones(len(v_s), bool)
        first[1:] = n_s[1:] != n_s[:-1]
        prev[1:] = v_s[:-1]
        prev[first] = state0[n_s[first]]
    keep = v_s != prev
    t_s, n_s, v_s = t_s[keep], n_s[keep], v_s[keep]
    order = np.lexsort((n_s, t_s))
    t_s, n_s, v_s = t_s[order], n_s[order], v_s[order]
    begin = float(start if start is not None else (t_s[0] if len(t_s) else 0.0))
    # Transitions at or before the start belong to the start state.
    early = int(np.searchsorted(t_s, begin, side="right"))
    if early:
        touched, last = np.unique(n_s[:early][::-1], return_index=True)
        state0[touched] = v_s[:early][::-1][last]
        t_s, n_s, v_s = t_s[early:], n_s[early:], v_s[early:]
    step_times, first_idx = np.unique(t_s, return_index=True)
    offsets = np.concatenate((first_idx, [len(t_s)])).astype(np.int64)
    finish = float(end if end is not None else (step_times[-1] if len(step_times) else begin))
    return Trace(name, tuple(node_names), begin, finish,
                 np.flatnonzero(state0).astype(np.int32), step_times, offsets,
                 n_s.astype(np.int32), v_s)


def cache_path(path: Path, kind: str) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{_CACHE_VERSION}|{kind}|{path.resolve()}|{st.st_size}|"
                         f"{st.st_mtime_ns}".encode()).hexdigest()[:20]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "malletrain" / f"trace-{key}.npz"


def save_cached(trace: Trace, cache: Path) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, names=np.array(trace.node_names), initial=trace.initial, times=trace.times,
                 offsets=trace.offsets, nodes=trace.nodes, idle=trace.idle,
                 span=np.array([trace.start, trace.end]))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home only costs the next run another parse


def load_cached(name: str, cache: Path) -> Trace | None:
    try:
        with np.load(cache) as z:
            return Trace(name, tuple(str(s) for s in z["names"]), float(z["span"][0]),
                         float(z["span"][1]), z["initial"], z["times"], z["offsets"],
                         z["nodes"], z["idle"])
    except (OSError, KeyError, ValueError):
        return None


def _open_text(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
        return open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read: {exc.strerror}") from None


def read_idle_csv(path: str | os.PathLike[str], name: str | None = None,
                  use_cache: bool = True) -> Trace:
    """A per-node idle-event CSV (``unix_time,node,idle``): rows at the first time with
    ``idle=1`` are the initial idle set, every later row one transition."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(str(path), "no such trace file; give --trace summit|swf|synthetic "
                             "or the path of a .swf or unix_time,node,idle .csv[.gz] file")
    cache = cache_path(path, "idle-csv") if use_cache else None
    if cache is not None and cache.is_file():
        cached = load_cached(name or path.name, cache)
        if cached is not None:
            return cached
    index: dict[str, int] = {}
    times: list[int] = []
    nodes: list[int] = []
    idle: list[bool] = []
    with _open_text(path) as fh:
        try:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None or [h.strip() for h in header[:3]] != ["unix_time", "node", "idle"]:
                raise InputFileError(str(path), "expected the header 'unix_time,node,idle'", 1)
            setdefault = index.setdefault
            for line, row in enumerate(reader, start=2):
                try:
                    t_text, node, v = row
                    t = int(t_text)
                    if not -2**62 < t < 2**62:  # kept as float64 and int64 below
                        raise ValueError(t_text)
                    flag = {"1": True, "0": False}[v.strip()]
                except (ValueError, KeyError):
                    raise InputFileError(str(path), f"bad row {','.join(row)[:60]!r}: want "
                                         "unix_time (integer),node,idle (0 or 1)", line) from None
                if not node:
                    raise InputFileError(str(path), "empty node name", line)
                times.append(t)
                nodes.append(setdefault(node, len(index)))
                idle.append(flag)
        except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
            raise InputFileError(str(path), f"unreadable trace: {exc}") from None
    if not times:
        raise InputFileError(str(path), "the trace has no rows")
    t_arr = np.array(times, dtype=np.float64)
    n_arr = np.array(nodes, dtype=np.int32)
    v_arr = np.array(idle, dtype=bool)
    if np.any(np.diff(t_arr) < 0):
        bad = int(np.flatnonzero(np.diff(t_arr) < 0)[0]) + 3
        raise InputFileError(str(path), "time goes backwards; sort the rows by unix_time", bad)
    t0 = t_arr[0]
    at0 = (t_arr == t0) & v_arr
    trace = from_transitions(name or path.name, list(index), n_arr[at0], t_arr[~at0],
                             n_arr[~at0], v_arr[~at0], start=float(t0))
    if cache is not None:
        save_cached(trace, cache)
    return trace
