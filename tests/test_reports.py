"""Signed progress reports: round trip, forgery, replay and malformed datagrams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain_core.wire import reports
from malletrain_core.wire.reports import Report, ReportError

KEY = bytes(range(32))


def make(**kw):
    base = dict(job="42", epoch=3, seq=1, t=1000.5, samples=1280.0, world=4, rank=0)
    base.update(kw)
    return Report(**base)


def test_round_trip():
    r = make(ckpt=17)
    assert reports.verify(reports.sign(r, KEY), KEY) == r


def test_wrong_key_is_refused():
    with pytest.raises(ReportError, match="bad signature"):
        reports.verify(reports.sign(make(), KEY), b"other key")


def test_tampered_payload_is_refused():
    data = reports.sign(make(samples=10.0), KEY).replace(b'"samples":10.0', b'"samples":99.0')
    with pytest.raises(ReportError, match="bad signature"):
        reports.verify(data, KEY)


def test_replay_is_refused():
    guard = reports.ReplayGuard()
    guard.check(make(seq=1))
    guard.check(make(seq=2))
    with pytest.raises(ReportError, match="replayed"):
        guard.check(make(seq=2))
    guard.check(make(seq=1, epoch=4))  # a new epoch starts its own sequence


@pytest.mark.parametrize("data, reason", [
    (b"x" * 2000, "oversized"),
    (b"MTR2 " + b"0" * 64 + b" {}", "report format MTR2, this daemon reads MTR1"),
    (b"MTRX " + b"0" * 64 + b" {}", "bad magic"),
    (b"MTR1 abc {}", "malformed signature"),
    (b"MTR1 " + b"0" * 64 + b" \xff\xfe", "not UTF-8 JSON"),
    (b"MTR1 " + b"0" * 64 + b" [1]", "not a JSON object"),
    (b"MTR1 " + b"0" * 64 + b' {"job": 1}', "wrong type"),
    (b"MTR1", "bad magic"),
])
def test_malformed(data, reason):
    with pytest.raises(ReportError, match=reason):
        reports.verify(data, KEY)


def test_out_of_range_fields():
    with pytest.raises(ReportError, match="out of range"):
        reports.verify(reports.sign(make(rank=4, world=4), KEY), KEY)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=1500))
def test_arbitrary_bytes_never_crash(data):
    try:
        reports.verify(data, KEY)
    except ReportError:
        pass
