"""The daemon's state in SQLite (WAL): an event journal and a small key-value table.

The engine is pure and deterministic, so its state is a function of the events it consumed:
the daemon journals every event before handing it to the engine and, on restart, replays the
journal into a fresh engine (discarding the actions) and then reconciles with the batch system,
which is the truth. The key-value table holds what is not derived from events (the epoch
coordinator's state, counters). Once the journal holds more than ``daemon.journal_max_events``
events it is compacted: a snapshot of the engine (:mod:`.snapshot`) replaces every row before
it, in one transaction, and a restart loads the snapshot and replays only the rows after it.

Only two faults stop the daemon instead of being recovered: a full disk and a database locked
by another process; both raise :class:`StateError` with one clear message and leave the
database consistent (every write is one transaction). A corrupt or truncated database (a disk
fault, a copy taken mid-write) raises :class:`CorruptState` when it is opened, checked or read;
:func:`open_checked` then moves its files aside, keeps them for a post-mortem, and starts from
an empty one: the batch system still holds every job, so what is lost is what only the
daemon knew (measured scaling curves, counters), which the profiler measures again.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..errors import MalleTrainError
from ..events import Event
from . import codec

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                                    batch INTEGER NOT NULL, t REAL NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 1),
                                     seq INTEGER NOT NULL, body TEXT NOT NULL);
"""

COMPACTION_STEPS = ("begin", "snapshot", "truncate", "commit", "done")
"""The steps of :meth:`Store.compact`, each announced to its ``step`` callback before it runs
("done": after the commit; the crash tests stop the process at every one of them)."""


class StateError(MalleTrainError):
    """The state database cannot be written: the daemon stops with this message."""


class CorruptState(StateError):
    """The state database's pages or rows do not read back: it is moved aside."""


CORRUPT_SIGNS = ("malformed", "not a database", "corrupt")
"""Words in SQLite's messages for a damaged file (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``)."""

_FILES = ("", "-wal", "-shm")
"""The database file and SQLite's write-ahead log and shared-memory index beside it."""


def _explain(path: Path, exc: sqlite3.Error) -> StateError:
    text = str(exc).lower()
    if any(sign in text for sign in CORRUPT_SIGNS):
        return CorruptState(f"{path}: the state database is corrupt ({exc})")
    if "locked" in text or "busy" in text:
        return StateError(f"{path}: the state database is locked by another process; stop the "
                          "other malletraind (only one may run per state_dir)")
    if "full" in text or "disk i/o" in text:
        return StateError(f"{path}: cannot write the state database ({exc}); free disk space "
                          "and restart malletraind — nothing was lost")
    if "readonly" in text or "unable to open" in text:
        return StateError(f"{path}: cannot open the state database for writing ({exc}); check "
                          "state_dir and its permissions")
    return StateError(f"{path}: state database error: {exc}")


