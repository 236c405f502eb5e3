"""The Job Monitor: progress reports → throughput per scale and measured rescale costs.

A job reports cumulative samples at a time and the world size (in nodes) it trained at. After
every change of scale the first report at the new world size only sets the baseline (its
interval contains the restart and the warm-up) and closes the rescale: the time from the order
to that report is the rescale's cost in seconds of lost progress. The following reports give
intervals whose sliding-window average over ``window_s`` is the throughput at that scale
(until a scale has had one full window, a partial average without the first interval stands
in). Reports at any other world size than the one in force are stale and ignored, and samples
going backwards (a rollback to a checkpoint) start a new baseline.

Throughput drifts (a later training phase, another input pipeline). Once the window at the
running scale is full and the first interval after the restart has left it, its estimate is
the segment's anchor; when the estimate later moves away from the anchor by more than
``DRIFT_THRESHOLD``, the estimates of the other scales (measured earlier) are scaled by the same
ratio, as they are assumed to have drifted alike until they are measured again. Smaller moves
are noise and leave them alone, so noise does not random-walk through the curve.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from .. import shortcuts
from ..events import ProgressReport

COST_HISTORY = 8
"""Rescale costs kept per job and kind; their median is the job's estimate."""

DRIFT_THRESHOLD = 0.2
"""Relative move of the running scale's throughput that is taken for a drift of the job."""


@dataclass
class _Segment:
    """Reports at one world size since the last rescale."""

    size: int
    t0: float
    last_t: float
    last_samples: float
    intervals: deque[tuple[float, float]] = field(default_factory=deque)
    win_dt: float = 0.0
    win_ds: float = 0.0
    settled: bool = False
    anchor: float | None = None
    others: dict[int, float] = field(default_factory=dict)
    followed: float | None = field(default=None, compare=False)
    """The drift ratio the other scales' estimates were last set to in this segment (only
    :meth:`Monitor._follow_drift` writes them while it lasts): the same ratio again would
    write the same values. Not state: without it they are written once more."""

    @property
    def span_s(self) -> float:
        return self.last_t - self.t0

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "t0": self.t0, "last_t": self.last_t,
                "last_samples": self.last_samples, "intervals": [list(i) for i in self.intervals],
                "win_dt": self.win_dt, "win_ds": self.win_ds, "settled": self.settled,
                "anchor": self.anchor, "others": list(self.others.items())}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _Segment:
        return cls(int(state["size"]), state["t0"], state["last_t"], state["last_samples"],
                   deque((dt, ds) for dt, ds in state["intervals"]), state["win_dt"],
                   state["win_ds"], bool(state["settled"]), state["anchor"],
                   {int(k): v for k, v in state["others"]})


@dataclass
class _Track:
    expected: int = 0
    pending_since: float | None = None
    pending_kind: str | None = None
    segment: _Segment | None = None
    rates: dict[int, float] = field(default_factory=dict)
    full: set[int] = field(default_factory=set)
    up_s: deque[float] = field(default_factory=lambda: deque(maxlen=COST_HISTORY))
    down_s: deque[float] = field(default_factory=lambda: deque(maxlen=COST_HISTORY))
    up_median: float | None = None
    down_median: float | None = None
    version: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"expected": self.expected, "pending_since": self.pending_since,
                "pending_kind": self.pending_kind,
                "segment": None if self.segment is None else self.segment.state_dict(),
                "rates": list(self.rates.items()), "full": sorted(self.full),
                "up_s": list(self.up_s), "down_s": list(self.down_s),
                "up_median": self.up_median, "down_median": self.down_median,
                "version": self.version}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _Track:
        segment = state["segment"]
        return cls(int(state["expected"]), state["pending_since"], state["pending_kind"],
                   None if segment is None else _Segment.from_state(segment),
                   {int(k): v for k, v in state["rates"]}, {int(k) for k in state["full"]},
                   deque(state["up_s"], maxlen=COST_HISTORY),
                   deque(state["down_s"], maxlen=COST_HISTORY), state["up_median"],
                   state["down_median"], int(state["version"]))


