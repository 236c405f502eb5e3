"""The worker's identity read inside real PBS subjobs, on the nodes MalleTrain chose."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from devtools.localcluster.pbs import REPO, PbsComplex
from devtools.localcluster.pbs_helpers import subjob, submit, wait_state


def test_identity_inside_pbs_subjobs(pbs: PbsComplex, test_user: str) -> None:
    out = Path(tempfile.mkdtemp(prefix="mt-pbs-id-"))
    out.chmod(0o777)
    try:
        # Debian's python3, this checkout on PYTHONPATH: the module needs nothing else.
        script = (f"cd {REPO} && PYTHONPATH={REPO} /usr/bin/python3 -m "
                  f"malletrain_core.worker.identity > {out}/$PBS_ARRAY_INDEX.json\n")
        array = submit(pbs, test_user, "-q", "malletrain", "-J", "1-3", "-l", "select=1:ncpus=1",
                       script=script)
        placed = {1: "n06", 3: "n02"}
        for index, node in placed.items():
            pbs.run(["qrun", "-H", f"({node})", subjob(array, index)])
        for index in placed:
            wait_state(pbs, subjob(array, index), "X", 60)
        for index, node in placed.items():
            got = json.loads((out / f"{index}.json").read_text())
            assert got == {"job": array, "task": str(index), "node": node,
                           "batch_system": "pbs"}, got
    finally:
        shutil.rmtree(out, ignore_errors=True)
