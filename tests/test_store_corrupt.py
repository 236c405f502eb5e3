"""A corrupt or truncated state database is moved aside and the daemon starts empty.

Each case damages a real SQLite file the way a disk fault or a copy taken mid-write does
(pages overwritten, the file cut short, a journal row, a key-value row or the engine snapshot
that no longer decodes), then opens it with :func:`open_checked`, which must keep the damaged
files for a post-mortem, say so in one line, and hand the caller a working, empty store. A
database that is merely locked by another daemon is not corrupt and must stay where it is.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from malletrain_core import events as ev
from malletrain_core.daemon.store import CorruptState, StateError, Store, open_checked


def _journalled(state_dir: Path, batches: int = 40) -> Path:
    store = Store(state_dir)
    for i in range(batches):
        store.append([ev.NodesReclaimed(float(i), (f"n{i:03d}",))])
    store.put("epochs", {"jobs": {"1": {"epoch": 3}}})
    store.compact('{"format": 0}')
    for i in range(batches, 2 * batches):
        store.append([ev.NodesReclaimed(float(i), (f"n{i:03d}",))])
    store.close()
    return state_dir / "state.db"


def _open(state_dir: Path) -> tuple[Store, list[list[ev.Event]]]:
    def opened(store: Store) -> tuple[Store, list[list[ev.Event]]]:
        store.get("epochs")
        store.snapshot()
        return store, list(store.replay())
    return open_checked(state_dir, opened)


def _garbage(db: Path) -> None:
    with open(db, "r+b") as fh:
        fh.seek(0)
        fh.write(os.urandom(4096))


def _truncate(db: Path) -> None:
    with open(db, "r+b") as fh:
        fh.truncate(os.path.getsize(db) // 2)


def _rewrite(db: Path, sql: str) -> None:
    import sqlite3
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute(sql)
    finally:
        conn.close()


DAMAGE = {
    "header overwritten": _garbage,
    "file cut in half": _truncate,
    "journal row not JSON": lambda db: _rewrite(
        db, "UPDATE journal SET body = '{\"type\": ' WHERE seq = (SELECT MAX(seq) FROM journal)"),
    "journal row of an unknown type": lambda db: _rewrite(
        db, "UPDATE journal SET body = '{\"type\": \"Nope\"}' WHERE seq = "
            "(SELECT MIN(seq) FROM journal)"),
    "key-value row not JSON": lambda db: _rewrite(db, "UPDATE kv SET value = '{'"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_database_is_moved_aside_and_replaced_by_an_empty_one(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    db = _journalled(tmp_path / "state")
    DAMAGE[damage](db)
    before = db.read_bytes()
    with caplog.at_level(logging.ERROR):
        store, batches = _open(tmp_path / "state")
    try:
        assert batches == [] and store.snapshot() is None and store.get("epochs") is None
        store.append([ev.NodesReclaimed(1.0, ("n1",))])  # the new database works
        assert store.journal_length() == 1
    finally:
        store.close()
    kept = sorted(p.name for p in (tmp_path / "state").glob("state.db.corrupt-*"))
    assert kept and kept[0].startswith("state.db.corrupt-"), kept
    assert (tmp_path / "state" / kept[0]).read_bytes() == before  # kept for a post-mortem
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "corrupt" in errors[0] and kept[0] in errors[0], errors
    assert "\n" not in errors[0]


def test_an_undamaged_database_is_opened_as_it_is(tmp_path: Path) -> None:
    _journalled(tmp_path / "state")
    store, batches = _open(tmp_path / "state")
    try:
        assert len(batches) == 40 and store.snapshot() == (40, '{"format": 0}')
        assert store.get("epochs") == {"jobs": {"1": {"epoch": 3}}}
    finally:
        store.close()
    assert not list((tmp_path / "state").glob("*.corrupt-*"))


def test_a_locked_database_is_not_taken_for_a_corrupt_one(tmp_path: Path) -> None:
    _journalled(tmp_path / "state")
    first = Store(tmp_path / "state")
    try:
        with pytest.raises(StateError) as err:
            _open(tmp_path / "state")
        assert not isinstance(err.value, CorruptState)
        assert "locked by another process" in str(err.value)
    finally:
        first.close()
    assert not list((tmp_path / "state").glob("*.corrupt-*"))


def test_damage_found_while_recovering_is_quarantined_once(tmp_path: Path) -> None:
    """``opened`` itself may find the damage (a replayed row): the second attempt gets a fresh
    store, and an error raised on that one propagates instead of looping."""
    _journalled(tmp_path / "state")
    calls: list[int] = []

    def opened(store: Store) -> int:
        calls.append(store.journal_length())
        store.close()
        raise CorruptState("the replay found a bad row")

    with pytest.raises(CorruptState):
        open_checked(tmp_path / "state", opened)
    assert calls == [40, 0]
    assert len(list((tmp_path / "state").glob("state.db.corrupt-*"))) == 1