class Monitor:
    """Per-job throughput and rescale-cost estimates from progress reports."""

    def __init__(self, window_s: float) -> None:
        self.window_s = float(window_s)
        self._tracks: dict[str, _Track] = {}
        self._all_up: deque[float] = deque(maxlen=4 * COST_HISTORY)
        self._all_down: deque[float] = deque(maxlen=4 * COST_HISTORY)

    def state_dict(self) -> dict[str, Any]:
        """Every job's track and the recent rescale costs as plain data (the window is
        configuration); :meth:`load_state_dict` reads it."""
        return {"tracks": {job: track.state_dict() for job, track in self._tracks.items()},
                "all_up": list(self._all_up), "all_down": list(self._all_down)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state :meth:`state_dict` wrote."""
        self._tracks = {str(job): _Track.from_state(track)
                        for job, track in state["tracks"].items()}
        self._all_up = deque(state["all_up"], maxlen=self._all_up.maxlen)
        self._all_down = deque(state["all_down"], maxlen=self._all_down.maxlen)

    def add(self, job_id: str) -> None:
        """Start tracking a job (idempotent)."""
        self._tracks.setdefault(job_id, _Track())

    def remove(self, job_id: str) -> None:
        """Stop tracking a job (it ended)."""
        self._tracks.pop(job_id, None)

    def rescale(self, job_id: str, time: float, size: int, preempted: bool = False) -> None:
        """The job's world size becomes ``size`` at ``time`` (an order, or a reclaim)."""
        track = self._tracks.get(job_id)
        if track is None or size == track.expected:
            return
        old = track.expected
        track.expected = size
        track.segment = None
        if size == 0:
            track.pending_since = track.pending_kind = None
            return
        kind = "preempt" if preempted else "start" if old == 0 else "up" if size > old else "down"
        if track.pending_since is None:
            track.pending_since, track.pending_kind = time, kind
        elif track.pending_kind != kind:
            # Two changes before the job restarted once: the delay belongs to neither alone.
            track.pending_kind = "mixed"

    def report(self, event: ProgressReport) -> bool:
        """Take one report; ``True`` when it added a measured interval to its scale."""
        track = self._tracks.get(event.job_id)
        if track is None or track.expected == 0 or event.world_size != track.expected:
            return False
        seg = track.segment
        if seg is None:
            self._close_rescale(track, event.time)
            track.segment = _Segment(event.world_size, event.time, event.time, event.samples)
            return False
        dt = event.time - seg.last_t
        ds = event.samples - seg.last_samples
        if dt <= 0:
            return False
        if ds < 0:
            # The job went back to a checkpoint without a rescale: a new baseline.
            track.segment = _Segment(seg.size, event.time, event.time, event.samples)
            return False
        seg.last_t, seg.last_samples = event.time, event.samples
        seg.intervals.append((dt, ds))
        seg.win_dt += dt
        seg.win_ds += ds
        while len(seg.intervals) > 1 and seg.win_dt - seg.intervals[0][0] >= self.window_s:
            odt, ods = seg.intervals.popleft()
            seg.win_dt -= odt
            seg.win_ds -= ods
            seg.settled = True  # the interval right after the restart has left the window
        size = seg.size
        rate = seg.win_ds / seg.win_dt
        if event.time - seg.t0 >= self.window_s:  # seg.span_s (last_t is the event's time)
            track.full.add(size)
            track.rates[size] = rate
            track.version += 1
            if seg.settled:
                self._follow_drift(track, seg, rate)
        elif size not in track.full and len(seg.intervals) >= 2:
            # A first, partial estimate, without the interval that still holds the restart.
            first_dt, first_ds = seg.intervals[0]
            track.rates[size] = (seg.win_ds - first_ds) / (seg.win_dt - first_dt)
            track.version += 1
        return True

    @staticmethod
    def _follow_drift(track: _Track, seg: _Segment, rate: float) -> None:
        if seg.anchor is None:
            seg.anchor = rate
            seg.others = {k: v for k, v in track.rates.items() if k != seg.size}
            return
        if seg.anchor <= 0 or not seg.others:
            return
        ratio = rate / seg.anchor
        if abs(ratio - 1.0) <= DRIFT_THRESHOLD:
            ratio = 1.0
        if ratio == seg.followed:  # every report of a job that does not drift: nothing new
            if shortcuts.CHECKED:
                shortcuts.check("monitor.followed", {k: track.rates[k] for k in seg.others},
                                {k: base * ratio for k, base in seg.others.items()})
            return
        for k, base in seg.others.items():
            track.rates[k] = base * ratio
        seg.followed = ratio

    def _close_rescale(self, track: _Track, time: float) -> None:
        if track.pending_since is None:
            return
        cost = max(0.0, time - track.pending_since)
        if track.pending_kind == "up":
            track.up_s.append(cost)
            track.up_median = median(track.up_s)
            self._all_up.append(cost)
        elif track.pending_kind == "down":
            track.down_s.append(cost)
            track.down_median = median(track.down_s)
            self._all_down.append(cost)
        track.pending_since = track.pending_kind = None

    def throughput(self, job_id: str) -> dict[int, float]:
        """Measured throughput per scale (a copy)."""
        track = self._tracks.get(job_id)
        return dict(track.rates) if track else {}

    def provisional(self, job_id: str) -> set[int]:
        """Scales whose estimate rests on less than one full window (a partial average,
        e.g. an epoch cut short by a preemption): to be measured again when nodes allow."""
        track = self._tracks.get(job_id)
        return set(track.rates) - track.full if track else set()

    def full_count(self, job_id: str) -> int:
        """How many scales have an estimate over a full window (−1 for an unknown job); the
        set of such scales only grows while the job is tracked, so the count names it."""
        track = self._tracks.get(job_id)
        return len(track.full) if track else -1

    def top_scale(self, job_id: str) -> int:
        """The largest scale with a throughput estimate (0 for none)."""
        track = self._tracks.get(job_id)
        return max(track.rates) if track and track.rates else 0

    def version(self, job_id: str) -> int:
        """Grows whenever the job's throughput estimates change."""
        track = self._tracks.get(job_id)
        return track.version if track else -1

    def window_done(self, job_id: str, size: int, since: float) -> bool:
        """Whether a full window at ``size`` has been measured from a segment begun at or
        after ``since``."""
        track = self._tracks.get(job_id)
        seg = track.segment if track else None
        return (seg is not None and seg.size == size and seg.t0 >= since
                and seg.span_s >= self.window_s)

    def scale_up_s(self, job_id: str) -> float | None:
        """Median measured scale-up cost of the job, ``None`` before its first one."""
        track = self._tracks.get(job_id)
        return track.up_median if track else None

    def scale_down_s(self, job_id: str) -> float | None:
        """Median measured scale-down cost of the job, ``None`` before its first one."""
        track = self._tracks.get(job_id)
        return track.down_median if track else None

    def typical_costs(self) -> tuple[float | None, float | None]:
        """Median recent (scale-up, scale-down) costs over all jobs, ``None`` where unmeasured."""
        return (median(self._all_up) if self._all_up else None,
                median(self._all_down) if self._all_down else None)
