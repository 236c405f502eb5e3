"""One exception tree for the whole project.

Every error a user can cause carries a one-line message that says what is wrong and how to
fix it; the CLI prints ``str(err)`` and exits non-zero, tracebacks only with ``--debug``.
"""

from __future__ import annotations


class MalleTrainError(Exception):
    """Base of every error MalleTrain raises on purpose."""

    exit_code = 1


class ValidationError(MalleTrainError, ValueError):
    """Input that cannot be meant: names the object and the field at fault."""

    exit_code = 2

    def __init__(self, where: str, field: str, problem: str) -> None:
        self.where = where
        self.field = field
        self.problem = problem
        super().__init__(f"{where}: {field}: {problem}")


class InputFileError(MalleTrainError):
    """A file (problem JSON, trace, config) that cannot be read or parsed."""

    exit_code = 2

    def __init__(self, path: str, problem: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        loc = f"{path}:{line}" if line is not None else path
        super().__init__(f"{loc}: {problem}")


class SolverError(MalleTrainError):
    """A solver did not prove optimality (or the model is infeasible)."""


class InfeasibleError(SolverError):
    """The side constraints admit no allocation at all."""


class ConfigError(MalleTrainError):
    """A configuration file or value that cannot be used."""

    exit_code = 2


class CommandError(MalleTrainError):
    """A batch-system command failed: carries the command, exit code and output."""

    def __init__(self, argv: list[str], returncode: int | None, stdout: str, stderr: str,
                 reason: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        detail = reason or (stderr.strip().splitlines()[-1] if stderr.strip() else
                            f"exit code {returncode}")
        super().__init__(f"command {' '.join(self.argv[:3])}{' ...' if len(self.argv) > 3 else ''}"
                         f" failed: {detail}")


class CommandTimeout(CommandError):
    """A batch-system command did not answer within its timeout."""


class CommandNotFound(CommandError):
    """The batch-system command is not installed or not on PATH."""
