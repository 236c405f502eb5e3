"""The in-place group's lifecycle: every move of the table is allowed, any other is refused
with both states named (quick: no process, no torch)."""

from __future__ import annotations

import pytest

from malletrain_core.errors import MalleTrainError
from malletrain_core.worker import inplace
from malletrain_core.worker.inplace.lifecycle import TRANSITIONS, GroupState, Lifecycle

ALLOWED = sorted(((a, b) for a, targets in TRANSITIONS.items() for b in targets),
                 key=lambda p: (p[0].name, p[1].name))
REFUSED = sorted(((a, b) for a in GroupState for b in GroupState if b not in TRANSITIONS[a]),
                 key=lambda p: (p[0].name, p[1].name))


@pytest.mark.parametrize(("before", "after"), ALLOWED, ids=lambda s: s.name)
def test_every_move_of_the_table_is_allowed(before: GroupState, after: GroupState) -> None:
    life = Lifecycle(before)
    life.to(after)
    assert life.state is after


@pytest.mark.parametrize(("before", "after"), REFUSED, ids=lambda s: s.name)
def test_a_move_outside_the_table_is_refused_naming_both_states(before: GroupState,
                                                                after: GroupState) -> None:
    life = Lifecycle(before)
    with pytest.raises(inplace.LifecycleError) as err:
        life.to(after)
    assert f"from {before.name} to {after.name}" in str(err.value)
    assert "\n" not in str(err.value)
    assert life.state is before  # a refused move changes nothing


def test_the_table_covers_every_state_and_every_state_can_close() -> None:
    assert set(TRANSITIONS) == set(GroupState)
    assert all(GroupState.CLOSED in targets for targets in TRANSITIONS.values())
    assert TRANSITIONS[GroupState.CLOSED] == {GroupState.CLOSED}
    assert issubclass(inplace.LifecycleError, MalleTrainError)
    assert issubclass(inplace.LifecycleError, RuntimeError)


def test_the_paths_elastic_takes() -> None:
    """Start, a planned re-form, an in-step re-form that keeps its step, one that fails and
    is retried at the boundary, close; and the restart path (torchrun's group, formed once)."""
    life = Lifecycle()
    assert life.state is GroupState.NEW and not life.holding_step
    for state in (GroupState.FORMING, GroupState.TRAINING, GroupState.REFORMING,
                  GroupState.TRAINING, GroupState.HOLDING_STEP):
        life.to(state)
    assert life.holding_step
    for state in (GroupState.TRAINING, GroupState.HOLDING_STEP, GroupState.REFORMING,
                  GroupState.TRAINING, GroupState.CLOSED, GroupState.CLOSED):
        life.to(state)
    assert life.closed
    once = Lifecycle()
    once.to(GroupState.TRAINING)
    with pytest.raises(inplace.LifecycleError, match="from TRAINING to FORMING"):
        once.to(GroupState.FORMING)
