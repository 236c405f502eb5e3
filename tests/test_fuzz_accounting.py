"""Hostile accounting input: sacct --json, sacct -P and PBS accounting logs, mutated and
random, never crash the reader. Every malformed record is one line and counted; a file with
no usable record is refused with one InputFileError line; anything else is a trace."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_inputs import FAST, json_values, one_line

from malletrain_core.errors import InputFileError
from malletrain_core.sim.accounting import load_accounting_trace, read_accounting

pytestmark = pytest.mark.security

GOLDEN = Path(__file__).parent / "golden" / "accounting"
FIXTURES = {name: (GOLDEN / name).read_bytes() for name in
            ("sacct_22.05.json", "sacct_22.05.txt", "pbs_accounting_20261127")}


def read_or_refuse(path: Path) -> None:
    said: list[str] = []
    try:
        log = read_accounting(path, said.append)
    except InputFileError as exc:
        assert one_line(str(exc)) and str(path) in str(exc)
        assert all(one_line(s) for s in said)
        return
    assert all(one_line(s) for s in said)
    assert len(said) <= log.skipped + 1 and log.runs
    for run in log.runs:
        assert run.nodes and (run.end is None or run.end >= run.start)
    trace = load_accounting_trace(path, warn=None)
    assert trace.end >= trace.start and trace.idle_node_seconds() >= 0


@FAST
@given(st.sampled_from(sorted(FIXTURES)), st.data())
def test_mutated_fixtures(tmp_path: Path, name: str, data: st.DataObject) -> None:
    raw = bytearray(FIXTURES[name])
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    for _ in range(data.draw(st.integers(1, 8))):
        what = rng.randrange(4)
        at = rng.randrange(len(raw))
        if what == 0:
            raw[at] = rng.randrange(256)
        elif what == 1:
            del raw[at:at + rng.randrange(1, 40)]
        elif what == 2:
            raw[at:at] = raw[rng.randrange(len(raw)):][:rng.randrange(1, 60)]
        else:
            raw = raw[:at]  # cut short, as a log still being written
        if not raw:
            raw = bytearray(b"\n")
    path = tmp_path / name
    path.write_bytes(bytes(raw))
    read_or_refuse(path)


@FAST
@given(st.lists(json_values, max_size=6))
def test_sacct_json_jobs_of_any_shape(tmp_path: Path, jobs: list[object]) -> None:
    path = tmp_path / "sacct.json"
    path.write_text(json.dumps({"jobs": jobs}))
    read_or_refuse(path)


field = st.sampled_from(["", "1", "n01", "n[01-03]", "n[9-1]", "None assigned", "Unknown",
                         "2026-11-27T02:15:52", "2026-11-27T02:16:00", "1795745752",
                         "99999999999999999999", "RUNNING", "COMPLETED", "prod", "|", "x[",
                         "-5", "2026-02-30T00:00:00"])


@FAST
@given(st.lists(st.lists(field, min_size=1, max_size=9), max_size=8))
def test_sacct_parsable_rows(tmp_path: Path, rows: list[list[str]]) -> None:
    path = tmp_path / "sacct.txt"
    path.write_text("JobID|JobName|Partition|Reservation|State|NodeList|Start|End|AllocNodes\n"
                    + "\n".join("|".join(r) for r in rows) + "\n")
    read_or_refuse(path)


@FAST
@given(st.lists(st.tuples(st.sampled_from("QSERDAK?"), st.sampled_from(["1.s", "2.s", ""]),
                          st.lists(st.sampled_from([
                              "start=1795745907", "end=1795745943", "end=1", "start=x",
                              "start=99999999999999", "exec_vnode=(n01:ncpus=2)",
                              "exec_vnode=(n01:ncpus=1)+(n02:ncpus=1)", "exec_vnode=(",
                              "exec_host=n03/0*2", "queue=prod", 'jobname="a b"', "=",
                              "resvID=R7.s"]), max_size=6)),
                max_size=8))
def test_pbs_records(tmp_path: Path, records: list[tuple[str, str, list[str]]]) -> None:
    path = tmp_path / "20261127"
    path.write_text("".join(f"11/27/2026 02:18:27;{k};{j};{' '.join(a)}\n"
                            for k, j, a in records))
    read_or_refuse(path)


@FAST
@given(st.binary(max_size=400))
def test_arbitrary_bytes(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "log"
    path.write_bytes(body)
    read_or_refuse(path)
