"""The node pool of one engine: which offered idle nodes are free, which job holds which,
when each hole ends, and the moves made during one re-plan.

Everything is kept incrementally (sets and dicts updated per node that changes), so an event
costs work in proportion to the nodes it names, not to the size of the pool.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable
from typing import Any

from ..events import IdleNode
from ..model import Node

Delta = tuple[int, set[str], set[str]]
"""A job's moves in the current re-plan: (nodes held before, nodes released, nodes taken)."""


@functools.lru_cache(maxsize=1 << 16)
def _open_node(name: str, group: str | None) -> Node:
    """A node whose hole has no known end: the same value at every re-plan (each re-plan
    hands every free node to placement; building them anew was 3 % of a what-if replay)."""
    return Node(name, group)


class NodePool:
    """Idle nodes offered to an engine, free or held, with their holes' ends."""

    def __init__(self) -> None:
        self.hole_end: dict[str, float | None] = {}
        self.group: dict[str, str | None] = {}
        self.free: set[str] = set()
        self.owner: dict[str, str] = {}
        self.held: dict[str, set[str]] = {}
        self.delta: dict[str, Delta] = {}
        self.since: dict[str, float] = {}

    def state_dict(self) -> dict[str, Any]:
        """The pool as plain data (sets as sorted lists); :meth:`load_state_dict` reads it."""
        return {"hole_end": dict(self.hole_end), "group": dict(self.group),
                "since": dict(self.since), "free": sorted(self.free), "owner": dict(self.owner),
                "held": {job: sorted(names) for job, names in self.held.items()},
                "delta": {job: [before, sorted(released), sorted(taken)]
                          for job, (before, released, taken) in self.delta.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state :meth:`state_dict` wrote (the held sets are new objects: a job's
        record takes its set again from :meth:`holding`)."""
        self.hole_end = {str(k): v for k, v in state["hole_end"].items()}
        self.group = {str(k): v for k, v in state["group"].items()}
        self.since = {str(k): float(v) for k, v in state["since"].items()}
        self.free = set(state["free"])
        self.owner = {str(k): str(v) for k, v in state["owner"].items()}
        self.held = {str(job): set(names) for job, names in state["held"].items()}
        self.delta = {str(job): (int(before), set(released), set(taken))
                      for job, (before, released, taken) in state["delta"].items()}

    def holding(self, job_id: str) -> set[str]:
        """The live set of nodes ``job_id`` holds (created empty on first use)."""
        return self.held.setdefault(job_id, set())

    def offer(self, nodes: Iterable[IdleNode], now: float | None = None) -> bool:
        """Take idle nodes (new ones become free, idle since ``now`` when given; known ones get
        their hole refreshed); ``True`` when at least one was new."""
        new = False
        for node in nodes:
            if node.name not in self.hole_end:
                new = True
                self.free.add(node.name)
                if now is not None:
                    self.since[node.name] = now
            self.hole_end[node.name] = node.hole_end
            self.group[node.name] = node.group
        return new

    def reclaim(self, names: Iterable[str]) -> dict[str, int]:
        """Forget nodes the batch system took back; returns job → nodes it lost."""
        hit: dict[str, int] = {}
        for name in names:
            if name not in self.hole_end:
                continue
            del self.hole_end[name]
            del self.group[name]
            self.since.pop(name, None)
            self.free.discard(name)
            job_id = self.owner.pop(name, None)
            if job_id is not None:
                self.held[job_id].discard(name)
                hit[job_id] = hit.get(job_id, 0) + 1
        return hit

    def drop(self, job_id: str, names: Iterable[str] | None = None) -> None:
        """Free nodes of a job without recording a move (the job ended, or lost a worker)."""
        mine = self.held.get(job_id, set())
        for name in list(mine if names is None else names):
            if self.owner.get(name) == job_id:
                del self.owner[name]
                mine.discard(name)
                self.free.add(name)

    # ------------------------------------------------------------- moves in a re-plan
    def _record(self, job_id: str) -> Delta:
        rec = self.delta.get(job_id)
        if rec is None:
            rec = self.delta[job_id] = (len(self.holding(job_id)), set(), set())
        return rec

    def assign(self, job_id: str, name: str) -> None:
        """Give a free node to a job."""
        _, released, taken = self._record(job_id)
        self.free.remove(name)
        self.owner[name] = job_id
        self.holding(job_id).add(name)
        if name in released:
            released.discard(name)
        else:
            taken.add(name)

    def release(self, job_id: str, name: str) -> None:
        """Take a node back from a job into the free set."""
        _, released, taken = self._record(job_id)
        self.held[job_id].remove(name)
        del self.owner[name]
        self.free.add(name)
        if name in taken:
            taken.discard(name)
        else:
            released.add(name)

    def take_delta(self) -> dict[str, Delta]:
        """The moves of this re-plan, and a fresh record for the next."""
        delta, self.delta = self.delta, {}
        return delta

    # ------------------------------------------------------------- lifetimes
    def remaining(self, name: str, now: float) -> float:
        """Seconds until the node's hole ends (infinite when no end is known)."""
        end = self.hole_end.get(name)
        return math.inf if end is None else max(0.0, end - now)

    def node(self, name: str, now: float) -> Node:
        end = self.hole_end.get(name)
        if end is None:
            return _open_node(name, self.group.get(name))
        return Node(name, self.group.get(name), max(0.0, end - now))

    def nodes(self, names: Iterable[str], now: float) -> list[Node]:
        """:meth:`node` of each name, in one loop: every re-plan that moves nodes hands
        placement every free node, hundreds of them on a large machine."""
        hole_end, group = self.hole_end, self.group
        out = []
        for name in names:
            end = hole_end.get(name)
            out.append(_open_node(name, group.get(name)) if end is None
                       else Node(name, group.get(name), max(0.0, end - now)))
        return out

    def longest_lived(self, names: Iterable[str], n: int, now: float) -> list[str]:
        return heapq.nsmallest(n, names, key=lambda m: (-self.remaining(m, now), m))

    def shortest_lived(self, names: Iterable[str], n: int, now: float) -> list[str]:
        return heapq.nsmallest(n, names, key=lambda m: (self.remaining(m, now), m))

    def by_time_limit(self, names: Iterable[str], now: float,
                      default_s: float) -> dict[float, list[str]]:
        """``names`` (in order) by the :meth:`time_limit` of each alone; a node without a hole
        end has ``default_s`` without the call (every node a grow names)."""
        ends = self.hole_end
        groups: dict[float, list[str]] = {}
        for name in names:
            limit = default_s if ends.get(name) is None else self.time_limit((name,), now,
                                                                              default_s)
            groups.setdefault(limit, []).append(name)
        return groups

    def time_limit(self, names: Iterable[str], now: float, default_s: float) -> float:
        """A grow's time limit: the shortest remaining hole among ``names``, at most the
        default."""
        return min([default_s] + [self.remaining(m, now) for m in names
                                  if self.hole_end.get(m) is not None])
