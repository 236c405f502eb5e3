"""The lifecycle of a training process's group: one enum, its transitions in one table.

A process in place forms a group for its first membership, trains on it, and re-forms a new
one at each change: between steps (a planned grow or shrink, or a peer lost in the step
agreement), or inside a step whose all-reduce lost a peer, keeping that step's gradients.
:class:`Lifecycle` is the one place that moves between these states, and refuses a move the
table does not allow (:class:`LifecycleError`): a re-form that starts while another runs, a
step trained on a group that was never formed, show up there and not as a hang later.
"""

from __future__ import annotations

import enum

from ...errors import MalleTrainError


class GroupState(enum.Enum):
    """Where a process stands with its group."""

    NEW = "new"
    """Made, not started: no group yet."""
    FORMING = "forming"
    """Forming the first group: meeting at the store, the group's init, the state's hand-over
    (from a member, or the last checkpoint)."""
    TRAINING = "training"
    """The group is formed and steps run on it."""
    REFORMING = "reforming"
    """Re-forming between steps: a planned change, or a peer lost in the step agreement."""
    HOLDING_STEP = "holding-step"
    """Re-forming inside a step after a peer was lost in its all-reduce, the step's gradients
    kept: the step completes on the new group if every member holds them."""
    CLOSED = "closed"
    """Left: threads stopped, the group let go (or the process leaves at once)."""


TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    # without a control folder torchrun's group is formed once, as the process starts
    GroupState.NEW: frozenset({GroupState.FORMING, GroupState.TRAINING, GroupState.CLOSED}),
    GroupState.FORMING: frozenset({GroupState.TRAINING, GroupState.CLOSED}),
    GroupState.TRAINING: frozenset({GroupState.REFORMING, GroupState.HOLDING_STEP,
                                    GroupState.CLOSED}),
    GroupState.REFORMING: frozenset({GroupState.TRAINING, GroupState.CLOSED}),
    # an in-step re-form that failed on a lost peer drops the step; the next re-form, inside
    # the next step or at its boundary, starts from here
    GroupState.HOLDING_STEP: frozenset({GroupState.TRAINING, GroupState.HOLDING_STEP,
                                        GroupState.REFORMING, GroupState.CLOSED}),
    GroupState.CLOSED: frozenset({GroupState.CLOSED}),  # close() may be called again
}
"""The moves allowed from each state; every state may close (a process leaves from
anywhere: told to, or past a bound)."""


class LifecycleError(MalleTrainError, RuntimeError):
    """A move between two states that :data:`TRANSITIONS` does not allow."""


class Lifecycle:
    """The current :class:`GroupState` of one process, moved only by :meth:`to`."""

    def __init__(self, state: GroupState = GroupState.NEW) -> None:
        self.state = state

    def to(self, new: GroupState) -> None:
        """Move to ``new``; :class:`LifecycleError` naming both states if not allowed."""
        if new not in TRANSITIONS[self.state]:
            allowed = ", ".join(s.name for s in sorted(TRANSITIONS[self.state],
                                                       key=lambda s: s.name))
            raise LifecycleError(f"the group cannot go from {self.state.name} to {new.name} "
                                 f"(from {self.state.name}: {allowed}); call steps() once, "
                                 "and nothing after close()")
        self.state = new

    @property
    def holding_step(self) -> bool:
        """Whether a re-form inside a step is under way (its gradients kept)."""
        return self.state is GroupState.HOLDING_STEP

    @property
    def closed(self) -> bool:
        return self.state is GroupState.CLOSED

