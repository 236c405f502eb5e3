"""The rescale-cost models: exact losses per change, hand-computed, under each model; where
the in-place figures come from."""

from __future__ import annotations

import numpy as np
import pytest

from malletrain_core.errors import ConfigError
from malletrain_core.events import Grow, ProgressReport
from malletrain_core.model import Curve
from malletrain_core.sim import costs as cost_models
from malletrain_core.sim.backend import SimBackend
from malletrain_core.sim.costs import INPLACE, INPLACE_GPU, RESTART, RescaleCosts, cost_model
from malletrain_core.sim.perfmodel import JobModel, PerfParams
from malletrain_core.sim.policies import job_requests
from malletrain_core.sim.replay import replay
from malletrain_core.sim.sources import synthetic
from malletrain_core.sim.workloads import SimJob

CURVE = Curve.of([1, 2, 4], [10.0, 18.0, 30.0])


def _job(up: float = 20.0, down: float = 10.0) -> SimJob:
    return SimJob("j", "m", CURVE, 1, 4, up, down, None, 0.0)


def _model(rescale_cost: str) -> JobModel:
    params = PerfParams(noise=0.0, warmup_share=0.0, rescale_cost=rescale_cost)
    return JobModel(_job(), params, np.random.default_rng(0))


def _scenario(m: JobModel) -> list[tuple[float, float, float, float]]:
    """Start at 2, grow to 4, shrink to 2, lose one node, lose the last: (progress, net,
    rescale loss, preemption loss) 100 s after each change."""
    out = []
    m.rescale(0.0, 2)
    m.advance(100.0)
    out.append((m.progress, m.net, m.rescale_loss, m.preemption_loss))
    m.rescale(100.0, 4)
    m.advance(200.0)
    out.append((m.progress, m.net, m.rescale_loss, m.preemption_loss))
    m.rescale(200.0, 2)
    m.advance(300.0)
    out.append((m.progress, m.net, m.rescale_loss, m.preemption_loss))
    m.preempt(300.0, 1)
    m.advance(400.0)
    out.append((m.progress, m.net, m.rescale_loss, m.preemption_loss))
    m.preempt(400.0, 0)
    out.append((m.progress, m.net, m.rescale_loss, m.preemption_loss))
    return out


def test_inplace_figures_are_the_measured_ones() -> None:
    c = INPLACE  # bench/e2e.py's in-place medians under real Slurm (CPU, gloo)
    assert (c.joiner_start_s, c.grow_pause_s, c.shrink_pause_s, c.preempt_pause_s) == (
        7.3, 0.13, 0.20, 0.29)


def test_inplace_gpu_figures_are_sums_of_the_h100_measurements() -> None:
    """inplace.Elastic on one H100, world 1 (see costs.py): a planned re-form 0.034 s, an
    abandon 0.041 s, a joiner's first step 0.37 s, its start to ready 3.95 s."""
    c = INPLACE_GPU
    assert (cost_models.GPU_REFORM_S, cost_models.GPU_ABANDON_REFORM_S,
            cost_models.GPU_JOINER_FIRST_STEP_S, cost_models.GPU_JOINER_READY_S) == (
        0.034, 0.041, 0.37, 3.95)
    assert (c.grow_pause_s, c.shrink_pause_s, c.preempt_pause_s) == (0.404, 0.034, 0.041)
    assert (c.joiner_start_s, c.lost_step_s, c.first_report_s) == (3.95, 1.0, 2.0)
    assert c.inplace
    # the joiner's first step waits for the members: a GPU grow still pauses longer than a
    # CPU one; nothing waits for the old group's tear-down any more
    assert c.grow_pause_s > INPLACE.grow_pause_s
    assert c.shrink_pause_s < INPLACE.shrink_pause_s and c.preempt_pause_s < INPLACE.preempt_pause_s
    doc = cost_models.__doc__ or ""
    for text in ("H100", "torch 2.11.0+cu130", "NCCL 2.28.9", "bench.gpu", "0.034", "0.041",
                 "0.37", "3.95", "0.018", "11.5-s joiner"):
        assert text in doc, text


