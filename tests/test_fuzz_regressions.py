"""Inputs bench/fuzz.py found that crashed a parser with an exception other than its own
refusal; each is now refused with one clear line."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest

from malletrain_core.daemon.api import Dispatcher
from malletrain_core.daemon.epochs import EpochCoordinator
from malletrain_core.daemon.launchers import LauncherService
from malletrain_core.errors import InputFileError
from malletrain_core.sim import traces
from malletrain_core.wire import hooks as protocol
from malletrain_core.wire import reports

KEY = b"k" * 32
HUGE = "1" + "0" * 400


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text


@pytest.mark.parametrize("datagram, says", [
    ('{"v":1,"src":"pbs","kind":"nodes_free","t":HUGE,"nodes":["a"]}'.replace("HUGE", HUGE),
     "unix time"),
    ('{"v":1,"src":"\\ud800","kind":"nodes_free","t":1,"nodes":["a"]}', "lone surrogate"),
    ('{"v":1,"src":"x","kind":"job_end","t":1,"job":"1","nodes":"\\udc00"}', "lone surrogate"),
])
def test_hook_datagrams_with_huge_times_or_lone_surrogates(datagram: str, says: str) -> None:
    with pytest.raises(protocol.ProtocolError) as err:  # was OverflowError / accepted
        protocol.decode(datagram.encode())
    assert says in str(err.value) and one_line(str(err.value))


def signed(payload: str) -> bytes:
    data = payload.encode()
    return reports.MAGIC + b" " + hmac.new(KEY, data, hashlib.sha256).hexdigest().encode() + \
        b" " + data


@pytest.mark.parametrize("field, value, says", [
    ("samples", HUGE, "finite"), ("t", HUGE, "finite"), ("t", "-" + HUGE, "finite"),
    ("job", '"\\ud800"', "lone surrogate"),
])
def test_reports_with_huge_numbers_or_lone_surrogates(field: str, value: str,
                                                      says: str) -> None:
    body = {"epoch": 0, "job": "42", "rank": 0, "samples": 1.0, "seq": 1, "t": 1.0, "world": 1}
    text = json.dumps(body).replace(f'"{field}": {json.dumps(body[field])}',
                                    f'"{field}": {value}')
    assert text != json.dumps(body)
    with pytest.raises(reports.ReportError) as err:  # was OverflowError / accepted
        reports.verify(signed(text), KEY)
    assert says in str(err.value) and one_line(str(err.value))


@pytest.mark.parametrize("rc", ["-Infinity", "Infinity", "NaN", HUGE + ".0"])
def test_checkin_with_a_non_finite_number_is_refused_not_an_internal_error(rc: str) -> None:
    dispatcher = Dispatcher(admin_uids={0})
    LauncherService(EpochCoordinator(), lambda key, uid: "cred", "127.0.0.1:1",
                    lambda: 0.0).register(dispatcher)
    line = '{"op":"checkin","args":{"job":"9","node":"n0","epoch":0,"rc":RC}}'.replace(
        "RC", rc).encode()
    reply = json.loads(dispatcher.dispatch(0, line))
    assert reply["ok"] is False
    assert reply["error"].startswith("checkin needs job and node"), reply["error"]


def test_idle_trace_with_a_time_too_large_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"unix_time,node,idle\n1,a,1\n{HUGE},b,1\n")
    with pytest.raises(InputFileError) as err:  # was OverflowError
        traces.read_idle_csv(path, use_cache=False)
    assert err.value.line == 3 and one_line(str(err.value))
