"""Placement by the keep rule: which node names each job ends up on."""

from __future__ import annotations

import pytest

from malletrain_core.allocator import place
from malletrain_core.errors import ValidationError
from malletrain_core.model import Node


def test_growing_job_keeps_its_nodes_and_takes_free_ones() -> None:
    result = place({"a": 3}, {"a": ["n1"]}, [Node("n2"), Node("n3"), Node("n4")])
    assert "n1" in result["a"] and len(result["a"]) == 3


def test_shrinking_job_releases_shortest_lived_nodes_first() -> None:
    known = {"n1": Node("n1", remaining_s=50.0), "n2": Node("n2", remaining_s=5000.0),
             "n3": Node("n3", remaining_s=None)}
    result = place({"a": 2}, {"a": ["n1", "n2", "n3"]}, [], known)
    assert result["a"] == ("n2", "n3")


def test_released_nodes_go_to_growing_jobs() -> None:
    result = place({"a": 1, "b": 3}, {"a": ["n1", "n2", "n3"], "b": ["n4"]}, [])
    assert len(result["a"]) == 1 and set(result["a"]) < {"n1", "n2", "n3"}
    assert set(result["b"]) == {"n1", "n2", "n3", "n4"} - set(result["a"])


def test_growing_job_prefers_longest_remaining_idle_time() -> None:
    free = [Node("short", remaining_s=60.0), Node("long", remaining_s=7200.0),
            Node("unknown"), Node("mid", remaining_s=600.0)]
    assert place({"a": 2}, {}, free)["a"] == ("long", "unknown")


def test_growing_job_takes_the_smallest_group_that_fits() -> None:
    free = [Node("a1", "g1"), Node("b1", "g2"), Node("b2", "g2"), Node("b3", "g2"),
            Node("a2", "g1"), Node("c1", "g3")]
    assert place({"j": 2}, {}, free)["j"] == ("a1", "a2")


def test_need_larger_than_any_group_spans_fewest_groups() -> None:
    free = [Node("a1", "g1"), Node("b1", "g2"), Node("b2", "g2"), Node("b3", "g2"),
            Node("c1", "g3")]
    got = place({"j": 4}, {}, free)["j"]
    assert {"b1", "b2", "b3"} < set(got)


def test_growing_job_prefers_its_own_group() -> None:
    known = {"a0": Node("a0", "g1")}
    free = [Node("a1", "g1"), Node("b1", "g2"), Node("b2", "g2")]
    assert set(place({"j": 2}, {"j": ["a0"]}, free, known)["j"]) == {"a0", "a1"}


def test_job_at_zero_disappears() -> None:
    assert place({"a": 0}, {"a": ["n1"]}, []) == {}


def test_node_both_free_and_held_is_refused() -> None:
    with pytest.raises(ValidationError, match="both free and held"):
        place({"a": 2}, {"a": ["n1"]}, [Node("n1")])


def test_not_enough_nodes_is_refused() -> None:
    with pytest.raises(ValidationError, match="3 nodes needed but only 2 free"):
        place({"a": 4}, {"a": ["n1"]}, [Node("n2"), Node("n3")])