@pytest.mark.parametrize("costs", [INPLACE, INPLACE_GPU], ids=lambda c: c.name)
def test_inplace_losses_per_change_by_hand(costs: RescaleCosts) -> None:
    m = _model(costs.name)
    got = _scenario(m)
    # Start from 0 is free: 100 s at 18/s.
    assert got[0] == pytest.approx((1800.0, 1800.0, 0.0, 0.0))
    j, g, sp, pp = (costs.joiner_start_s, costs.grow_pause_s, costs.shrink_pause_s,
                    costs.preempt_pause_s)
    # Grow 2→4: the joiners start for j s while the members train at 18/s, then g s of
    # pause, then 30/s. inplace: against an instant change, 30 × 7.43 − 131.4 = 91.5.
    grow = 30 * (j + g) - 18 * j
    assert grow == pytest.approx({"inplace": 91.5, "inplace-gpu": 30 * 4.354 - 18 * 3.95}[
        costs.name])
    assert got[1] == pytest.approx((1800 + 18 * j + 30 * (100 - j - g), 4800 - grow, grow,
                                    0.0))
    # Planned shrink 4→2: the step in flight (1 s at 30/s) and the shrink pause at 18/s.
    shrink = 30.0 + 18 * sp
    p2 = got[1][0] - 30.0 + 18 * (100 - sp)
    assert got[2] == pytest.approx((p2, 6600 - grow - shrink, grow + shrink, 0.0))
    # One of two nodes preempted: the step in flight at 18/s and the preemption pause at 10/s.
    preempt = 18.0 + 10 * pp
    p3 = p2 - 18.0 + 10 * (100 - pp)
    assert got[3] == pytest.approx((p3, 7600 - grow - shrink - preempt, grow + shrink,
                                    preempt))
    # Every node lost: a restart from the disk checkpoint, charged Tcdw (10 s) at 10/s as
    # under restart; continuous checkpoints roll nothing back.
    assert got[4] == pytest.approx((p3, 7600 - grow - shrink - preempt - 100.0,
                                    grow + shrink, preempt + 100.0))
    assert m.rescales == 2 and m.preemptions == 2
    assert m.net == pytest.approx(m.progress - 100.0)  # only the disk restart is a convention


def test_restart_losses_per_change_by_hand() -> None:
    m = _model("restart")
    got = _scenario(m)
    assert got[0] == pytest.approx((1800.0, 1800.0, 0.0, 0.0))
    # Grow: Tcup 20 s at the rate before (18/s); the workers train nothing for 20 s.
    assert got[1] == pytest.approx((1800 + 30 * 80, 4800 - 360, 360, 0))
    # Shrink: Tcdw 10 s at 30/s.
    assert got[2] == pytest.approx((1800 + 2400 + 18 * 90, 6600 - 660, 660, 0))
    # One node preempted: Tcdw at 18/s.
    assert got[3] == pytest.approx((5820 + 10 * 90, 7600 - 840, 660, 180))
    # All lost: Tcdw at 10/s.
    assert got[4] == pytest.approx((6720, 7600 - 940, 660, 280))


def test_grow_keeps_the_old_size_training_until_the_joiners_are_ready() -> None:
    m = _model("inplace")
    m.rescale(0.0, 1)
    m.advance(10.0)
    m.rescale(10.0, 2)
    m.advance(16.0)                                   # joiner starting: members train on
    assert m.restarting and m.progress == pytest.approx(160.0)
    assert m.node_s == pytest.approx(10 + 2 * 6)      # the joiner's node is held
    m.advance(17.35)                                  # 17.3 … 17.43: the pause
    assert m.progress == pytest.approx(173.0)
    m.advance(18.0)
    assert not m.restarting and m.progress == pytest.approx(173.0 + 18 * 0.57)


