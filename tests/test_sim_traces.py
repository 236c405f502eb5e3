"""Trace sources: the per-node idle CSV, SWF logs, synthetic traces, windows and errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from malletrain_core.errors import InputFileError
from malletrain_core.sim.sources import load_trace, read_alcf_csv, read_swf, synthetic
from malletrain_core.sim.traces import from_transitions, read_idle_csv


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _csv(tmp_path: Path, rows: list[str], name: str = "t.csv", header: str =
         "unix_time,node,idle") -> Path:
    path = tmp_path / name
    text = "\n".join([header, *rows]) + "\n"
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


ROWS = ["100,a,1", "100,b,1", "110,a,0", "120,c,1", "120,a,1", "130,b,0", "130,c,0"]


def _state(trace, upto_step: int) -> set[str]:
    idle = {trace.node_names[i] for i in trace.initial}
    for s in range(upto_step):
        _, added, removed = trace.step(s)
        idle |= {trace.node_names[i] for i in added}
        idle -= {trace.node_names[i] for i in removed}
    return idle


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz"])
def test_idle_csv_start_state_and_steps(tmp_path: Path, name: str) -> None:
    trace = read_idle_csv(_csv(tmp_path, ROWS, name))
    assert trace.start == 100
    assert _state(trace, 0) == {"a", "b"}
    assert list(trace.times) == [110, 120, 130]
    assert _state(trace, 1) == {"b"}
    assert _state(trace, 2) == {"a", "b", "c"}
    assert _state(trace, 3) == {"a"}
    starts, counts = trace.idle_counts()
    assert list(starts) == [100, 110, 120, 130]
    assert list(counts) == [2, 1, 3, 1]
    # end defaults to the last event: 10·2 + 10·1 + 10·3
    assert trace.idle_node_seconds() == 60


def test_idle_csv_cache_round_trip(tmp_path: Path) -> None:
    path = _csv(tmp_path, ROWS)
    first = read_idle_csv(path)
    assert list((tmp_path / "cache" / "malletrain").glob("trace-*.npz"))
    second = read_idle_csv(path)
    assert second.node_names == first.node_names
    for field in ("initial", "times", "offsets", "nodes", "idle"):
        assert np.array_equal(getattr(first, field), getattr(second, field))


@pytest.mark.parametrize("row, line, words", [
    ("abc,a,1", 3, "unix_time"),
    ("120,a,2", 3, "idle (0 or 1)"),
    ("120,a", 3, "bad row"),
    ("120,,1", 3, "empty node name"),
])
def test_idle_csv_bad_row_names_file_and_line(tmp_path: Path, row: str, line: int,
                                              words: str) -> None:
    path = _csv(tmp_path, ["100,a,1", row])
    with pytest.raises(InputFileError) as err:
        read_idle_csv(path, use_cache=False)
    assert err.value.line == line
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_idle_csv_bad_header_and_unsorted(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="header"):
        read_idle_csv(_csv(tmp_path, ROWS, header="time,host,state"), use_cache=False)
    with pytest.raises(InputFileError, match="backwards") as err:
        read_idle_csv(_csv(tmp_path, ["100,a,1", "120,a,0", "110,b,1"], "u.csv"),
                      use_cache=False)
    assert err.value.line == 4


def test_normalisation_drops_repeats_and_collapses_same_time() -> None:
    # node 0: idle at start; "idle" again at 5 (repeat), busy then idle at 10 (net: idle).
    trace = from_transitions("x", ["n0", "n1"], np.array([0]), np.array([5, 10, 10, 12]),
                             np.array([0, 0, 0, 1]), np.array([True, False, True, True]),
                             start=0)
    assert list(trace.times) == [12]
    assert _state(trace, 1) == {"n0", "n1"}


def test_window_skip_and_days(tmp_path: Path) -> None:
    trace = read_idle_csv(_csv(tmp_path, ROWS))
    skipped = trace.window(skip_events=2)
    assert skipped.start == 120
    assert _state(skipped, 0) == {"a", "b", "c"}
    assert list(skipped.times) == [130]
    cut = trace.window(days=15 / 86400)
    assert cut.end == 115 and list(cut.times) == [110]
    assert cut.idle_node_seconds() == 2 * 10 + 1 * 5


SWF = """; Version: 2.2
; MaxNodes: 4
1 0 0 10 2 -1 -1 2 100 -1 1 1 -1 -1 -1 -1 -1 0
2 3 2 10 -1 -1 -1 3 100 -1 1 1 -1 -1 -1 -1 -1 0
3 4 -1 10 2 -1 -1 2 100 -1 1 1 -1 -1 -1 -1 -1 0
4 20 0 5 4 -1 -1 4 100 -1 1 1 -1 -1 -1 -1 -1 0
"""


def test_swf_replay_places_and_clips(tmp_path: Path) -> None:
    path = tmp_path / "log.swf"
    path.write_text(SWF)
    trace = read_swf(path, machine_nodes=4, use_cache=False)
    starts, counts = trace.idle_counts()
    # t0: job 1 on 2 nodes; t5: job 2 wants 3, gets the 2 left (clipped); job 3 has no wait
    # (-1) and is skipped; t10: job 1 ends; t15: job 2 ends; t20-25: job 4 fills the machine.
    assert list(starts) == [0, 5, 10, 15, 20, 25]
    assert list(counts) == [2, 0, 2, 4, 0, 4]
    _, _, removed = trace.step(0)
    assert sorted(trace.node_names[i] for i in removed) == ["nid2", "nid3"]


@pytest.mark.parametrize("line, words", [
    ("1 0 0 10", "fields"),
    ("1 zero 0 10 2 -1 -1 2 100 -1 1 1 -1 -1 -1 -1 -1 0", "numbers"),
])
def test_swf_bad_line(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "bad.swf"
    path.write_text("; header\n" + SWF.splitlines()[2] + "\n" + line + "\n")
    with pytest.raises(InputFileError, match=words) as err:
        read_swf(path, use_cache=False)
    assert err.value.line == 3


def test_synthetic_is_seeded_and_near_its_idle_fraction() -> None:
    frags = np.array([300, 600, 1200, 2400])
    a = synthetic(nodes=40, days=2, seed=5, idle_fraction=0.1, fragments=frags)
    b = synthetic(nodes=40, days=2, seed=5, idle_fraction=0.1, fragments=frags)
    c = synthetic(nodes=40, days=2, seed=6, idle_fraction=0.1, fragments=frags)
    assert np.array_equal(a.times, b.times) and np.array_equal(a.nodes, b.nodes)
    assert not np.array_equal(a.times, c.times)
    share = a.idle_node_seconds() / (40 * a.span_s)
    assert 0.05 < share < 0.17
    assert np.all(a.times % 10 == 0)
    starts, counts = a.idle_counts()
    assert counts.min() >= 0 and counts.max() <= 40


def test_unknown_and_missing_traces(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="unknown trace;"):
        load_trace(str(tmp_path / "nothing.bin"))
    other = tmp_path / "trace.parquet"
    other.write_text("x")
    with pytest.raises(InputFileError, match="unknown trace format"):
        load_trace(str(other))
    with pytest.raises(InputFileError, match="no such trace file"):
        load_trace(str(tmp_path / "gone.csv"))


def test_named_traces_say_where_the_data_should_be(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLETRAIN_SHARED", str(tmp_path))
    for name in ("summit", "swf"):
        with pytest.raises(InputFileError, match="set MALLETRAIN_SHARED"):
            load_trace(name)
    with pytest.raises(InputFileError, match="fragment lengths"):
        load_trace("synthetic")


GOLDEN = Path(__file__).parent / "golden" / "alcf_joblog.csv"


def test_alcf_job_log_places_jobs_like_swf() -> None:
    trace = read_alcf_csv(GOLDEN, machine_nodes=4, use_cache=False)
    starts, counts = trace.idle_counts()
    # 00:10 a takes 2 nodes; 00:20 b (NODES_USED 0: its 1 requested node); c never started;
    # 00:50 b ends and d wants 3, gets the 2 free (clipped); 01:10 a ends; 02:00 d ends; e ends
    # before it starts and holds nothing.
    assert trace.start == 1693526400.0 + 600.0  # 2023-09-01 00:10 UTC
    assert list(starts - trace.start) == [0, 600, 2400, 3600, 6600]
    assert list(counts) == [2, 1, 0, 2, 4]
    assert _state(trace, 0) == {"nid2", "nid3"}  # a took the lowest nodes at the start
    assert _state(trace, 1) == {"nid3"} and _state(trace, 2) == set()


def test_alcf_job_log_is_found_by_its_header(tmp_path: Path) -> None:
    gz = tmp_path / "alcf.csv.gz"
    gz.write_bytes(gzip.compress(GOLDEN.read_bytes()))
    for path in (GOLDEN, gz):
        trace = load_trace(str(path), machine_nodes=4, skip_events=0)
        assert trace.steps == 4 and len(trace.node_names) == 4
    idle = load_trace(str(_csv(tmp_path, ROWS)))  # the unix_time,node,idle format still works
    assert list(idle.node_names) == ["a", "b", "c"]


@pytest.mark.parametrize("header, row, line, words", [
    ("JOB_NAME,START_TIMESTAMP,END_TIMESTAMP", "x,2023-09-01 00:00:00,2023-09-01 01:00:00", 1,
     "missing column NODES_USED or NODES_REQUESTED"),
    ("JOB_NAME,START_TIMESTAMP,NODES_USED", "x,2023-09-01 00:00:00,4", 1,
     "missing column END_TIMESTAMP"),
    ("START_TIMESTAMP,END_TIMESTAMP,NODES_USED", "yesterday,2023-09-01 01:00:00,4", 3,
     "START_TIMESTAMP 'yesterday'"),
    ("START_TIMESTAMP,END_TIMESTAMP,NODES_USED", "2023-09-01 00:00:00,2023-09-01 01:00:00,four",
     3, "NODES_USED 'four' is not a node count"),
    ("START_TIMESTAMP,END_TIMESTAMP,NODES_USED", "2023-09-01 00:00:00,4", 3, "2 fields"),
])
def test_alcf_job_log_errors_name_the_column_and_line(tmp_path: Path, header: str, row: str,
                                                      line: int, words: str) -> None:
    good = "2023-09-01 00:00:00,2023-09-01 00:30:00,1"
    path = tmp_path / "log.csv"
    path.write_text("\n".join([header, good, row] if line == 3 else [header, row]) + "\n")
    with pytest.raises(InputFileError, match=words) as err:
        read_alcf_csv(path, use_cache=False)
    assert err.value.line == line and "\n" not in str(err.value)
    with pytest.raises(InputFileError, match=words):
        load_trace(str(path))
