"""The real local Slurm cluster for the integration tests.

One cluster per session (8 virtual nodes of 2 CPUs, test-friendly timings) in a fresh temp
directory on its own free ports, so that other clusters on the host do not matter; stopped at
the end. Every test in this directory is marked ``slurm``. After each test every job is
cancelled; after a failed test sinfo, squeue and the daemon logs are printed.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from slurm_helpers import after_test, cluster_root, start_cluster

from devtools.localcluster import LocalCluster
from devtools.localcluster.releases import release
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.backends.slurm.pyslurm_reader import PyslurmSource, choose
from malletrain_core.runner import CommandRunner
from malletrain_core.wire.hooks import HookSocket

HERE = Path(__file__).resolve().parent
TEST_USER = "mtuser1"
NODES = int(os.environ.get("MALLETRAIN_TEST_NODES", "8"))


# Real daemons, real Slurm and real torch share this host's few cores with every test: a
# scheduling-dependent wait in these files can time out under load. Each gets one rerun (a
# real fault fails twice); every rerun is listed at the end of the run with why its first try
# failed (tests/conftest.py).
RERUN_ONCE = {"test_backend_live.py", "test_training_e2e.py", "test_faults.py", "test_faults_site.py",
              "test_daemon_live.py", "test_demo.py", "test_load.py", "test_byo_e2e.py",
              "test_quiet_poll.py", "test_inplace_slurm.py", "test_inplace_nproc_slurm.py",
              "test_prod_race.py",
              "test_liveness.py", "test_view_live.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rerun = config.pluginmanager.hasplugin("rerunfailures")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slurm)
            if rerun and Path(str(item.fspath)).name in RERUN_ONCE:
                item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=5))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def installed_here() -> str | None:
    """None when the batch jobs' Python imports malletrain_core from this checkout (they run
    outside it, so they get the installed package); else the one-line error to stop on. Seen:
    an editable install left pointing at a clean clone, and every training job failing with
    "No module named 'malletrain_core'" at each of its epochs."""
    import sys

    root = HERE.parents[1]
    found = subprocess.run([sys.executable, "-c",
                            "import malletrain_core; print(malletrain_core.__file__)"],
                           cwd="/", capture_output=True, text=True, check=False)
    where = found.stdout.strip()
    if where and root in Path(where).resolve().parents:
        return None
    return (f"the batch jobs would import malletrain_core from {where or 'nowhere'}, not "
            f"from {root}: run `{sys.executable} -m pip install --no-deps -e {root}`")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """The session's cluster: partition mode, test-friendly timings."""
    wrong = installed_here()
    if wrong:
        pytest.exit(wrong, returncode=4)
    with cluster_root("slurm") as root:
        cluster = start_cluster(root, nodes=NODES)
        try:
            yield cluster
        finally:
            elapsed = cluster.stop()
            print(f"local cluster stopped in {elapsed:.2f} s")


@pytest.fixture
def cluster(request: pytest.FixtureRequest, slurm_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The session cluster, emptied after the test (dumped first if the test failed)."""
    yield slurm_cluster
    after_test(request, slurm_cluster)


@pytest.fixture(scope="session")
def test_user() -> str:
    """A second real (non-root) user to submit as: ``cluster.run(argv, user=test_user)``.
    Created with useradd when missing and kept (other test sessions may use it too)."""
    try:
        subprocess.run(["id", TEST_USER], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        proc = subprocess.run(["useradd", "-m", TEST_USER], capture_output=True, text=True,
                              check=False)
        if proc.returncode not in (0, 9):  # 9: created by a concurrent session meanwhile
            pytest.skip(f"cannot create user {TEST_USER}: {proc.stderr.strip()}")
        # A chrooted release's slurmctld, started before the user existed, must know it too.
        release().sync_users()
    return TEST_USER


@pytest.fixture
def hook_listener(slurm_cluster: LocalCluster) -> Iterator[HookSocket]:
    """The daemon's side of the hook socket that the cluster's EpilogSlurmctld sends to."""
    with HookSocket(slurm_cluster.hook_socket) as listener:
        yield listener


def pyslurm_helper(cluster: LocalCluster) -> str:
    """The ``slurm.pyslurm`` setting of the cluster's pyslurm helper (the chroot's Python with
    the pyslurm ``scripts/setup-slurm-matrix.sh pyslurm`` built); skips where there is none
    (22.05 and 26.05: no pyslurm exists for them; test_pyslurm_mismatch.py gives 26.05 the
    pyslurm of 25.11)."""
    rel = cluster.release
    helper = rel.pyslurm_helper()
    if rel.pyslurm is None:
        pytest.skip(f"no pyslurm exists for Slurm {rel.name}")
    if helper is None and os.environ.get("MALLETRAIN_REQUIRE_PYSLURM"):
        pytest.fail(f"no pyslurm for Slurm {rel.name}: run "
                    "scripts/setup-slurm-matrix.sh pyslurm (make setup-matrix does)")
    if helper is None:
        pytest.skip(f"no pyslurm for Slurm {rel.name} here (scripts/setup-slurm-"
                    "matrix.sh pyslurm builds those of 24.11 and 25.11)")
    return helper


@pytest.fixture
def pyslurm_source(cluster: LocalCluster) -> Iterator[PyslurmSource]:
    """The backend's pyslurm path on this cluster, chosen as the daemon chooses it; it must
    take pyslurm for reads and actions."""
    src, line = choose(pyslurm_helper(cluster), cluster.env)
    assert src is not None and src.acts, line
    yield src
    src.close()


class Recording(CommandRunner):
    """A runner that records every command it starts."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env=env)
        self.calls: list[list[str]] = []

    def _spawn(self, argv, timeout_s, input):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        return super()._spawn(argv, timeout_s, input)


@pytest.fixture(params=["commands", "pyslurm"])
def backend_path(request: pytest.FixtureRequest,
                 cluster: LocalCluster) -> Iterator[Callable[..., SlurmBackend]]:
    """A SlurmBackend factory for each path: the commands, and pyslurm (reads and actions),
    whose backends must not start a single command process."""
    runner = Recording(cluster.env)
    src = None
    if request.param == "pyslurm":
        src, line = choose(pyslurm_helper(cluster), cluster.env)
        assert src is not None and src.acts, line

    def make(**kwargs: object) -> SlurmBackend:
        return SlurmBackend(runner, source=src, **kwargs)  # type: ignore[arg-type]

    yield make
    if src is not None:
        src.close()
        assert runner.calls == [], f"the pyslurm path ran commands: {runner.calls}"
    else:
        assert runner.calls, "the commands path ran no command"


@pytest.fixture
def outdir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A folder every job's tasks may write their output to; its task-*.out files' tails are
    printed if the test failed."""
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    yield out
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for path in sorted(out.glob("task-*.out")):
            print(f"\n==== {path.name} (tail) ====")
            print("\n".join(path.read_text(errors="replace").splitlines()[-25:]))