def test_cost_models_are_named_and_declared() -> None:
    assert cost_model("restart") is RESTART and cost_model("inplace") is INPLACE
    assert cost_model("inplace-gpu") is INPLACE_GPU
    with pytest.raises(ConfigError, match="choose one of restart, inplace, inplace-gpu$"):
        cost_model("cheap")
    with pytest.raises(ConfigError):
        PerfParams(rescale_cost="cheap")
    assert RESTART.declared(18.0, 12.0) == (18.0, 12.0)
    assert INPLACE.declared(18.0, 12.0) == pytest.approx((7.43, 1.29))
    reqs = job_requests("freetrain-exact", [_job(18.0, 12.0)], 0, costs=INPLACE)
    assert (reqs[0].scale_up_s, reqs[0].scale_down_s) == pytest.approx((7.43, 1.29))
    assert INPLACE_GPU.declared(18.0, 12.0) == pytest.approx((4.354, 1.041))
    reqs = job_requests("freetrain-exact", [_job(18.0, 12.0)], 0, costs=INPLACE_GPU)
    assert (reqs[0].scale_up_s, reqs[0].scale_down_s) == pytest.approx((4.354, 1.041))


@pytest.mark.parametrize("costs", [INPLACE, INPLACE_GPU], ids=lambda c: c.name)
def test_first_report_comes_when_training_resumes_in_place(costs: RescaleCosts) -> None:
    """The monitor measures a change's cost up to the first report: 2 s after the pause."""
    tr = synthetic(nodes=4, days=0.05, seed=1, idle_fraction=0.99,
                   fragments=np.array([100000.0]))
    job = _job()
    backend = SimBackend(tr, [job], job_requests("freetrain-exact", [job], 0, costs=costs),
                         PerfParams(noise=0.0, rescale_cost=costs.name))
    t0 = backend.next_time()
    assert t0 is not None
    backend.poll(t0)
    names = sorted(backend.idle)[:2]
    backend.execute([Grow(job.id, (names[0],))], t0)          # a start: no pause
    first = _next_report(backend)
    assert (first.time, first.world_size) == (pytest.approx(t0 + 2.0), 1)
    backend.execute([Grow(job.id, (names[1],))], first.time)  # joiners' start, then the pause
    second = _next_report(backend)
    assert second.world_size == 2
    grow = {"inplace": 7.3 + 0.13, "inplace-gpu": 3.95 + 0.404}[costs.name]
    assert second.time == pytest.approx(first.time + grow + 2.0)


def _next_report(backend: SimBackend) -> ProgressReport:
    while True:
        t = backend.next_time()
        assert t is not None
        reports = [e for e in backend.poll(t) if isinstance(e, ProgressReport)]
        if reports:
            return reports[0]


def test_inplace_replay_keeps_net_at_most_ub_and_above_restart() -> None:
    tr = synthetic(nodes=12, days=0.15, seed=2, idle_fraction=0.4,
                   fragments=np.array([200, 400, 900, 1800, 3600]))
    jobs = [SimJob(f"j{i}", "m", Curve.of([1, 2, 4, 8], [100.0, 190.0, 350.0, 600.0]), 1, 8,
                   18.0, 12.0, None, 0.0) for i in range(3)]
    runs = {c: replay(tr, jobs, "freetrain-exact", seed=0,
                      params=PerfParams(noise=0.0, rescale_cost=c))
            for c in ("restart", "inplace", "inplace-gpu")}
    assert runs["inplace"].net_samples > runs["restart"].net_samples
    assert runs["inplace"].rescale_loss < runs["restart"].rescale_loss
    assert runs["inplace"].invalid_actions == 0
    # the GPU figures (a joiner ready in 3.9 s, nothing waiting for NCCL's tear-down) are
    # cheaper than the CPU nodes' 7.3-s joiner, and far below a restart per change
    gpu = runs["inplace-gpu"]
    assert runs["restart"].net_samples < runs["inplace"].net_samples < gpu.net_samples
    assert gpu.rescale_loss < runs["inplace"].rescale_loss < runs["restart"].rescale_loss
    assert gpu.invalid_actions == 0


