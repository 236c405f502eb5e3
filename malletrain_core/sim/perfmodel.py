"""How a simulated training job progresses: its true curve, noise, rescale and preemption costs.

Two ledgers are kept. **Trained samples** are what the job really does and reports: after a
rescale or a preemption its workers restart, training nothing for (1 − ``warmup_share``) of the
rescale cost in seconds (``scale_up_s`` for a grow, ``scale_down_s`` for a shrink or a
preemption) and at half speed for twice the rest (the warm-up), so a restart costs exactly
that many seconds at the new rate; starting from 0 nodes is free. **Net samples** follow the
FreeTrain prototype's cost model, so figures compare with research/allocation.md: the
integral of the rate as if rescales were instant, minus ``cost × rate before`` per rescale.
Both ledgers also lose, on a preemption, the progress since the last checkpoint; checkpoints
are taken every ``checkpoint_interval_s`` of running and before every planned rescale
(``checkpoint_interval_s = 0``: after every step, the prototype's assumption). Throughput
carries multiplicative log-normal noise with mean 1, redrawn at every report.

The cost model (``PerfParams.rescale_cost``, :mod:`.costs`) says what a change costs. Under
``restart`` it is the above. Under ``inplace`` (and ``inplace-gpu``, the same with the GPU
figures) the survivors keep training: a grow keeps the old size running while the joiners start
(``joiner_start_s``), then pauses every member (``grow_pause_s``); a shrink or a preemption that
leaves survivors loses the step in flight (``lost_step_s`` at the rate before) and pauses
(``shrink_pause_s``/``preempt_pause_s``); no warm-up. Net samples are then charged exactly what
the change lost against an instant change, so net and trained samples agree; a change that
leaves no process alive is charged as under ``restart``.

In place, a joiner holds no state until its join: the model keeps the **members** (processes
that hold the job's state, or load it together at a start from the checkpoint) apart from the
joiners still starting, as the daemon does (a change is in place only while a member stays).
Losing a joiner before it joined costs the members nothing; losing every member while joiners
start rolls the job back to its checkpoint, and the joiners, once started, resume from it; a
grow while joiners start extends the join; a change does not cut short a start or a pause in
progress. The backend says which of the nodes that went were joiners.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .costs import DEFAULT_COST_MODEL, RescaleCosts, cost_model
from .workloads import SimJob


@dataclass(frozen=True)
class PerfParams:
    """Knobs of the performance model and of the simulated reporter."""

    noise: float = 0.03
    """σ of the log-normal throughput noise per report period (0: none)."""
    checkpoint_interval_s: float = 0.0
    """Periodic checkpoints while running; 0 checkpoints continuously (no rollback loss)."""
    warmup_share: float = 0.25
    """Share of a restart's cost paid at half speed after the stall."""
    report_fast_s: float = 10.0
    """Report period just after a (re)start, while the monitor measures the new scale."""
    report_slow_s: float = 300.0
    """Report period once the scale has run for ``fast_window_s``."""
    fast_window_s: float = 120.0
    rescale_cost: str = DEFAULT_COST_MODEL
    """The named cost model of :mod:`.costs` (``restart``, ``inplace`` or ``inplace-gpu``)."""

    @property
    def costs(self) -> RescaleCosts:
        return cost_model(self.rescale_cost)

    def __post_init__(self) -> None:
        cost_model(self.rescale_cost)  # a one-line error for an unknown name
        for name in ("noise", "checkpoint_interval_s", "fast_window_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be ≥ 0")
        if not 0 <= self.warmup_share <= 1:
            raise ValueError("warmup_share must lie in [0, 1]")
        if not (self.report_fast_s > 0 and self.report_slow_s > 0):
            raise ValueError("report periods must be > 0")


