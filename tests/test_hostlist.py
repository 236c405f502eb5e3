"""Slurm hostlists: expand/fold round trips and refusal of what is not a hostlist."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.errors import ValidationError
from malletrain_core.hostlist import count, expand, fold

prefixes = st.sampled_from(["n", "node", "gpu-", "a1b", "x"])
names = st.builds(lambda p, i, w: f"{p}{i:0{w}d}", prefixes, st.integers(0, 5000),
                  st.sampled_from([1, 2, 3, 4]))


@pytest.mark.parametrize("text, expected", [
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("n[01-02,07],gpu3", ["gpu3", "n01", "n02", "n07"]),
    ("n05", ["n05"]),
    ("rack[1-2]n[1-2]", ["rack1n1", "rack1n2", "rack2n1", "rack2n2"]),
    ("", []), ("(null)", []), ("None", []),
])
def test_expand(text: str, expected: list[str]) -> None:
    assert expand(text) == expected
    assert count(text) == len(expected)


@pytest.mark.parametrize("names, expected", [
    (["n01", "n02", "n03", "n07"], "n[01-03,07]"),
    (["n07", "n01"], "n[01,07]"),
    (["gpu3"], "gpu3"),
    ([], ""),
])
def test_fold(names: list[str], expected: str) -> None:
    assert fold(names) == expected


@pytest.mark.parametrize("text", ["n[1-", "@compute", "n[1-4]!n2", "n1 n2", "n[1-4]&n[2-3]"])
def test_expand_refuses_what_slurm_never_prints(text: str) -> None:
    with pytest.raises(ValidationError, match="hostlist"):
        expand(text)


@pytest.mark.parametrize("bad", [["n[1-2]"], ["a,b"], [""], ["@g"]])
def test_fold_refuses_non_names(bad: list[str]) -> None:
    with pytest.raises(ValidationError):
        fold(bad)


@settings(max_examples=150, deadline=None)
@given(st.lists(names, min_size=1, max_size=40))
def test_fold_then_expand_is_the_sorted_set(sample: list[str]) -> None:
    folded = fold(sample)
    assert sorted(expand(folded)) == sorted(set(sample))
    assert count(folded) == len(set(sample))
    assert fold(expand(folded)) == folded


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=60, unique=True),
       st.sampled_from([2, 3, 4]))
def test_padded_ranges_keep_their_width(ids: list[int], width: int) -> None:
    sample = [f"n{i:0{width}d}" for i in ids]
    folded = fold(sample)
    assert set(expand(folded)) == set(sample)
    assert len(folded) <= sum(len(s) + 1 for s in sample) + 2