def test_a_cold_start_costs_only_when_the_model_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every named model starts a job from 0 nodes for free; a model with ``cold_start_s``
    (bench/sim_to_real.py's, from a run's measured start-ups) trains nothing for that long,
    and charges it, after a start from 0 — the first and after losing every node."""
    assert all(c.cold_start_s == 0 for c in cost_models.COST_MODELS.values())
    cold = RescaleCosts("cold", inplace=True, joiner_start_s=7.3, cold_start_s=8.0)
    monkeypatch.setitem(cost_models.COST_MODELS, "cold", cold)
    m = _model("cold")
    m.rescale(0.0, 2)
    m.advance(10.0)
    assert m.node_s == 20.0 and m.progress == pytest.approx(2 * 18.0)
    assert m.net == pytest.approx(m.progress)
    m.preempt(10.0, 0)
    m.rescale(20.0, 1)
    m.advance(30.0)
    assert m.progress == pytest.approx(36.0 + 2 * 10.0)
    free = _model("inplace")
    free.rescale(0.0, 2)
    free.advance(10.0)
    assert free.progress == pytest.approx(10 * 18.0)


def test_measured_starts_are_drawn_and_a_node_taken_back_stops_before_it_goes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/sim_to_real.py's model: a start costs one draw from each measured part (here one
    value each, so 2 + 6 s), and each node the batch system takes back stops ``handover_s``
    before it goes, less the step in flight the survivors' re-form already drops."""
    assert all(not c.start_parts_s and c.handover_s == 0
               for c in cost_models.COST_MODELS.values())
    measured = RescaleCosts("drawn", inplace=True, lost_step_s=0.5, joiner_start_s=99.0,
                            cold_start_s=99.0, start_parts_s=((2.0,), (6.0,)), handover_s=1.5)
    monkeypatch.setitem(cost_models.COST_MODELS, "drawn", measured)
    m = _model("drawn")
    m.rescale(0.0, 2)
    m.advance(10.0)
    assert m.progress == pytest.approx(2 * 18.0)  # trained from 8 s, not 99
    m.rescale(10.0, 4)  # a joiner's start: 8 s at the old size, then 4 nodes
    m.advance(20.0)
    assert m.progress == pytest.approx(36.0 + 8 * 18.0 + 2 * 30.0)
    before = m.progress
    m.preempt(20.0, 3)  # one node taken back: (1.5 - 0.5) s of its quarter of 30/s lost
    assert before - m.progress == pytest.approx(1.0 * 30.0 / 4 + 0.5 * 30.0)
    assert m.net == pytest.approx(m.ideal - m.charged - m.rolled_back)
    m.advance(30.0)
    kept = m.progress
    m.preempt(30.0, 0)  # every node: each stopped 1.5 s early (checkpoints continuous here,
    # so nothing more rolls back)
    assert m.progress == pytest.approx(kept - 3 * 1.5 * 24.0 / 3) and m.restored_loss == 0
    with pytest.raises(ValueError, match="start part"):
        RescaleCosts("bad", inplace=True, start_parts_s=((),))


def _timed(monkeypatch: pytest.MonkeyPatch, checkpoint_s: float = 0.0) -> JobModel:
    """In place with fixed, round starts: a start from 0 nodes 4 s, a joiner's 6 s."""
    costs = RescaleCosts("timed", inplace=True, grow_pause_s=0.5, shrink_pause_s=0.5,
                         preempt_pause_s=1.0, lost_step_s=1.0, joiner_start_s=6.0,
                         cold_start_s=4.0)
    monkeypatch.setitem(cost_models.COST_MODELS, "timed", costs)
    params = PerfParams(noise=0.0, warmup_share=0.0, rescale_cost="timed",
                        checkpoint_interval_s=checkpoint_s)
    return JobModel(_job(), params, np.random.default_rng(0))