class JobModel:
    """One job's true progress; the simulator's backend drives it, the engine never sees it."""

    def __init__(self, spec: SimJob, params: PerfParams, rng: np.random.Generator) -> None:
        self.spec = spec
        self.params = params
        self.costs = params.costs
        self.rng = rng
        table = spec.curve.table(spec.max_nodes)
        table[:spec.min_nodes] = 0.0
        self._rates = table.tolist()
        self.world = 0
        self.t = spec.submit_time
        self.factor = 1.0
        self.progress = 0.0
        self.stall_until = self.t
        self.warm_until = self.t
        self.join_until = self.t
        self.prev_rate = 0.0
        self.members = 0
        """In place: the nodes whose processes hold the state (or load it together at a start);
        the other ``world − members`` are joiners, starting until ``join_until``."""
        self.members_from = self.t
        """While joiners start, the members train at ``prev_rate`` from here (after a pause)."""
        self._window = ""
        self.ckpt = 0.0
        self.ckpt_t = self.t
        self.restart_t = self.t
        self.epoch = 0
        self.ideal = 0.0
        self.charged = 0.0
        self.rolled_back = 0.0
        self.restored_loss = 0.0
        """Completed training undone by a restart from the checkpoint (a job's step logs show
        those steps twice); ``rolled_back`` also holds the steps in flight that were dropped."""
        self.restores = 0
        """Restarts from the checkpoint that undid completed training."""
        self.node_s = 0.0
        self.rescales = 0
        self.rescale_loss = 0.0
        self.preemptions = 0
        self.preemption_loss = 0.0
        self.done_time: float | None = None

    # -- rates and time ---------------------------------------------------------------------

    def true_rate(self, world: int | None = None) -> float:
        """The true mean throughput at ``world`` nodes (now: the current world size)."""
        k = self.world if world is None else world
        if k < len(self._rates):
            return self._rates[k]
        return self.spec.curve.at(k)

    def rate(self) -> float:
        return self.true_rate() * self.factor

    @property
    def restarting(self) -> bool:
        """Still in the stall after a rescale: the workers are not training yet."""
        return self.t < self.stall_until

    @property
    def net(self) -> float:
        """Net samples under the prototype's cost model."""
        return self.ideal - self.charged - self.rolled_back

    def _trained(self, t0: float, t1: float, r: float) -> float:
        """Samples trained between ``t0`` and ``t1`` at rate ``r`` after the change (over the
        seconds of full-speed training: a stall counts 0, the warm-up ½), plus the old size's
        rate while in-place joiners start (until ``join_until``). One function, not two: it
        runs once or twice per report, a million times in a month's replay."""
        old = max(0.0, min(t1, self.join_until) - max(t0, self.members_from)) * \
            self.prev_rate * self.factor
        warm_until = self.warm_until
        full = max(0.0, t1 - max(t0, warm_until))
        half = max(0.0, min(t1, warm_until) - max(t0, self.stall_until))
        return r * (full + half / 2) + old

    def _rate_now(self) -> float:
        """The true rate (noise aside) the job trains at this instant: the old size's while
        joiners start, 0 in a pause, else the current size's."""
        if self.t < self.join_until:
            return self.prev_rate if self.t >= self.members_from else 0.0
        if self.t < self.stall_until:
            return 0.0
        return self.true_rate()

    def advance(self, t: float) -> None:
        """Train from the last update up to ``t`` at the current scale."""
        dt = t - self.t
        if dt <= 0:
            return
        self.node_s += self.world * dt
        r = self.true_rate() * self.factor  # self.rate(), one call less per report
        if r > 0 or self.t < self.join_until:
            self.ideal += r * dt
            interval = self.params.checkpoint_interval_s
            if interval > 0:
                last = self.ckpt_t + interval * math.floor((t - self.ckpt_t) / interval)
                if last > self.t:
                    self.ckpt = self.progress + self._trained(self.t, last, r)
                    self.ckpt_t = last
            trained = self._trained(self.t, t, r)
            self.progress += trained
            if self.costs.inplace and self.t < self.stall_until:
                self._charge(r * dt - trained, self._window)
            if interval == 0:
                self.ckpt = self.progress
        self.t = t

    def time_to_progress(self, target: float) -> float:
        """Seconds from now until ``progress`` reaches ``target`` at the current rate (inf if
        it never does)."""
        need = target - self.progress
        if need <= 0:
            return 0.0
        r = self.rate()
        if r <= 0:
            return math.inf
        t = max(self.t, self.stall_until)
        warm_s = max(0.0, self.warm_until - t)
        if need <= r * warm_s / 2:
            return t - self.t + 2 * need / r
        return t - self.t + warm_s + (need - r * warm_s / 2) / r

    # -- what happens to the job ------------------------------------------------------------

    def redraw_noise(self) -> None:
        s = self.params.noise
        self.factor = float(np.exp(s * self.rng.standard_normal() - s * s / 2)) if s > 0 else 1.0

    def checkpoint(self, t: float) -> None:
        self.advance(t)
        self.ckpt = self.progress
        self.ckpt_t = t

    def _restart(self, t: float, world: int, cost_s: float) -> None:
        was_running = self.world > 0
        self.world = world
        self.epoch += 1
        self.restart_t = t
        self.ckpt_t = t
        self.join_until = t
        self.prev_rate = 0.0
        self.members = world
        self.members_from = t
        if was_running and world > 0:
            w = self.params.warmup_share
            self.stall_until = t + (1 - w) * cost_s
            self.warm_until = self.stall_until + 2 * w * cost_s
        else:
            self.stall_until = self.warm_until = t + (
                self._start_s(self.costs.cold_start_s) if world else 0.0)
        if self.costs.inplace:  # a new process's checkpoint period starts as it trains
            self.ckpt_t = self.stall_until

    def _start_s(self, fixed: float) -> float:
        """A start's seconds: ``fixed``, or one draw from each measured part (:mod:`.costs`)."""
        parts = self.costs.start_parts_s
        if not parts:
            return fixed
        return float(sum(part[int(self.rng.integers(len(part)))] for part in parts))

    def _hand_over(self, nodes: int, steps_charged: float) -> None:
        """``nodes`` taken back stop training ``handover_s`` before they go; ``steps_charged``
        seconds of that are already dropped as the step in flight. What the nodes trained in
        the rest is undone and never counted as trained (their step logs never had it)."""
        extra_s = self.costs.handover_s - steps_charged
        training = self._members() if self.costs.inplace else self.world
        if nodes <= 0 or extra_s <= 0 or training <= 0:
            return
        per_node = self._rate_now() * self.factor / training
        lost = min(self.progress, per_node * nodes * extra_s)
        self.progress -= lost
        self.ckpt = min(self.ckpt, self.progress)
        self.charged += lost
        self.preemption_loss += lost

    def _charge(self, samples: float, kind: str) -> None:
        """Charge ``samples`` lost to an in-place change to the net ledger."""
        self.charged += samples
        if kind == "preempt":
            self.preemption_loss += samples
        else:
            self.rescale_loss += samples

    def _lose_step(self, kind: str) -> None:
        """In place: the step in flight is dropped (at the rate trained at this instant)."""
        lost = min(self.progress, self._rate_now() * self.factor * self.costs.lost_step_s)
        self.progress -= lost
        self.ckpt = min(self.ckpt, self.progress)
        self.rolled_back += lost
        if kind == "preempt":
            self.preemption_loss += lost
        else:
            self.rescale_loss += lost

    def _members(self) -> int:
        """In place: the members now (every node once the joiners have joined)."""
        return self.members if self.t < self.join_until else self.world

    def joiners(self) -> int:
        """In place: the nodes still starting to join (no state yet)."""
        return self.world - self._members()

    def _in_place(self, t: float, world: int, kind: str, joiners_gone: int = 0) -> None:
        """An in-place change to ``world`` > 0 nodes while ``self.world`` > 0 and a member
        stays (see :mod:`.costs`): survivors keep their state; joiners start while members
        train; ``joiners_gone`` of the nodes that go had not joined yet."""
        c = self.costs
        joining = t < self.join_until
        members = self._members()
        if kind == "up":
            if not joining:  # the members train at their size, after a start or pause ends
                self.members = self.world
                self.prev_rate = self.true_rate(self.world)
                self.members_from = max(t, self.stall_until)
                self.join_until = self.members_from
            self.join_until = max(self.join_until, t + self._start_s(c.joiner_start_s))
            self.stall_until = self.join_until + c.grow_pause_s
        else:
            members_gone = self._members_gone(world, joiners_gone)
            left = members - members_gone
            # the members re-form; a start or a pause in progress is not cut short
            resume = max(t + (c.preempt_pause_s if kind == "preempt" else c.shrink_pause_s),
                         self.members_from if joining else self.stall_until)
            if members_gone > 0:
                self._lose_step(kind)
            else:  # only joiners went: the members go on as they were
                resume = self.members_from if joining else self.stall_until
            if joining and world > left:  # joiners still starting
                self.members, self.prev_rate = left, self.true_rate(left)
                self.members_from = resume
            else:
                self.prev_rate, self.members, self.stall_until = 0.0, world, resume
                self.join_until = self.members_from = t
        self.warm_until = self.stall_until
        self._window = kind
        self.world = world
        self.epoch += 1
        self.restart_t = t

    def _members_gone(self, world: int, joiners_gone: int) -> int:
        """Members among the nodes that go (down to ``world``; ``joiners_gone`` joiners)."""
        return self.world - world - (joiners_gone if self.t < self.join_until else 0)

    def _from_joiners(self, t: float, world: int) -> None:
        """Every member went while ``world`` joiners start: they start the job from its
        checkpoint together once started (a start from 0 nodes already under way)."""
        self.stall_until = self.warm_until = max(self.join_until, t)
        self.world = self.members = world
        self.members_from = self.join_until = self.restart_t = t
        self.ckpt_t = self.stall_until
        self.prev_rate = 0.0
        self.epoch += 1

    def _roll_back(self, r_before: float) -> None:
        """Back to the checkpoint: what was trained since is undone; the prototype's
        scale-down cost is charged at ``r_before``."""
        lost = self.progress - self.ckpt
        self.progress = self.ckpt
        self.rolled_back += lost
        self.restored_loss += lost
        self.restores += int(lost > 0)
        self.preemptions += 1
        cost = self.spec.scale_down_s
        self.charged += cost * r_before
        self.preemption_loss += lost + cost * r_before

    def rescale(self, t: float, world: int, joiners_gone: int = 0) -> None:
        """A planned change to ``world`` nodes: checkpoint, then restart at the new size (in
        place: survivors keep training, see :mod:`.costs`; ``joiners_gone`` of the nodes let
        go had not joined yet)."""
        if self.costs.inplace and self.world > 0 and world > 0:
            self.advance(t)
            if world == self.world:
                return
            self.rescales += 1
            if world > self.world or \
                    self._members_gone(world, joiners_gone) < self._members():
                self._in_place(t, world, "up" if world > self.world else "down",
                               joiners_gone)
            else:  # no member stays: saved first, then the joiners resume from it
                self.checkpoint(t)
                self._from_joiners(t, world)
            return
        self.checkpoint(t)
        if world == self.world:
            return
        r_before = self.rate()
        cost = self.spec.scale_up_s if world > self.world else self.spec.scale_down_s
        if r_before > 0:
            self.charged += cost * r_before
            self.rescale_loss += cost * r_before
            self.rescales += 1
        self._restart(t, world, cost)

    def preempt(self, t: float, world: int, joiners_gone: int = 0) -> None:
        """The batch system took nodes back (``joiners_gone`` of them had not joined yet):
        roll back to the checkpoint, restart the survivors (``world`` nodes, possibly 0); in
        place, the survivors go on while a member stays."""
        self.advance(t)
        if self.costs.inplace and world > 0:
            members_gone = self._members_gone(world, joiners_gone)
            if members_gone < self._members():  # a member stays
                self.preemptions += 1
                self._hand_over(members_gone, self.costs.lost_step_s)
                self._in_place(t, world, "preempt", joiners_gone)
                return
            self._hand_over(members_gone, 0.0)
            self._roll_back(self._rate_now() * self.factor)
            self._from_joiners(t, world)
            return
        self._hand_over((self._members() if self.costs.inplace else self.world) - world, 0.0)
        r_before = self.rate()
        self._roll_back(r_before)
        self._restart(t, world, self.spec.scale_down_s)

    def finish(self, t: float) -> None:
        self.advance(t)
        self.world = 0
        self.done_time = t
