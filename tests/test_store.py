"""The daemon's journal: round trip, restart, permissions, and the two faults that stop it."""

from __future__ import annotations

import stat

import pytest

from malletrain_core import events as ev
from malletrain_core.daemon import codec
from malletrain_core.daemon.store import StateError, Store
from malletrain_core.model import Curve

EVENTS = [
    ev.NodesIdle(1.0, (ev.IdleNode("n01", hole_end=50.0), ev.IdleNode("n02", group="g1"))),
    ev.JobSubmitted(2.0, ev.JobRequest("7", 1, 4, owner="alice", model="resnet18",
                                       curve=Curve.of([1, 2], [10.0, 18.0]), profile=False)),
    ev.ProgressReport(3.0, job_id="7", samples=640.0, world_size=2, epoch=1),
    ev.NodesReclaimed(4.0, ("n01",)),
    ev.JobEnded(5.0, job_id="7", reason=ev.EndReason.CANCELLED),
    ev.Tick(6.0),
]


@pytest.mark.parametrize("event", EVENTS + [ev.Grow("7", ("n01",), 30.0), ev.Finish("7")])
def test_codec_round_trip(event):
    assert codec.from_dict(codec.to_dict(event)) == event


def test_codec_rejects_unknown_type():
    with pytest.raises(ValueError, match="unknown event"):
        codec.from_dict({"type": "Launch"})


def test_journal_survives_restart(tmp_path):
    store = Store(tmp_path / "state")
    store.append(EVENTS[:3])
    store.append(EVENTS[3:])
    store.put("epochs", {"7": {"epoch": 2}})
    store.close()
    again = Store(tmp_path / "state")
    assert list(again.replay()) == [EVENTS[:3], EVENTS[3:]]
    assert again.get("epochs") == {"7": {"epoch": 2}}
    assert again.get("missing", 3) == 3
    again.close()


def test_files_are_private(tmp_path):
    store = Store(tmp_path / "state")
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    store.close()


def test_second_daemon_is_refused_with_one_line(tmp_path):
    first = Store(tmp_path / "state")
    first.append(EVENTS[:1])
    with pytest.raises(StateError, match="locked by another process") as err:
        Store(tmp_path / "state", busy_timeout_s=0.2)
    assert "\n" not in str(err.value)
    first.close()


def test_unwritable_state_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot create"):
        Store(blocker / "state")
