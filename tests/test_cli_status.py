"""``malletrain status|jobs|nodes|profile`` against a real daemon's API: golden text and JSON.

Set ``MALLETRAIN_UPDATE_GOLDEN=1`` to rewrite the files in ``tests/golden/cli/`` after an
intended change of output, and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from cli_daemon import build, config_file, reclaim, serving

from malletrain_core.cli import main
from malletrain_core.cli.jobs import PHASES
from malletrain_core.engine.config import JobPhase

GOLDEN = Path(__file__).parent / "golden" / "cli"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MALLETRAIN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"output differs from {path}"


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def cli(tmp_path, monkeypatch, utc, capsys):
    """Runs ``malletrain ARGS`` against the scripted daemon; returns (exit code, out, err)."""
    monkeypatch.delenv("MALLETRAIN_DAEMON", raising=False)
    daemon, backend, clock = build(tmp_path / "state")
    sock = tmp_path / "api.sock"
    config = config_file(tmp_path, sock)

    def run(*args: str) -> tuple[int, str, str]:
        code = main([args[0], "--config", str(config), *args[1:]])
        out, err = capsys.readouterr()
        return code, out, err

    with serving(daemon, sock):
        run.daemon, run.backend, run.clock = daemon, backend, clock  # type: ignore[attr-defined]
        yield run


def test_phases_match_the_engine():
    assert PHASES == tuple(p.value for p in JobPhase)


def test_jobs_table_and_json(cli):
    code, out, err = cli("jobs")
    assert (code, err) == (0, "")
    golden("jobs.txt", out)
    code, out, _ = cli("jobs", "--json")
    assert code == 0
    golden("jobs.json", out)
    records = json.loads(out)
    assert [r["job"] for r in records] == ["101", "102", "103"]


def test_jobs_format_noheader_and_filters(cli):
    code, out, _ = cli("jobs", "--format", "job,nodes,nodelist", "--noheader")
    assert code == 0
    assert out.splitlines() == ["101  4  n[01-04]", "102  3  n[06-08]", "103  0  -"]
    code, out, _ = cli("jobs", "--state", "queued", "-o", "job,state,user")
    assert out.splitlines() == ["JOBID  STATE   USER", "103    QUEUED  carol"]
    code, out, _ = cli("jobs", "--user", "bob", "--json")
    assert [r["job"] for r in json.loads(out)] == ["102"]


def test_bad_format_is_a_usage_error(cli):
    with pytest.raises(SystemExit) as exit_:
        cli("jobs", "--format", "job,colour")
    assert exit_.value.code == 2


def test_nodes_table_and_json(cli):
    code, out, err = cli("nodes")
    assert (code, err) == (0, "")
    golden("nodes.txt", out)
    code, out, _ = cli("nodes", "--json")
    golden("nodes.json", out)
    code, out, _ = cli("nodes", "--state", "free", "--noheader", "-o", "node")
    assert out == "n05\n"


def test_nodes_after_a_reclaim(cli):
    reclaim(cli.daemon, cli.backend, cli.clock, "n07", "n08")
    code, out, _ = cli("nodes", "-o", "node,state,job", "--noheader")
    rows = [line.split() for line in out.splitlines()]
    assert [r[0] for r in rows] == ["n01", "n02", "n03", "n04", "n05", "n06"]
    held_by_102 = [r[0] for r in rows if r[1:] == ["held", "102"]]
    assert "n06" in held_by_102 and len(held_by_102) == 2  # back to its minimum, n05 regained
    code, out, _ = cli("status")
    assert "1 preemptions" in out


def test_profile_table_and_json(cli):
    code, out, err = cli("profile", "101")
    assert (code, err) == (0, "")
    golden("profile.txt", out)
    code, out, _ = cli("profile", "101", "--json")
    golden("profile.json", out)
    code, out, _ = cli("profile", "101", "--all", "--noheader", "-o", "nodes,throughput")
    assert out.splitlines() == ["1   97.5", "2  195.0", "3  292.5", "4  390.0"]


def test_profile_of_a_job_without_curve(cli):
    code, out, _ = cli("profile", "103")
    assert code == 0
    assert out.splitlines()[0].endswith("no curve yet (nothing measured)")


def test_profile_of_an_unknown_job_is_one_line_exit_1(cli):
    code, out, err = cli("profile", "999")
    assert (code, out) == (1, "")
    assert err == ("malletrain: error: job 999 is not known to malletraind; `malletrain jobs` "
                   "lists the jobs it knows\n")


def test_status_text_and_json(cli):
    code, out, err = cli("status")
    assert (code, err) == (0, "")
    golden("status.txt", re.sub(r"last [0-9.]+ ms", "last X ms",
                                re.sub(r"in [0-9.]+ ms", "in X ms", out)))
    code, out, _ = cli("status", "--json")
    status = json.loads(out)
    assert status["nodes"] == {"free": 1, "held": 7}
    assert status["jobs"] == {"queued": 1, "profiling": 0, "running": 2, "done": 0}
    # one grow action per time limit (nodes with and without a hole end), two jobs grown
    assert status["daemon"]["actions"] == {"Grow": 4}
    assert status["engine"]["grows"] == 2 and status["engine"]["solves"] >= 1
    # 7 nodes held from the grow (T0) to the engine's latest event, the report at T0 + 50 s
    assert status["engine"]["held_node_s"] == pytest.approx(7 * 50.0)


def test_plain_unless_a_terminal(monkeypatch):
    import io

    from malletrain_core.cli.jobs import TABLE
    from malletrain_core.cli.output import styled

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert not styled(io.StringIO()) and styled(Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not styled(Tty())
    row = {"job": "1", "state": "queued", "owner": "", "model": "", "nodes": 0,
           "min_nodes": 1, "max_nodes": 2, "throughput": None, "node_list": ""}
    cols = TABLE.parse_format("job,state")
    assert TABLE.render([row], cols, bold=True).splitlines()[0] == "\033[1mJOBID  STATE\033[0m"
    assert TABLE.render([row], cols).splitlines() == ["JOBID  STATE", "1      QUEUED"]