def test_a_joiner_lost_before_it_joined_costs_the_members_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A joiner holds no state and is not in the group yet: taken back while it starts, the
    members neither drop a step nor pause (they were never told of it)."""
    m = _timed(monkeypatch)
    m.rescale(0.0, 2)
    m.advance(10.0)                        # 6 s at 18/s after the 4-s start
    m.rescale(10.0, 3)                     # a joiner starts until 16; 2 members train on
    assert m.joiners() == 1
    m.preempt(12.0, 2, joiners_gone=1)
    assert m.joiners() == 0 and m.rolled_back == 0.0
    m.advance(20.0)
    assert m.progress == pytest.approx(16 * 18.0)
    # the same node lost after the join is a member: a step in flight and a pause
    m.rescale(20.0, 3)
    m.advance(30.0)                        # joined at 26, paused until 26.5, then 3 nodes
    m.preempt(30.0, 2)
    assert m.rolled_back == pytest.approx(CURVE.at(3))


def test_losing_every_member_while_joiners_start_rolls_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon changes in place only while a member stays: with every member gone the
    joiners, once started, resume from the checkpoint (the job's state was in the members'
    memory), as after a loss of every node; nothing trains until their start is over."""
    m = _timed(monkeypatch, checkpoint_s=10.0)
    m.rescale(0.0, 1)                      # trains from 4; the period starts there: 14, 24
    m.advance(20.0)
    assert m.ckpt == pytest.approx(10 * 10.0)
    m.rescale(20.0, 2)                     # a joiner starts until 26
    m.preempt(22.0, 1)                     # the member goes: back to the checkpoint
    assert m.progress == pytest.approx(100.0) and m.restores == 1
    assert m.restored_loss == pytest.approx(8 * 10.0)
    assert m.world == 1 and m.joiners() == 0
    m.advance(26.0)
    assert m.progress == pytest.approx(100.0)  # the joiner's start was not cut short
    m.advance(30.0)
    assert m.progress == pytest.approx(100.0 + 4 * 10.0)
    # a planned shrink that keeps only joiners saves first: nothing rolls back
    m.rescale(30.0, 2)
    m.rescale(31.0, 1, joiners_gone=0)
    assert m.restores == 1 and m.ckpt == pytest.approx(m.progress)


def test_a_change_does_not_cut_a_start_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node lost while a job starts from 0 leaves the others starting (their start is not
    replaced by a re-form's pause); a grow while joiners start extends the join, and the
    members train at their size meanwhile."""
    m = _timed(monkeypatch)
    m.rescale(0.0, 2)
    m.preempt(1.0, 1)
    m.advance(4.0)
    assert m.progress == 0.0
    m.advance(10.0)
    assert m.progress == pytest.approx(6 * 10.0)
    m.rescale(10.0, 2)                     # a joiner until 16
    m.rescale(12.0, 3)                     # another until 18: one join at 18
    m.advance(18.0)
    assert m.progress == pytest.approx(60.0 + 8 * 10.0)
    m.advance(20.0)
    assert m.progress == pytest.approx(140.0 + 1.5 * CURVE.at(3))


def test_the_backend_tells_which_lost_nodes_were_joining(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SimBackend passes the joiners among the nodes that go; in place an engine's
    Checkpoint order saves nothing (the epoch coordinator saves only before a change that
    cannot be in place)."""
    from malletrain_core.events import Checkpoint, Shrink
    _timed(monkeypatch)
    trace = synthetic(nodes=4, days=0.05, seed=1, idle_fraction=0.99,
                      fragments=np.array([100000.0]))
    backend = SimBackend(trace, [_job()], job_requests("freetrain-exact", [_job()], 0,
                                                         costs=INPLACE),
                         PerfParams(noise=0.0, rescale_cost="timed", checkpoint_interval_s=60.0))
    t = backend.next_time()
    assert t is not None
    backend.poll(t)
    names = sorted(backend.idle)[:3]
    backend.execute([Grow("j", (names[0],))], t)
    backend.execute([Grow("j", (names[1], names[2]))], t + 10.0)
    m = backend.models["j"]
    assert m.joiners() == 2 and backend.joining["j"] == {names[1], names[2]}
    backend.execute([Shrink("j", (names[1],))], t + 11.0)
    assert m.rolled_back == 0.0 and m.world == 2 and m.joiners() == 1
    before = m.ckpt
    backend.execute([Checkpoint("j")], t + 12.0)
    assert m.ckpt == before