class Store:
    """Journal and key-value state of one daemon; one writer at a time (a lock is taken)."""

    def __init__(self, state_dir: str | os.PathLike[str], busy_timeout_s: float = 2.0) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "state.db"
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            owner = self.dir.stat().st_uid
            if owner != os.geteuid():
                raise StateError(f"{self.dir}: owned by uid {owner}, not by the daemon's uid "
                                 f"{os.geteuid()}; another user could read or replace the "
                                 "state: chown it or choose another state_dir")
            os.chmod(self.dir, 0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            os.chmod(self.path, 0o600)
        except OSError as exc:
            raise StateError(f"{self.path}: cannot create the state database: {exc.strerror}; "
                             "check state_dir and its permissions") from None
        try:
            # used by the daemon's thread and, for the epoch state an order depends on, by
            # an API thread (LauncherService.persist), always under the daemon's lock
            self.db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            # An exclusive lock for the daemon's lifetime: a second daemon fails fast.
            self.db.execute("PRAGMA locking_mode=EXCLUSIVE")
            self.db.executescript(SCHEMA)
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("COMMIT")
            self.rows = self.journal_length()
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None

    def close(self) -> None:
        self.db.close()

    def append(self, events: list[Event]) -> None:
        """Journal ``events`` as one batch, in one transaction, before the engine sees them."""
        if not events:
            return
        try:
            with self.db:
                self.db.execute("BEGIN")
                (batch,) = self.db.execute("SELECT COALESCE(MAX(batch), 0) + 1 FROM journal"
                                           ).fetchone()
                rows = [(batch, e.time, json.dumps(codec.to_dict(e), separators=(",", ":")))
                        for e in events]
                self.db.executemany("INSERT INTO journal (batch, t, body) VALUES (?, ?, ?)", rows)
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None
        self.rows += len(rows)

    def replay(self) -> Iterator[list[Event]]:
        """Every journalled batch of events, oldest first (as the engine consumed them)."""
        batch: list[Event] = []
        current = None
        after = self.snapshot_seq()
        for number, body in self.db.execute("SELECT batch, body FROM journal WHERE seq > ? "
                                            "ORDER BY seq", (after,)):
            if current is not None and number != current and batch:
                yield batch
                batch = []
            current = number
            try:
                batch.append(codec.from_dict(json.loads(body)))  # type: ignore[arg-type]
            except (ValueError, TypeError, KeyError) as exc:
                raise CorruptState(f"{self.path}: journal row of batch {number} does not "
                                   f"decode ({exc})") from None
        if batch:
            yield batch

    def check(self) -> None:
        """SQLite's page-level check of the whole file (``PRAGMA quick_check``, linear in its
        size, which compaction bounds); raises :class:`CorruptState`."""
        try:
            rows = self.db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None
        problems = [str(r[0]) for r in rows if str(r[0]) != "ok"]
        if problems:
            raise CorruptState(f"{self.path}: the state database is corrupt ({problems[0]}"
                               + (f" and {len(problems) - 1} more" if len(problems) > 1 else "")
                               + ")")

    def journal_length(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM journal").fetchone()[0])

    # -- compaction -------------------------------------------------------------------------
    def snapshot(self) -> tuple[int, str] | None:
        """(journal position, body) of the latest engine snapshot, or ``None``."""
        row = self.db.execute("SELECT seq, body FROM snapshot WHERE id = 1").fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def snapshot_seq(self) -> int:
        row = self.db.execute("SELECT seq FROM snapshot WHERE id = 1").fetchone()
        return 0 if row is None else int(row[0])

    def compact(self, body: str, step: Callable[[str], None] | None = None) -> int:
        """Replace the journal so far by ``body``, a snapshot of the engine that has consumed
        every journalled batch: one transaction writes the snapshot and deletes the journal
        rows it covers, so a crash at any point leaves the old journal or the new snapshot,
        never neither. Returns the number of rows removed."""
        announce = step if step is not None else (lambda _name: None)
        try:
            announce("begin")
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                (last,) = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM journal").fetchone()
                last = max(int(last), self.snapshot_seq())
                announce("snapshot")
                self.db.execute("INSERT OR REPLACE INTO snapshot (id, seq, body) VALUES (1, ?, ?)",
                                (last, body))
                announce("truncate")
                removed = self.db.execute("DELETE FROM journal WHERE seq <= ?", (last,)).rowcount
                announce("commit")
            announce("done")
            # The deletion went through the write-ahead log: give its space back now, so that
            # the files on disk, not only the rows, stay within the bound.
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None
        self.rows = self.journal_length()
        return int(removed)

    def size_bytes(self, suffix: str | None = None) -> int:
        """Bytes on disk of the database and its write-ahead log (``suffix=""``: the database
        file only, ``"-wal"``: the log only)."""
        total = 0
        for part in ("", "-wal") if suffix is None else (suffix,):
            try:
                total += os.stat(f"{self.path}{part}").st_size
            except OSError:
                pass
        return total

    def put(self, key: str, value: Any) -> None:
        try:
            with self.db:
                self.db.execute("BEGIN")
                self.db.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)",
                                (key, json.dumps(value, separators=(",", ":"))))
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None

    def get(self, key: str, default: Any = None) -> Any:
        try:
            row = self.db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return json.loads(row[0]) if row else default
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None
        except ValueError:
            raise CorruptState(f"{self.path}: the value of {key!r} does not decode") from None


def quarantine(path: Path, now: float | None = None) -> Path:
    """Move a corrupt database and its log files aside (``state.db.corrupt-<UTC time>``);
    returns the new path of the database file."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while any(Path(f"{target}{part}").exists() for part in _FILES):
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
    for part in _FILES:
        try:
            os.replace(f"{path}{part}", f"{target}{part}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StateError(f"{path}{part}: the state database is corrupt and cannot be "
                             f"moved aside ({exc.strerror}); move it away by hand and restart "
                             "malletraind") from None
    return target


def open_checked(state_dir: str | os.PathLike[str], opened: Callable[[Store], T]) -> T:
    """Open the store, check it and call ``opened(store)`` (which recovers from it); when the
    database turns out corrupt on the way, move it aside, log one line that says what was
    lost, and do it again on an empty database. Other errors propagate."""
    store = None
    try:
        store = Store(state_dir)
        store.check()
        return opened(store)
    except CorruptState as exc:
        if store is not None:
            store.close()
        path = Path(state_dir) / "state.db"
        moved = quarantine(path)
        log.error("%s: moved it to %s and started from an empty state; the jobs are read "
                  "again from the batch system, their measured scaling curves are lost and "
                  "measured again", exc, moved.name)
    return opened(Store(state_dir))
