"""A site's own job_submit.lua that loads MalleTrain as a module, inside the real slurmctld.

The site script below does its own thing (it stamps a comment on every job that has none and
refuses jobs named ``forbidden``) and calls MalleTrain's two functions. plugin/job_submit.lua
is installed beside it as ``malletrain.lua``; the lines added to the site script are the ones
slurm_conf/README.md documents. slurmctld reloads job_submit.lua when it changes, so the test
swaps the script in and puts MalleTrain's standalone one back afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import SCRIPT, elastic

from devtools.localcluster import LocalCluster, render_job_submit
from malletrain_core.errors import CommandError

SITE_SCRIPT = """\
-- A site's job_submit.lua: its own policy, and MalleTrain called from it.
package.path = "{etc}/?.lua;" .. package.path
local malletrain = require("malletrain")

function slurm_job_submit(job_desc, part_list, submit_uid)
	if job_desc.name == "forbidden" then
		slurm.log_user("site policy: jobs may not be called forbidden")
		return slurm.ERROR
	end
	local rc = malletrain.job_submit(job_desc, part_list, submit_uid)
	if rc ~= slurm.SUCCESS then return rc end
	if job_desc.comment == nil or job_desc.comment == "" then
		job_desc.comment = "site-checked"
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return malletrain.job_modify(job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
"""


def _swap(path: Path, text: str) -> None:
    path.write_text(text)
    later = time.time() + 2  # a fresh mtime even within the same second
    os.utime(path, (later, later))


@pytest.fixture
def site_script(cluster: LocalCluster) -> Iterator[LocalCluster]:
    etc = cluster.conf_path.parent
    main = etc / "job_submit.lua"
    original = main.read_text()
    (etc / "malletrain.lua").write_text(render_job_submit())
    _swap(main, SITE_SCRIPT.format(etc=etc))
    try:
        yield cluster
    finally:
        _swap(main, original)
        (etc / "malletrain.lua").unlink(missing_ok=True)


def test_site_script_converts_elastic_jobs(site_script: LocalCluster) -> None:
    job = elastic(site_script, "2-3", "--comment=profile=no")
    lines = site_script.run(["squeue", "-h", "-r", "-j", job, "-o", "%i|%P|%T|%r"]).stdout
    assert sorted(lines.split()) == [f"{job}_{i}|preemptable|PENDING|JobHeldUser"
                                     for i in range(3)]
    rec = site_script.show_jobs(job)[0]
    assert rec["AdminComment"] == "malletrain:min=2,max=3,profile=no"
    assert rec["Comment"] == "profile=no"  # the user's own comment stays; the site's not added


def test_site_policy_still_applies(site_script: LocalCluster) -> None:
    job = site_script.sbatch("-N", "1", "--hold", "-o", "/dev/null", script=SCRIPT)
    rec = site_script.show_jobs(job)[0]
    assert rec["Comment"] == "site-checked"
    assert rec.get("AdminComment", "") in ("", "(null)")
    with pytest.raises(CommandError) as err:
        site_script.sbatch("-N", "1", "--hold", "-J", "forbidden", "-o", "/dev/null",
                           script=SCRIPT)
    assert "site policy: jobs may not be called forbidden" in err.value.stderr


def test_site_script_refusals_and_lockout_come_from_malletrain(site_script: LocalCluster,
                                                               test_user: str) -> None:
    with pytest.raises(CommandError) as err:
        elastic(site_script, "1-2", "--comment=min=3")
    assert "give the node range with -N LO-HI, not in --comment" in err.value.stderr
    job = elastic(site_script, "1-2", user=test_user)
    res = site_script.run(["scontrol", "release", f"{job}_0"], user=test_user, check=False)
    assert res.returncode != 0 and "Access/permission denied" in res.stderr
    assert site_script.show_jobs(f"{job}_0")[0]["Reason"] == "JobHeldUser"
    site_script.run(["scontrol", "release", f"{job}_1"])  # root may
    assert site_script.show_jobs(f"{job}_1")[0]["Reason"] != "JobHeldUser"
