"""Every registered batch system passes the one backend contract (tests/backend_contract.py).

A batch system plugs in with a world (tests/world_<name>.py) and one line in :data:`WORLDS`;
the simulated Slurm and PBS are checked against the outputs captured from the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from backend_contract import SCENARIOS, World
from world_pbs import PbsSim
from world_slurm import SlurmSim
from world_toy import ToyWorld

from malletrain_core.backends.pbs import parse as pp
from malletrain_core.backends.registry import BATCH_SYSTEMS
from malletrain_core.backends.slurm import parse as sp

CAPTURED = Path(__file__).parent / "golden" / "slurm" / "22.05"
PBS_GOLDEN = Path(__file__).parent / "pbs" / "golden"

WORLDS: dict[str, type[World]] = {
    "slurm": SlurmSim,
    "pbs": PbsSim,
    "toy": ToyWorld,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("batch_system", sorted(BATCH_SYSTEMS))
def test_contract(batch_system: str, scenario: str) -> None:
    world = WORLDS.get(batch_system)
    assert world is not None, (f"batch system {batch_system!r} has no world: write "
                               f"tests/world_{batch_system}.py and add it to WORLDS")
    SCENARIOS[scenario](world())


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_contract_on_slurm_starting_tasks_at_its_next_scheduling_pass(scenario: str) -> None:
    """Slurm starts a released task at a later scheduling pass: a shrink, or a node taken,
    before that pass meets a task still pending, not a running one."""
    SCENARIOS[scenario](SlurmSim(deferred=True))


def test_every_world_is_a_registered_batch_system() -> None:
    assert set(WORLDS) == set(BATCH_SYSTEMS)


# ----------------------------------------------------------------------------- golden formats
STEPS = sorted({p.stem for p in CAPTURED.glob("*.squeue")})


@pytest.mark.parametrize("step", STEPS)
def test_simulated_slurm_prints_what_slurm_printed(step: str) -> None:
    """A captured poll loaded into the simulated Slurm is printed back line for line."""
    squeue = (CAPTURED / f"{step}.squeue").read_text()
    sinfo = (CAPTURED / f"{step}.sinfo").read_text()
    sim = SlurmSim.from_capture(squeue, sinfo)
    assert sorted(sim.squeue().splitlines()) == sorted(squeue.splitlines())
    assert sim.sinfo().splitlines() == sorted(sinfo.splitlines())
    assert sorted(sp.parse_squeue(sim.squeue()), key=repr) == sorted(sp.parse_squeue(squeue),
                                                                       key=repr)
    captured = sp.parse_plan((CAPTURED / f"{step}.plan").read_text())
    ours = {(r.array_id, r.partition) for r in captured if r.partition == "preemptable"}
    assert {(r.array_id, r.partition) for r in sp.parse_plan(sim.plan())} <= ours


def test_simulated_slurm_goes_through_the_captured_states() -> None:
    """The recorded session's steps, played on the simulated Slurm: each task shows the
    state, hold, reason, restart count and node the real Slurm showed at that step."""
    sim = SlurmSim()
    for name in ("n01", "n02", "n03", "n04"):
        sim.add_node(name)
    assert sim.submit(1, 3, "root") == "1"

    def seen(text: str) -> dict[str, tuple]:
        return {r.key: (r.state_code, r.priority == 0, r.reason, r.restarts, r.node, r.user,
                        r.admin_comment) for r in sp.parse_squeue(text) if r.array_id == "1"}

    def check(step: str, *keys: str) -> None:
        captured, mine = seen((CAPTURED / f"{step}.squeue").read_text()), seen(sim.squeue())
        assert {k: mine[k] for k in keys} == {k: captured[k] for k in keys}, step

    check("01_submitted", "1_0", "1_1", "1_2")
    for key, node in (("1_0", "n02"), ("1_1", "n03")):
        sim.run(["scontrol", "update", f"JobId={key}", f"ReqNodeList={node}", "StartTime=now",
                 "TimeLimit=60"])
    sim.run(["scontrol", "release", "1_[0-1]"])
    check("02_running_unheld", "1_0", "1_1", "1_2")
    sim.run(["scontrol", "hold", "1_[0-1]"])
    check("03_running", "1_0", "1_1", "1_2")
    sim.take("n03")
    check("04_preempted", "1_0", "1_1", "1_2")
    sim.run(["scontrol", "requeuehold", "1_0"])
    check("05_shrunk", "1_0", "1_1", "1_2")
    sim.run(["scancel", "1"])
    assert {k: v[0] for k, v in seen(sim.squeue()).items()} == {
        k: v[0] for k, v in seen((CAPTURED / "11_cancelled.squeue").read_text()).items()}


@pytest.mark.parametrize("pbsnodes,qstat", [("pbsnodes_1.json", "qstat_1.json"),
                                            ("pbsnodes_2.json", "qstat_2.json"),
                                            ("pbsnodes_2.json", "qstat_3.json"),
                                            ("pbsnodes_2.json", "qstat_4.json"),
                                            ("pbsnodes_2.json", "qstat_empty.json")])
def test_simulated_pbs_prints_what_pbs_printed(pbsnodes: str, qstat: str) -> None:
    """Captured qstat/pbsnodes documents loaded into the simulated PBS read back the same,
    and every key it prints is one PBS printed."""

    q_text, n_text = (PBS_GOLDEN / qstat).read_text(), (PBS_GOLDEN / pbsnodes).read_text()
    sim = PbsSim.from_capture(q_text, n_text)
    ours = {j: job for j, job in pp.parse_qstat(q_text).items() if job.queue == "mt_preemptable"}
    assert pp.parse_qstat(sim.qstat()) == ours
    assert pp.parse_pbsnodes(sim.pbsnodes()) == pp.parse_pbsnodes(n_text)
    doc, golden = json.loads(sim.qstat()), json.loads(q_text)
    assert doc.keys() == golden.keys()
    known = {k for job in golden.get("Jobs", {}).values() for k in job}
    assert {k for job in doc.get("Jobs", {}).values() for k in job} <= known
    known_nodes = {k for node in json.loads(n_text)["nodes"].values() for k in node}
    assert {k for node in json.loads(sim.pbsnodes())["nodes"].values() for k in node} <= \
        known_nodes


def test_simulated_pbs_prints_a_submitted_array_as_pbs_does() -> None:

    sim = PbsSim()
    sim.free("n01")
    aid = sim.submit(2, 4, "alice")
    sim.jobs[aid.replace("[]", "[1]")].state = "Q"
    assert sim.run(["qrun", "-a", "-H", "(n01)", aid.replace("[]", "[1]")]).returncode == 0
    golden = json.loads((PBS_GOLDEN / "qstat_1.json").read_text())["Jobs"]
    for jid, job in json.loads(sim.qstat())["Jobs"].items():
        like = golden["123[].pbs-server" if jid.endswith("[].pbs-server") else
                      "123[1].pbs-server"]
        assert job.keys() <= like.keys(), jid
        assert {k: type(v) for k, v in job.items()} == {k: type(like[k]) for k in job}, jid
