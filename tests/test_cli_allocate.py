"""``malletrain allocate`` run in-process: table, JSON, stdin, and every kind of bad file."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest

from malletrain_core.allocator.problem_io import problem_from_dict, problem_to_dict
from malletrain_core.cli import main

WriteJson = Callable[..., str]

CURVE = {"nodes": [1, 2, 4, 8], "throughput": [100.0, 190.0, 350.0, 600.0]}


def problem(**top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "nodes": 12, "lookahead_s": 120, "objective": "throughput",
        "jobs": [
            {"id": "j1", "min_nodes": 1, "max_nodes": 8, "current_nodes": 3, "owner": "ann",
             "curve": CURVE, "scale_up_s": 18, "scale_down_s": 12},
            {"id": "j2", "min_nodes": 2, "max_nodes": 8, "current_nodes": 0, "owner": "bob",
             "curve": {"nodes": [1, 8], "throughput": [50.0, 400.0]}},
        ]}
    doc.update(top)
    return doc


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["allocate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table(capsys: pytest.CaptureFixture[str], write_json: WriteJson) -> None:
    code, out, err = run(capsys, "--input", write_json(problem()))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["JOB", "MIN", "MAX", "CURRENT", "NEW", "CHANGE"]
    # 12 nodes: j1 grows 3 → 8 (600/s, losing 18 s at 270/s), j2 starts on 4 (200/s).
    assert lines[1].split() == ["j1", "1", "8", "3", "8", "+5"]
    assert lines[2].split() == ["j2", "2", "8", "0", "4", "+4"]
    assert lines[3].startswith("objective 91140 (throughput, look-ahead 120 s); "
                               "12 of 12 nodes; solver dp ")


def test_noheader(capsys: pytest.CaptureFixture[str], write_json: WriteJson) -> None:
    code, out, _ = run(capsys, "--input", write_json(problem()), "--noheader")
    assert code == 0 and out.splitlines()[0].split()[0] == "j1"


@pytest.mark.parametrize("solver", ["dp", "milp", "pernode"])
def test_json_for_every_solver(capsys: pytest.CaptureFixture[str], write_json: WriteJson,
                               solver: str) -> None:
    code, out, _ = run(capsys, "-i", write_json(problem()), "--solver", solver, "--json")
    assert code == 0
    record = json.loads(out)
    assert record["allocation"] == {"j1": 8, "j2": 4}
    assert record["objective"] == pytest.approx(120 * 800 - 18 * 270)
    assert record["solver"] == solver and record["status"] == "optimal"
    assert record["solve_ms"] >= 0


def test_constraints_switch_to_milp(capsys: pytest.CaptureFixture[str],
                                    write_json: WriteJson) -> None:
    doc = problem(constraints={"user_max_nodes": {"ann": 4}, "max_running_jobs": 2})
    code, out, _ = run(capsys, "-i", write_json(doc), "--json")
    record = json.loads(out)
    assert code == 0 and record["solver"] == "milp"
    assert record["allocation"] == {"j1": 4, "j2": 8}


def test_reads_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(problem())))
    code, out, _ = run(capsys, "-i", "-", "--json")
    assert code == 0 and json.loads(out)["allocation"] == {"j1": 8, "j2": 4}


def test_stdin_errors_name_stdin(capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("{"))
    code, _, err = run(capsys, "-i", "-")
    assert code == 2 and err.startswith("malletrain: error: <stdin>:1: not valid JSON")


def bad(**changes: Any) -> dict[str, Any]:
    doc = problem()
    for key, val in changes.items():
        if key.startswith("job_"):
            doc["jobs"][0][key[4:]] = val
        else:
            doc[key] = val
    return doc


def without(key: str) -> dict[str, Any]:
    doc = problem()
    del doc["jobs"][0][key]
    return doc


@pytest.mark.parametrize(("document", "message"), [
    ("", "not valid JSON: Expecting value"),
    ("{\"nodes\": 4,\n \"jobs\": [}", ":2: not valid JSON"),
    ([1, 2], "top level: must be a JSON object, not list"),
    ({"jobs": []}, "top level: missing required key 'nodes'"),
    (bad(idle=3), "top level: unknown key 'idle'; valid keys: nodes, jobs, lookahead_s"),
    (bad(nodes="460"), "nodes: '460' must be a whole number"),
    (bad(nodes=4.5), "nodes: 4.5 must be a whole number"),
    (bad(nodes=-1), "problem: nodes: -1 must be a whole number ≥ 0"),
    (bad(nodes=2), "the jobs hold 3 nodes now but only 2 are available"),
    (bad(jobs={"id": "j1"}), "jobs: must be a list of job objects"),
    (bad(jobs=["j1"]), "jobs[0]: must be a JSON object, not str"),
    (bad(objective="fun"), "objective: 'fun' is unknown; choose one of throughput, speedup"),
    (bad(lookahead_s="2m"), "lookahead_s: '2m' must be a number"),
    (bad(lookahead_s=-5), "problem: lookahead_s: -5.0 must be a finite number"),
    (bad(constraints={"max_jobs": 2}), "constraints: unknown key 'max_jobs'"),
    (bad(constraints={"min_share": 2}), "constraints: min_share: 2.0 must lie in [0, 1]"),
    (bad(constraints={"user_max_nodes": [4]}), "constraints.user_max_nodes: must map owner"),
    (bad(constraints={"user_max_nodes": {"ann": True}}),
     "constraints.user_max_nodes.ann: True must be a whole number"),
    (bad(job_maxnodes=3), "jobs[0] ('j1'): unknown key 'maxnodes'; valid keys: id, max_nodes"),
    (without("max_nodes"), "jobs[0] ('j1'): missing required key 'max_nodes'"),
    (without("curve"), "jobs[0] ('j1'): missing required key 'curve'"),
    (without("id"), "jobs[0]: missing required key 'id'"),
    (bad(job_id=7), "jobs[0].id: 7 must be a string"),
    (bad(job_min_nodes=9), "job 'j1': max_nodes: max_nodes 8 < min_nodes 9"),
    (bad(job_current_nodes=-1), "job 'j1': current_nodes: -1 must be ≥ 0"),
    (bad(job_scale_up_s=-3), "job 'j1': scale_up_s: -3.0 must be a finite number of seconds"),
    (bad(job_owner=3), "jobs[0] ('j1').owner: 3 must be a string"),
    (bad(job_curve=[1, 2]), "jobs[0] ('j1').curve: must be a JSON object, not list"),
    (bad(job_curve={"nodes": [1]}), "jobs[0] ('j1').curve: missing required key 'throughput'"),
    (bad(job_curve={"nodes": 1, "throughput": 2}), "jobs[0] ('j1').curve.nodes: must be a list"),
    (bad(job_curve={"nodes": [1, 1], "throughput": [1, 2]}),
     "jobs[0] ('j1').curve: curve.nodes: node count(s) [1] repeated"),
    (bad(job_curve={"nodes": [1, 2], "throughput": [1, -2]}),
     "jobs[0] ('j1').curve: curve.throughput: throughput -2.0 at 2 nodes must be"),
    (bad(job_curve={"nodes": [1.5], "throughput": [1]}),
     "jobs[0] ('j1').curve.nodes: 1.5 must be a whole number"),
    (bad(job_curve={"nodes": [1], "throughput": ["x"]}),
     "jobs[0] ('j1').curve.throughput: 'x' must be a number"),
    ({"nodes": 4, "jobs": [{"id": "a", "max_nodes": 2, "curve": CURVE},
                           {"id": "a", "max_nodes": 2, "curve": CURVE}]},
     "problem: jobs: job id(s) ['a'] repeated"),
])
def test_bad_files_one_line_exit_2(capsys: pytest.CaptureFixture[str], write_json: WriteJson,
                                   document: Any, message: str) -> None:
    path = write_json(document)
    code, out, err = run(capsys, "--input", path)
    assert code == 2 and out == ""
    assert err.startswith(f"malletrain: error: {path}")
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    path = str(tmp_path / "nope.json")
    code, _, err = run(capsys, "--input", path)
    assert code == 2
    assert err == f"malletrain: error: {path}: cannot read: No such file or directory\n"


def test_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00")
    code, _, err = run(capsys, "--input", str(path))
    assert code == 2 and "is not UTF-8 text" in err


def test_infeasible_constraints_exit_1(capsys: pytest.CaptureFixture[str],
                                       write_json: WriteJson) -> None:
    doc = problem(constraints={"min_share": 1.0, "max_running_jobs": 1})
    code, out, err = run(capsys, "-i", write_json(doc))
    assert code == 1 and out == ""
    assert err.startswith("malletrain: error: the fairness floor makes 2 jobs run")


def test_dp_with_constraints_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                              write_json: WriteJson) -> None:
    doc = problem(constraints={"max_running_jobs": 1})
    code, _, err = run(capsys, "-i", write_json(doc), "--solver", "dp")
    assert code == 2 and "use milp or auto" in err


def test_unknown_solver_is_rejected_by_argparse(capsys: pytest.CaptureFixture[str],
                                                write_json: WriteJson) -> None:
    with pytest.raises(SystemExit) as info:
        main(["allocate", "-i", write_json(problem()), "--solver", "gurobi"])
    assert info.value.code == 2
    assert "invalid choice: 'gurobi'" in capsys.readouterr().err


def test_problem_json_round_trip() -> None:
    doc = problem(constraints={"user_max_nodes": {"ann": 4}, "min_share": 0.25,
                               "max_running_jobs": 2}, objective="speedup")
    loaded = problem_from_dict(doc, "p.json")
    assert problem_from_dict(json.loads(json.dumps(problem_to_dict(loaded))), "p.json") == loaded
    assert loaded.jobs[1].min_nodes == 2 and loaded.constraints.max_running_jobs == 2
