"""The one way MalleTrain runs a batch-system command.

An argument list (never a shell string), a timeout, the command logged at debug level, and a
typed error carrying the command, exit code, stdout and stderr.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import CommandError, CommandNotFound, CommandTimeout

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float


def with_bin_dir(bin_dir: str, timeout_s: float) -> CommandRunner:
    """A runner for a batch system's commands, ``bin_dir`` first on PATH when given."""
    env = dict(os.environ)
    if bin_dir:
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    # Absolute times in Slurm's output: the backfill plan's hole ends depend on it.
    env.pop("SLURM_TIME_FORMAT", None)
    return CommandRunner(timeout_s=timeout_s, env=env)


class CommandRunner:
    """Runs commands; subclass or replace ``_spawn`` in unit tests (the subprocess boundary)."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S,
                 env: Mapping[str, str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.env = dict(env) if env is not None else None

    def run(self, argv: Sequence[str], *, timeout_s: float | None = None, check: bool = True,
            input: str | None = None) -> Result:
        argv = [str(a) for a in argv]
        timeout = self.timeout_s if timeout_s is None else timeout_s
        log.debug("run: %s", argv)
        t0 = time.monotonic()
        try:
            proc = self._spawn(argv, timeout, input)
        except FileNotFoundError:
            raise CommandNotFound(argv, None, "", "", reason=f"{argv[0]}: not found; install it "
                                  "or put it on PATH") from None
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise CommandTimeout(argv, None, out, err,
                                 reason=f"no answer within {timeout:g} s") from None
        result = Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr,
                        time.monotonic() - t0)
        if check and proc.returncode != 0:
            raise CommandError(argv, proc.returncode, proc.stdout, proc.stderr)
        return result

    def start(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        """A long-lived helper process, its stdin and stdout piped as text (an argument list,
        no shell, this runner's environment); the caller talks to it and ends it."""
        argv = [str(a) for a in argv]
        log.debug("start: %s", argv)
        try:
            return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True, env=self.env)
        except FileNotFoundError:
            raise CommandNotFound(argv, None, "", "", reason=f"{argv[0]}: not found; install it "
                                  "or put it on PATH") from None

    def _spawn(self, argv: list[str], timeout_s: float,
               input: str | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              input=input, env=self.env, check=False)
