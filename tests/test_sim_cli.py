"""``malletrain simulate`` in-process: table, --json shape, files, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from malletrain_core.cli import main

ROWS = ["unix_time,node,idle"] + [f"{t},n{n},{v}" for t, n, v in [
    (1000, 0, 1), (1000, 1, 1), (1000, 2, 1), (1600, 3, 1), (2200, 0, 0), (2800, 0, 1),
    (3400, 1, 0), (4000, 2, 0), (4600, 1, 1), (5200, 3, 0), (5800, 2, 1), (7000, 0, 0)]]


@pytest.fixture
def trace_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(ROWS) + "\n")
    return path


def _args(trace: Path, *extra: str) -> list[str]:
    return ["simulate", "--trace", str(trace), "--jobs", "3", "--skip-events", "0", *extra]


def test_json_shape_and_files(trace_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = main(_args(trace_file, "--policies", "malletrain,freetrain-linear,equal,oracle",
                      "--json", "--out", str(out), "--seeds", "2"))
    assert code == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert printed == json.loads((out / "results.json").read_text())
    assert (out / "nodes.png").stat().st_size > 0 and (out / "throughput.png").stat().st_size > 0
    for key in ("trace", "ub_oracle", "ub_lin", "idle_node_seconds", "policies"):
        assert key in printed
    assert printed["idle_node_seconds"] == pytest.approx(3 * 600 + 4 * 600 + 3 * 600 + 4 * 600
                                                         + 3 * 600 + 2 * 600 + 3 * 600
                                                         + 2 * 600 + 3 * 1200)
    assert set(printed["policies"]) == {"malletrain", "freetrain-linear", "equal", "oracle"}
    for name in ("malletrain", "freetrain-linear", "equal"):
        p = printed["policies"][name]
        for key in ("net_samples", "ub_oracle_share", "node_utilisation", "rescales",
                    "preemption_loss", "completed_jobs", "mean_jct_s", "wall_s"):
            assert key in p
        assert 0 <= p["ub_oracle_share"] <= 1
        assert len(p["per_seed"]) == 2
    assert printed["policies"]["oracle"]["ub_oracle_share"] == 1.0
    assert "simulate:" in captured.err  # plain progress lines: stderr is not a terminal


def test_same_seed_same_file_but_wall_clock(trace_file: Path, tmp_path: Path, capsys) -> None:
    def run(name: str) -> dict:
        assert main(_args(trace_file, "--policies", "malletrain,greedy", "--seed", "3",
                          "--out", str(tmp_path / name), "--no-plots")) == 0
        return json.loads((tmp_path / name / "results.json").read_text())

    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k not in ("wall_s", "solve_ms")}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj

    assert strip(run("a")) == strip(run("b"))
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["POLICY", "NET_SAMPLES", "UB_SHARE_%"]
    assert "free nodes taken in name order" in table


@pytest.mark.parametrize("argv, words", [
    (["--trace", "{bad}"], "{bad}:3: bad row"),
    (["--trace", "{missing}"], "unknown trace"),
    (["--policies", "malletrain,best"], "unknown policy best"),
    (["--days", "0"], "--days 0"),
])
def test_errors_are_one_line(trace_file: Path, tmp_path: Path, capsys, argv: list[str],
                             words: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("unix_time,node,idle\n1,a,1\nnot-a-time,a,0\n")
    fmt = {"bad": str(bad), "missing": str(tmp_path / "nope.trace")}
    args = ["simulate", "--trace", str(trace_file), "--jobs", "2"] + [a.format(**fmt) for a in argv]
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and words.format(**fmt) in err and "Traceback" not in err


def test_results_do_not_depend_on_hash_seed_or_workers(trace_file: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    outs = []
    for hash_seed, workers in (("1", "1"), ("2", "2")):
        out = tmp_path / f"run{hash_seed}"
        env = dict(os.environ, PYTHONHASHSEED=hash_seed,
                   PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run(
            [sys.executable, "-m", "malletrain_core", *_args(
                trace_file, "--policies", "malletrain,freetrain-mismatched", "--seeds", "2",
                "--workers", workers, "--out", str(out), "--no-plots")],
            env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads((out / "results.json").read_text()))

    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k not in ("wall_s", "solve_ms")}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj

    assert strip(outs[0]) == strip(outs[1])


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.text = ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_progress_bar_on_a_terminal_and_lines_otherwise() -> None:
    from malletrain_core.sim.compare import Progress

    tty = _Stream(True)
    bar = Progress(4, tty)
    bar.update(2, "greedy seed 0")
    assert tty.text.startswith("\r[###############") and "50.0%" in tty.text
    bar.close()
    assert tty.text.endswith("\r")
    plain = _Stream(False)
    lines = Progress(4, plain, every_s=3600)
    lines.update(1, "a")
    lines.update(2, "b")          # within every_s: not repeated
    assert plain.text.count("\n") == 1 and "\r" not in plain.text
    assert plain.text.startswith("simulate:  25.0% a")
    lines.update(4, "c")          # the end is said within every_s too, once
    lines.update(4, "d")
    assert plain.text.count("\n") == 2 and "simulate: 100.0% c" in plain.text


def test_arrivals_table_has_completions_and_no_bound(trace_file: Path, capsys) -> None:
    assert main(_args(trace_file, "--arrivals", "--policies", "freetrain-exact,oracle",
                      "--json")) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ub_oracle"] is None and "oracle" not in printed["policies"]
    assert printed["notes"] and printed["workload"]["arrivals"] is True
    assert printed["policies"]["freetrain-exact"]["ub_oracle_share"] is None


def test_rescale_cost_help_shows_each_models_own_figures(capsys) -> None:
    """The help's figures are read from costs.py, so they cannot go stale again (they said
    0.62 s, 5 s and 0.06 s while the model charged 0.13 s, 7.3 s and 0.20/0.29 s)."""
    from malletrain_core.cli.simulate import rescale_cost_help
    from malletrain_core.sim.costs import COST_MODELS, INPLACE, INPLACE_GPU

    text = rescale_cost_help()
    for c in (INPLACE, INPLACE_GPU):
        assert (f"'{c.name}' (" in text and f"grow pause {c.grow_pause_s:g} s after the "
                f"joiners' {c.joiner_start_s:g} s start, shrink pause {c.shrink_pause_s:g} s "
                f"or preemption pause {c.preempt_pause_s:g} s" in " ".join(text.split()))
    for stale in ("0.62 s", "' 5 s start", "0.06 s"):
        assert stale not in text
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "{" + ",".join(COST_MODELS) + "}" in shown and "measured on one H100" in shown


def test_inplace_gpu_cost_model_runs_and_is_named(trace_file: Path, capsys) -> None:
    shares = {}
    for cost in ("inplace", "inplace-gpu"):
        assert main(_args(trace_file, "--policies", "freetrain-exact,oracle", "--json",
                          "--noise", "0", "--rescale-cost", cost)) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["perf_model"]["rescale_cost"] == cost
        shares[cost] = printed["policies"]["freetrain-exact"]["ub_oracle_share"]
    # other costs, another result: the GPU joiner starts sooner (3.9 against 7.3 s), its grow
    # pauses the members longer (0.50 against 0.13 s)
    assert 0 < shares["inplace-gpu"] <= 1 and 0 < shares["inplace"] <= 1
    assert shares["inplace-gpu"] != shares["inplace"]


def test_every_default_a_help_text_quotes_is_the_options_default() -> None:
    """A "(default N)" in the CLI's help is the option's real default (argparse's
    %(default)s or the code's constant), never a number typed in that went stale."""
    import argparse
    import re

    from malletrain_core.cli import build_parser

    quoted = re.compile(r"\(default:? ([0-9][0-9.]*)[;:)]")
    checked, wrong = 0, []
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
                continue
            text = parser._get_formatter()._expand_help(action) if action.help else ""
            m = quoted.search(" ".join(text.split()))
            if m and isinstance(action.default, (int, float)):
                checked += 1
                if float(m.group(1)) != float(action.default):
                    wrong.append(f"{parser.prog} {action.dest}: {m.group(1)} != {action.default}")
    assert wrong == [] and checked >= 8, (wrong, checked)
