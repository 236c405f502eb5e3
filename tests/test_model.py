"""The value model refuses what cannot be meant, naming the object and the field."""

from __future__ import annotations

import math

import numpy as np
import pytest

from malletrain_core.errors import ValidationError
from malletrain_core.model import (
    Constraints,
    Curve,
    Job,
    Node,
    Objective,
    Problem,
    Solution,
    objective_curve,
)

CURVE = Curve.of([1, 2, 4], [10.0, 18.0, 30.0])


def job(**kw: object) -> Job:
    fields: dict[str, object] = {"id": "j1", "max_nodes": 4, "curve": CURVE}
    fields.update(kw)
    return Job(**fields)  # type: ignore[arg-type]


class TestCurve:
    def test_interpolates_between_points_and_holds_flat_beyond(self) -> None:
        assert CURVE.at(0) == 0.0
        assert CURVE.at(3) == pytest.approx(24.0)
        assert CURVE.at(8) == 30.0
        assert CURVE.table(5).tolist() == pytest.approx([0.0, 10.0, 18.0, 24.0, 30.0, 30.0])

    def test_at_is_numpys_interp_bit_for_bit(self) -> None:
        """Curve.at does np.interp's arithmetic without it: replays must not move."""
        rng = np.random.default_rng(5)
        for _ in range(3000):
            nodes = np.sort(rng.choice(np.arange(1, 300), size=int(rng.integers(1, 9)),
                                       replace=False)).tolist()
            values = (rng.random(len(nodes)) * 10.0 ** rng.integers(-3, 12)).tolist()
            curve = Curve(tuple(nodes), tuple(values))
            for k in (*nodes, *rng.integers(-1, 320, 4).tolist(), *(rng.random(3) * 320)):
                want = 0.0 if k <= 0 else float(np.interp(k, (0, *nodes), (0.0, *values)))
                assert curve.at(k) == want, (nodes, values, k)

    def test_below_first_point_interpolates_to_origin(self) -> None:
        curve = Curve.of([4, 8], [40.0, 60.0])
        assert curve.at(2) == pytest.approx(20.0)

    def test_points_sorted_and_explicit_origin_dropped(self) -> None:
        curve = Curve.of([0, 4, 1], [0, 30, 10])
        assert curve.nodes == (1, 4)
        assert curve.throughput == (10.0, 30.0)

    def test_whole_floats_accepted_as_counts(self) -> None:
        assert Curve.of([1.0, 2.0], [1, 2]).nodes == (1, 2)

    @pytest.mark.parametrize(("nodes", "throughput", "field", "text"), [
        ([1, 2], [1.0], "curve", "2 node counts but 1 throughput"),
        ([1.5], [1.0], "curve.nodes", "not a whole node count"),
        ([True], [1.0], "curve.nodes", "not a whole node count"),
        ([-2], [1.0], "curve.nodes", "not positive"),
        ([1, 2, 2], [1.0, 2.0, 3.0], "curve.nodes", "[2] repeated"),
        ([1], [math.nan], "curve.throughput", "finite number"),
        ([1], [math.inf], "curve.throughput", "finite number"),
        ([1], [-1.0], "curve.throughput", "≥ 0"),
        ([1], ["fast"], "curve.throughput", "not a number"),
        ([0], [5.0], "curve.throughput", "at 0 nodes must be 0"),
        ([], [], "curve", "at least one point"),
    ])
    def test_bad_curves_name_the_field(self, nodes: list, throughput: list, field: str,
                                       text: str) -> None:
        with pytest.raises(ValidationError) as info:
            Curve.of(nodes, throughput, where="job 'resnet'")
        assert info.value.where == "job 'resnet'"
        assert info.value.field == field
        assert text in str(info.value)
        assert str(info.value).startswith("job 'resnet': ")

    def test_speedup_objective_divides_by_one_node_rate(self) -> None:
        speedup = objective_curve(CURVE, Objective.SPEEDUP)
        assert speedup.at(4) == pytest.approx(3.0)
        assert objective_curve(CURVE, Objective.THROUGHPUT) is CURVE

    def test_speedup_of_a_zero_curve_is_zero(self) -> None:
        zero = Curve.of([1, 2], [0.0, 0.0])
        assert objective_curve(zero, Objective.SPEEDUP).table(3).tolist() == [0.0] * 4


