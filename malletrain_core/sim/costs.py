"""What a membership change costs a simulated job: the named rescale-cost models.

Every figure the simulator charges for a grow, a shrink or a preemption lives here, in one
:class:`RescaleCosts` per model, so a figure is changed in one place and results.json names the
model it ran under (``perf_model.rescale_cost``).

``restart`` — the restart-per-epoch path (and the FreeTrain prototype's cost model): every
change stops every worker and restarts them from the disk checkpoint. A grow costs the job's
profiled scale-up time ``Tcup`` (≈ 18 s in the ImageNet profiles), a shrink or a preemption its
scale-down time ``Tcdw`` (≈ 12 s), charged at the rate before the change.

``inplace`` — the in-place path (``malletrain-run --inplace``, :mod:`malletrain_core.worker.inplace`):
survivors keep their processes and state and re-form the group. The figures are the ones
``bench/e2e.py`` measured on a real Slurm cluster (BENCHMARKS.md, "End to end", in place and
restart side by side: a 1–4-node job under ``malletrain-run --inplace`` driven by the daemon,
torch 2.13 CPU, gloo, 2 shared cores, medians of the members' pauses):

* ``grow_pause_s`` 0.13 s — members' pause on a grow (3 → 4, 2 → 4);
* ``shrink_pause_s`` 0.20 s — a planned shrink (4 → 2);
* ``preempt_pause_s`` 0.29 s — Slurm preempting one node (4 → 3);
* ``lost_step_s`` 1.0 s — the step in flight, lost on a shrink and on a preemption that leaves
  survivors. The measured runs lost no completed step (a planned shrink stops at a step
  boundary, a preempted peer's step is dropped and run again); the model charges one step
  anyway, and the profiles carry no step time, so one step is taken as 1 s at the rate before
  the change;
* ``joiner_start_s`` 7.3 s — node idle → training at the larger size measured 7.4 s (median of
  6 grows: Slurm starting the task, torch's import, the check-in), less the grow pause; the
  members keep training at the old size meanwhile: the joiner's node is held but not
  productive. (The loopback figures this model used before: grow 0.62 s, shrink and preemption
  0.06 s, joiner 5.0 s.)
* ``first_report_s`` 2.0 s — the first progress report after a change comes this long after
  training resumes (the worker's report interval, ``training.Session(report_interval_s=2.0)``),
  so the engine's monitor, which measures a change's cost as the time from the order to the
  first report at the new size, sees joiner start + pause + report delay (≈ 9.4 s for a grow).

``inplace-gpu`` — the same in-place path on GPU nodes (``Elastic(..., backend="nccl")``), as it
is now: the old group let go in a thread beside the next one (``inplace._Retiring``) and a
joiner that never imports ``torch._dynamo`` (``worker.startup``). The figures are what
``python -m bench.gpu`` measured of ``inplace.Elastic`` itself on one H100 (torch 2.11.0+cu130,
NCCL 2.28.9, world 1, 28 November 2026; BENCHMARKS.md, section GPU). One GPU means world 1
only: re-forms of larger NCCL groups and a hand-over between GPUs were not measured:

* ``grow_pause_s`` 0.40 s — a planned re-form 0.034 s (the median pause of 120 re-forms less
  their wait for the last group's let-go, which re-forms seconds apart do not meet) + the
  joiner's first step 0.37 s (the members wait for it in that step's all-reduce);
* ``shrink_pause_s`` 0.034 s — the same re-form, no joiner;
* ``preempt_pause_s`` 0.041 s — an ``abandon`` re-form that found the last group let go (one
  such re-form measured; the side-group primitive with the abort in a thread: 0.018 s);
* ``lost_step_s`` 1.0 s — as under ``inplace`` (the profiles carry no step time);
* ``joiner_start_s`` 3.95 s — a joiner's process from its start to ready (the median of three;
  ``import torch`` 3.5-3.7 s of it), with no ``import torch._dynamo`` (4.1 s more when torch
  starts it); ``ready`` is written once model and optimizer exist, before any step, so the
  first step is charged in the grow pause above; the batch system's start of the task (about
  0.5 s under Slurm here) is not in it;
* ``first_report_s`` 2.0 s — the worker's report interval, as under ``inplace``.

So the engine measures a grow at ≈ 6.4 s (3.95 + 0.40 + 2) and a shrink at ≈ 3.0 s
(1.0 + 0.041 + 2). (Before, derived from the pieces of a first GPU pass: grow 0.49 s after a
3.9-s joiner, shrink and preemption 0.053 s; the first GPU pass itself, with the old group
destroyed on the critical path and the joiner importing ``torch._dynamo``: grow 1.56 s after an
11.5-s joiner, shrink 0.56 s, preemption 1.01 s.)

Under ``inplace`` and ``inplace-gpu`` a change that leaves no process alive — a preemption that
takes every node of a job, or a shrink to 0 — still costs a restart from the disk checkpoint,
charged as under ``restart`` (``Tcdw`` at the rate before, plus what rolls back to the
checkpoint). Starting a job from 0 nodes is free under every model. A joiner holds no state
until it joins: losing every member while joiners start is such a change too (see
:mod:`.perfmodel`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class RescaleCosts:
    """One cost model; ``inplace`` False means: restart every worker (the job's Tcup/Tcdw)."""

    name: str
    inplace: bool
    grow_pause_s: float = 0.0
    shrink_pause_s: float = 0.0
    preempt_pause_s: float = 0.0
    lost_step_s: float = 0.0
    joiner_start_s: float = 0.0
    first_report_s: float | None = None
    """Delay of the first report after training resumes; ``None``: the report cadence."""
    cold_start_s: float = 0.0
    """A start from 0 nodes: seconds before the first process trains (0: free, as in the
    FreeTrain prototype and every named model here; ``bench/sim_to_real.py`` sets the start-up
    it measured, since a job that lost every node restarts its processes)."""
    start_parts_s: tuple[tuple[float, ...], ...] = ()
    """Measured starts instead of the two fixed figures above: a joiner's start and a start
    from 0 nodes each cost one draw (from the job's random stream) from every tuple, summed.
    ``bench/sim_to_real.py`` gives the run's grant delays and its workers' start-ups, since a
    job that loses every node soon after a short start has trained by then and one after a
    long start has not. Empty (every named model): the fixed figures."""
    handover_s: float = 0.0
    """A node the batch system takes back stops training this long before it goes (the step in
    flight, then the kill before the next job starts); the survivors' step in flight is
    ``lost_step_s``. 0 in every named model; ``bench/sim_to_real.py`` gives the run's mean."""

    def __post_init__(self) -> None:
        if any(not part or min(part) < 0 for part in self.start_parts_s) or self.handover_s < 0:
            raise ValueError(f"cost model {self.name!r}: every start part needs at least one "
                             "draw, none negative, and handover_s must be >= 0")

    def declared(self, scale_up_s: float, scale_down_s: float) -> tuple[float, float]:
        """(scale-up, scale-down) seconds a user who knows this model declares for a job whose
        restart costs are ``scale_up_s``/``scale_down_s``: from the order to training at the
        new size."""
        if not self.inplace:
            return scale_up_s, scale_down_s
        return (self.joiner_start_s + self.grow_pause_s,
                self.lost_step_s + max(self.shrink_pause_s, self.preempt_pause_s))


RESTART = RescaleCosts("restart", inplace=False)
INPLACE = RescaleCosts("inplace", inplace=True, grow_pause_s=0.13, shrink_pause_s=0.20,
                       preempt_pause_s=0.29, lost_step_s=1.0, joiner_start_s=7.3,
                       first_report_s=2.0)
# inplace.Elastic on one H100 (torch 2.11.0+cu130, NCCL 2.28.9), world 1, by bench/gpu.py;
# see the module docstring.
GPU_REFORM_S = 0.034          # a planned re-form's pause (the old group let go beside it)
GPU_ABANDON_REFORM_S = 0.041  # an abandon re-form's pause (the abort in a thread)
GPU_JOINER_FIRST_STEP_S = 0.37  # a joiner's first step; the members wait for it
GPU_JOINER_READY_S = 3.95     # process start -> ready without torch._dynamo (7.9 s with it)
INPLACE_GPU = RescaleCosts(
    "inplace-gpu", inplace=True,
    grow_pause_s=round(GPU_REFORM_S + GPU_JOINER_FIRST_STEP_S, 3),
    shrink_pause_s=GPU_REFORM_S, preempt_pause_s=GPU_ABANDON_REFORM_S,
    lost_step_s=1.0, joiner_start_s=GPU_JOINER_READY_S, first_report_s=2.0)
COST_MODELS = {c.name: c for c in (RESTART, INPLACE, INPLACE_GPU)}
DEFAULT_COST_MODEL = RESTART.name


def cost_model(name: str) -> RescaleCosts:
    """The named cost model, or a one-line error naming the choices."""
    try:
        return COST_MODELS[name]
    except KeyError:
        raise ConfigError(f"--rescale-cost {name!r}: choose one of "
                          f"{', '.join(COST_MODELS)}") from None
