"""PBS tests: every test here is marked ``pbs``; hooks run in fresh processes on the fake."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pbs_testlib import FAKE, FIXTURES, HERE, HOOK


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.pbs)


@dataclass
class HookRun:
    """What one hook run left behind."""

    returncode: int
    record: str
    log: str
    stderr: str
    datagrams: list[bytes]

    @property
    def accepted(self) -> bool:
        return "pbs.event().accept=True" in self.record.splitlines()

    @property
    def reject_msg(self) -> str | None:
        for line in self.record.splitlines():
            if line.startswith("pbs.event().reject_msg="):
                return line.split("=", 1)[1]
        return None

    def messages(self) -> list[dict]:
        return [json.loads(d) for d in self.datagrams]


@pytest.fixture
def hook_dir() -> Iterator[Path]:
    # A short directory: unix socket paths are limited to about 100 bytes.
    path = Path(tempfile.mkdtemp(prefix="mtpbs"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run_hook(hook_dir: Path) -> Callable[..., HookRun]:
    """Run the hook script on a fixture through ``python -m pbs --hook``, the daemon's socket
    listening (unless ``daemon=False``); returns the record, the log and the datagrams."""

    def run(fixture: str | Path, *, config: dict | None = None, daemon: bool = True,
            env: dict[str, str] | None = None, script: Path = HOOK,
            timeout_s: float = 30) -> HookRun:
        sock_path = hook_dir / "hook.sock"
        cfg = {"socket": str(sock_path)}
        cfg.update(config or {})
        cfg_path = hook_dir / "malletrain.json"
        cfg_path.write_text(json.dumps(cfg))
        listener = None
        if daemon:
            if sock_path.exists():
                sock_path.unlink()
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            listener.bind(str(sock_path))
        fixture_path = Path(fixture) if os.sep in str(fixture) else FIXTURES / f"{fixture}.in"
        out, log = hook_dir / "record.out", hook_dir / "hook.log"
        for stale in (out, log):
            if stale.exists():
                stale.unlink()
        run_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(FAKE),
                   "PBS_HOOK_CONFIG_FILE": str(cfg_path), "PYTHONDONTWRITEBYTECODE": "1"}
        run_env.update(env or {})
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pbs", "--hook", "-i", str(fixture_path), "-o", str(out),
                 "-L", str(hook_dir), "-l", log.name, str(script)],
                capture_output=True, text=True, env=run_env, timeout=timeout_s, check=False,
                cwd=hook_dir)   # a mom runs its hooks in its own mom_priv/hooks/tmp
            grams: list[bytes] = []
            if listener is not None:
                listener.setblocking(False)
                while True:
                    try:
                        grams.append(listener.recv(65536))
                    except BlockingIOError:
                        break
        finally:
            if listener is not None:
                listener.close()
                sock_path.unlink()
        return HookRun(proc.returncode, out.read_text() if out.exists() else "",
                       log.read_text() if log.exists() else "", proc.stderr, grams)

    return run
