"""The launcher check-in on the wire: the typed request and reply keep the bytes of launcher
protocol 1, so launchers and daemons of earlier releases still understand each other."""

from __future__ import annotations

import json

import pytest

from malletrain_core.wire.checkin import CheckIn, CheckInError, CheckInReply, LauncherState
from malletrain_core.wire.orders import Order, OrderKind

# What a launcher of the previous release sent (worker/launcher.py built these keyword
# arguments by hand), and what the daemon answered.
OLD_REQUEST = ('{"job": "12", "node": "n01", "task": "12_3", "epoch": 4, "state": "running", '
               '"rc": null, "addr": "10.0.0.1", "ckpt_seen": 2, "proto": 1, "inplace": true, '
               '"ready": true, "hold_s": 5.0}')
OLD_PLAIN = ('{"job": "12", "node": "n01", "task": null, "epoch": null, "state": "idle", '
             '"rc": null, "addr": "", "ckpt_seen": 0, "proto": 1}')
OLD_REPLY = ('{"order": {"kind": "run", "epoch": 5, "rank": 1, "world": 2, "master": "n01", '
             '"port": 29500, "rdzv_id": "12-5"}, "key": "K", "report_addr": "h:1"}')


def test_the_request_keeps_its_bytes():
    inplace = CheckIn("12", "n01", "12_3", 4, LauncherState.RUNNING, None, "10.0.0.1", 2,
                      inplace=True, ready=True, hold_s=5.0)
    assert json.dumps(inplace.to_args()) == OLD_REQUEST
    assert json.dumps(CheckIn("12", "n01").to_args()) == OLD_PLAIN
    assert CheckIn.from_args(json.loads(OLD_REQUEST)) == inplace


def test_a_release_0_1_check_in_is_read_with_its_defaults():
    req = CheckIn.from_args({"job": 12, "node": "n01", "epoch": "3"})
    assert (req.job, req.epoch, req.state, req.proto, req.inplace, req.ready, req.hold_s) == \
        ("12", 3, LauncherState.IDLE, 1, False, True, 0.0)
    assert CheckIn.from_args({"job": "1", "node": "n", "hold_s": 99}).hold_s == 10.0


@pytest.mark.parametrize("args, message", [
    ({"node": "n01"}, "checkin needs job and node"),
    ({"job": "1", "node": "n", "epoch": "x"}, "epoch, rc and ckpt_seen are integers"),
    ({"job": "1", "node": "n", "state": "dancing"}, "state 'dancing'; use one of idle, running"),
])
def test_a_malformed_check_in_is_one_line(args, message):
    with pytest.raises(CheckInError, match=message):
        CheckIn.from_args(args)


def test_the_reply_keeps_its_bytes():
    order = Order(OrderKind.RUN, epoch=5, rank=1, world=2, master="n01", port=29500,
                  rdzv_id="12-5")
    reply = CheckInReply(order, "K", "h:1")
    assert json.dumps(reply.to_dict()) == OLD_REPLY
    assert CheckInReply.from_dict(json.loads(OLD_REPLY)) == reply
    assert json.dumps(CheckInReply(Order("wait", reason="x")).to_dict()) == \
        '{"order": {"kind": "wait", "reason": "x"}}'
    assert Order("stop").kind is OrderKind.STOP