class TestJob:
    @pytest.mark.parametrize(("kw", "field", "text"), [
        ({"min_nodes": 5, "max_nodes": 4}, "max_nodes", "max_nodes 4 < min_nodes 5"),
        ({"min_nodes": 0}, "min_nodes", "must be ≥ 1"),
        ({"current_nodes": -1}, "current_nodes", "must be ≥ 0"),
        ({"max_nodes": 2.5}, "max_nodes", "not a whole number"),
        ({"min_nodes": True}, "min_nodes", "not a whole number"),
        ({"scale_up_s": -1.0}, "scale_up_s", "finite number of seconds ≥ 0"),
        ({"scale_down_s": math.nan}, "scale_down_s", "finite number of seconds ≥ 0"),
        ({"scale_down_s": math.inf}, "scale_down_s", "finite number of seconds ≥ 0"),
    ])
    def test_bad_fields_name_job_and_field(self, kw: dict, field: str, text: str) -> None:
        with pytest.raises(ValidationError) as info:
            job(**kw)
        assert info.value.where == "job 'j1'"
        assert info.value.field == field
        assert text in str(info.value)
        assert info.value.exit_code == 2

    def test_empty_id_refused(self) -> None:
        with pytest.raises(ValidationError, match="id: must be a non-empty string"):
            job(id="")

    def test_rate_is_zero_below_min_nodes_or_when_idle(self) -> None:
        assert job(current_nodes=0).rate() == 0.0
        assert job(min_nodes=2, current_nodes=1).rate() == 0.0
        assert job(current_nodes=2).rate() == 18.0
        assert job(current_nodes=4).rate(Objective.SPEEDUP) == pytest.approx(3.0)

    def test_numpy_integers_accepted(self) -> None:
        assert job(max_nodes=np.int64(4)).max_nodes == 4


class TestProblem:
    def test_repeated_job_ids_refused(self) -> None:
        with pytest.raises(ValidationError, match=r"jobs: job id\(s\) \['j1'\] repeated"):
            Problem(8, (job(), job()))

    def test_held_nodes_must_fit(self) -> None:
        with pytest.raises(ValidationError, match="hold 6 nodes now but only 5"):
            Problem(5, (job(current_nodes=3), job(id="j2", current_nodes=3)))

    def test_job_without_curve_refused(self) -> None:
        with pytest.raises(ValidationError) as info:
            Problem(5, (job(curve=None),))
        assert (info.value.where, info.value.field) == ("job 'j1'", "curve")

    @pytest.mark.parametrize("nodes", [-1, 2.0, True])
    def test_bad_node_count(self, nodes: object) -> None:
        with pytest.raises(ValidationError, match="problem: nodes"):
            Problem(nodes, ())  # type: ignore[arg-type]

    @pytest.mark.parametrize("lookahead", [-1.0, math.nan, math.inf])
    def test_bad_lookahead(self, lookahead: float) -> None:
        with pytest.raises(ValidationError, match="lookahead_s"):
            Problem(4, (), lookahead_s=lookahead)


class TestConstraints:
    def test_inactive_by_default(self) -> None:
        assert not Constraints().active
        assert Constraints(max_running_jobs=0).active
        assert Constraints(min_share=0.1).active
        assert Constraints(user_max_nodes={"ann": 3}).active

    @pytest.mark.parametrize(("kw", "field"), [
        ({"min_share": 1.5}, "min_share"),
        ({"min_share": -0.1}, "min_share"),
        ({"max_running_jobs": -1}, "max_running_jobs"),
        ({"user_max_nodes": {"ann": -2}}, "user_max_nodes.ann"),
        ({"user_max_nodes": {"ann": 1.5}}, "user_max_nodes.ann"),
    ])
    def test_bad_values(self, kw: dict, field: str) -> None:
        with pytest.raises(ValidationError) as info:
            Constraints(**kw)
        assert info.value.field == field


def test_node_refuses_negative_remaining_time() -> None:
    with pytest.raises(ValidationError, match="node 'n1': remaining_s"):
        Node("n1", remaining_s=-5.0)


def test_solution_dict_form() -> None:
    sol = Solution({"a": 3}, 12.5, "dp", 0.4)
    assert sol.to_dict() == {"allocation": {"a": 3}, "objective": 12.5, "solver": "dp",
                             "solve_ms": 0.4}
