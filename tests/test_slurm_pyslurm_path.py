"""The backend contract (tests/backend_contract.py) on the Slurm backend's pyslurm path.

The simulated Slurm answers the pyslurm path's reads and actions (a stand-in for
:class:`~malletrain_core.backends.slurm.pyslurm_reader.PyslurmSource`, whose own calls are
tested on real Slurm in tests/slurm/test_pyslurm_*.py); the backend's runner refuses every
command, so a poll or action that still went through a command fails the scenario. Also the
pure parts of the path: the job lists split as scontrol sends them, and the one place that
chooses the path.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence

import pytest
from backend_contract import SCENARIOS
from world_slurm import PARTITION, SlurmSim

from malletrain_core.backends.slurm import parse as sp
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.backends.slurm.pyslurm_reader import choose, series
from malletrain_core.backends.slurm.pyslurm_rpc import probe, split_job_list
from malletrain_core.errors import CommandError
from malletrain_core.events import Grow
from malletrain_core.runner import CommandRunner


class NoCommands(CommandRunner):
    def _spawn(self, argv, timeout_s, input):  # type: ignore[no-untyped-def]
        raise AssertionError(f"the pyslurm path ran a command: {argv}")


class SimSource:
    """The pyslurm path's interface, answered by the simulated Slurm's state."""

    acts = True

    def __init__(self, sim: SlurmSim) -> None:
        self.sim = sim
        self.calls: list[str] = []

    def _run(self, argv: list[str]) -> str:
        res = self.sim.run(argv, check=False)
        if res.returncode:
            raise CommandError(argv, res.returncode, res.stdout, res.stderr)
        return res.stdout

    def snapshot(self, partition: str) -> dict[str, str]:
        self.calls.append("snapshot")
        return {"sinfo": self._run(["sinfo", "-h", "-N", "-p", partition, "-o",
                                    sp.SINFO_FORMAT]),
                "squeue": self._run(["squeue", "-h", "-r", "-t", "all", "-p", partition, "-O",
                                     sp.SQUEUE_FORMAT]),
                "plan": self._run(["squeue", "-h", "-t", "PD", "--start", "-o",
                                   sp.PLAN_FORMAT])}

    def tasks(self, arrays: Sequence[str]) -> str:
        self.calls.append("tasks")
        return self._run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(arrays), "-O",
                          sp.SQUEUE_FORMAT])

    def scontrol(self, verb: str, jobs: str) -> None:
        self.calls.append(verb)
        self._run(["scontrol", *verb.split(), jobs])

    def grow(self, key: str, node: str, minutes: int) -> None:
        self.calls.append("grow")
        self._run(["scontrol", "update", f"JobId={key}", f"ReqNodeList={node}",
                   "StartTime=now", f"TimeLimit={minutes}"])

    def cancel(self, arrays: Sequence[str]) -> None:
        self.calls.append("cancel")
        self._run(["scancel", *arrays])


class PyslurmPathSim(SlurmSim):
    """The simulated Slurm, seen by a backend through the pyslurm path only."""

    def backend(self) -> SlurmBackend:
        self.source = SimSource(self)
        return SlurmBackend(NoCommands(), partition=PARTITION, grant_timeout_s=120,
                            source=self.source)


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_contract_through_the_pyslurm_path(scenario: str, deferred: bool) -> None:
    world = PyslurmPathSim(deferred=deferred)
    SCENARIOS[scenario](world)
    assert "snapshot" in world.source.calls
    assert "grow" in world.source.calls or scenario == "submit_and_offer"


def test_a_source_that_only_reads_leaves_the_actions_to_the_commands() -> None:
    sim = SlurmSim()
    sim.add_node("n1")
    job = sim.submit(1, 1, "alice")
    source = SimSource(sim)
    source.acts = False  # type: ignore[misc]
    backend = SlurmBackend(sim, partition=PARTITION, source=source)
    backend.poll(0.0)
    assert backend.execute([Grow(job, ("n1",), None)], 1.0) == []
    assert [c[:2] for c in sim.calls if c[0] == "scontrol"] == [["scontrol", "update"],
                                                                ["scontrol", "release"]]
    assert source.calls == ["snapshot"]


def test_job_lists_split_as_scontrol_sends_them() -> None:
    assert split_job_list("9_[0,2-3],10_1,12") == ["9_[0,2-3]", "10_1", "12"]
    assert split_job_list(sp.fold_tasks(["9_0", "9_1", "10_4"])) == ["9_[0-1]", "10_4"]
    assert split_job_list("") == []


def test_the_path_is_the_commands_when_asked_or_when_pyslurm_is_missing() -> None:
    assert choose("off") == (None, 'commands (slurm.pyslurm = "off")')
    src, line = choose("/nonexistent/python3")
    assert src is None
    assert line.startswith("commands (no pyslurm in helper '/nonexistent/python3': ")


def helper_saying(answer: str) -> str:
    """A stand-in helper process: prints ``answer`` as its first line, then ends."""
    return shlex.join([sys.executable, "-c", f"print({answer!r})"])


def test_a_pyslurm_of_another_release_means_the_commands() -> None:
    src, line = choose(helper_saying('{"pyslurm": "25.11.2", "slurm": "24.11.5"}'))
    assert src is None
    assert line.endswith("does not match Slurm 24.11.5: MAJOR.MINOR must be equal)")
    src, line = choose(helper_saying('{"error": "ImportError: no module named pyslurm"}'))
    assert src is None and line.endswith("ImportError: no module named pyslurm)")


def test_a_matching_pyslurm_is_taken_and_says_what_goes_through_it() -> None:
    src, line = choose(helper_saying('{"pyslurm": "24.11.0", "slurm": "24.11.5"}'))
    assert src is not None and src.acts
    assert line.endswith(", Slurm 24.11.5: reads and actions")
    src.close()
    src, line = choose(helper_saying('{"pyslurm": "26.5.0", "slurm": "26.05.1", '
                                     '"no_actions": "layout unknown"}'))
    assert src is not None and not src.acts
    assert line.endswith("reads (actions through the commands: layout unknown)")
    src.close()


def test_release_series_are_compared_as_numbers() -> None:
    assert (series("24.11.5"), series("23.2.1"), series("26.05.1")) == ("24.11", "23.02", "26.05")


def test_a_pyslurm_that_ends_its_process_is_refused_in_one_line() -> None:
    """A libslurm of another release ends the process that loads it (fatal() on the cluster's
    plugins): the helper asks in a forked child first, whose last words become one line, the
    cause and the end; the helper itself lives on."""
    def fatal() -> dict[str, str]:
        os.write(2, b"python: plugin_load_from_file: Incompatible Slurm plugin /x/auth_munge.so "
                    b"version (26.05.3)\npython: error: more\n"
                    b"python: fatal: failed to initialize auth plugin\n")
        os._exit(1)

    info = probe(fatal)
    assert list(info) == ["error"] and "\n" not in info["error"]
    assert info["error"].endswith(
        "ended its process on loading (code 1): python: plugin_load_from_file: Incompatible "
        "Slurm plugin /x/auth_munge.so version (26.05.3); python: fatal: failed to initialize "
        "auth plugin")
    assert probe(lambda: {"pyslurm": "25.11.2", "slurm": "26.05.3"}) == {
        "pyslurm": "25.11.2", "slurm": "26.05.3"}
    assert probe(lambda: time.sleep(5), timeout_s=0.3) == {
        "error": "pyslurm gave no answer within 0.3 s"}


def test_auto_tries_pyslurm_in_another_process_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` never loads a pyslurm in the daemon's process before a helper process of the
    same Python did (whose start asks in a forked child first): a helper that failed or found
    another release means the commands, and this process never imports pyslurm."""
    from malletrain_core.backends.slurm import pyslurm_reader

    def never(self: object) -> None:
        raise AssertionError("pyslurm loaded in the daemon's process")

    monkeypatch.setattr(pyslurm_reader.PyslurmSource, "_in_process", never)
    src, line = choose("auto")  # no pyslurm in this Python here
    assert src is None and "\n" not in line
    assert line.startswith(f"commands (no pyslurm in this Python: command {sys.executable} ")
    assert line.endswith("ModuleNotFoundError: No module named 'pyslurm')")
    assert "pyslurm" not in sys.modules
