"""Log lines about a job carry ``job=ID``, whichever of the three conventions wrote them."""

from __future__ import annotations

import io
import logging

import pytest

from malletrain_core.logs import configure, job_log


@pytest.fixture
def stream():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    configure("debug", out, fmt="%(levelname)s %(name)s: %(jobtag)s%(message)s")
    yield out
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


def test_three_conventions_one_format(stream):
    log = logging.getLogger("malletrain_core.test")
    log.info("grow %s", "n[01-02]", extra={"job": "12"})
    job_log(log, "13").warning("shrink %s", "n03")
    log.info("job %s: finish", "14")
    log.info("job %s grew to %d nodes", "15", 4)
    log.info("polled %d nodes", 8)
    log.info("job %(id)s", {"id": "16"})  # a mapping argument is left alone
    log.warning("grow of job %s on %s: %s", "17", "n04", "busy")
    log.warning("%d%% of %s: task %s held again", 50, "n[1-2]", "18_3")
    assert stream.getvalue().splitlines() == [
        "INFO malletrain_core.test: job=12 grow n[01-02]",
        "WARNING malletrain_core.test: job=13 shrink n03",
        "INFO malletrain_core.test: job=14 finish",
        "INFO malletrain_core.test: job=15 grew to 4 nodes",
        "INFO malletrain_core.test: polled 8 nodes",
        "INFO malletrain_core.test: job 16",
        "WARNING malletrain_core.test: job=17 grow of job 17 on n04: busy",
        "WARNING malletrain_core.test: job=18_3 50% of n[1-2]: task 18_3 held again",
    ]


def test_the_daemon_cycle_lines_get_the_tag(stream, tmp_path):
    from cli_daemon import build
    build(tmp_path / "state")
    grows = [line for line in stream.getvalue().splitlines() if " grow " in line]
    assert grows and all("malletrain_core.daemon.core: job=10" in line for line in grows)


def test_under_systemd_the_journal_stamps_the_time(monkeypatch, capsys):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
        configure("info")
        logging.getLogger("malletrain_core.x").info("job %s: finish", "9")
        monkeypatch.delenv("JOURNAL_STREAM")
        configure("info")
        logging.getLogger("malletrain_core.x").info("job %s: finish", "9")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    journal, plain = capsys.readouterr().err.splitlines()
    assert journal == "INFO malletrain_core.x: job=9 finish"
    assert plain.endswith(" INFO malletrain_core.x: job=9 finish") and plain[:4].isdigit()
