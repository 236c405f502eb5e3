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

from malletrain_core.backends import BATCH_SYSTEMS
from malletrain_core.backends.pbs import parse as pp
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


def test_simulated_slurm_runs_the_golden_replay() -> None:
    """The states the simulated Slurm goes through print as the captured ones do."""
    sim = SlurmSim()
    for name in ("n01", "n02", "n03", "n04"):
        sim.add_node(name)
    sim.submit(1, 3, "root")
    captured = sp.parse_squeue((CAPTURED / "01_submitted.squeue").read_text())
    mine = sp.parse_squeue(sim.squeue())
    assert [(r.state_code, r.priority, r.reason, r.admin_comment) for r in mine] == [
        (r.state_code, r.priority, r.reason, r.admin_comment) for r in captured
        if r.array_id == "1"]


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
