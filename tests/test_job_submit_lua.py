"""plugin/job_submit.lua's logic outside Slurm: Lua 5.1 (the Lua Slurm 22.05 links) runs the
plugin against a stand-in of the `slurm` table that slurmctld provides. The same conversions
are checked through a real slurmctld in tests/slurm/test_job_submit.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from devtools.localcluster import JOB_SUBMIT_LUA, render_job_submit

LUA = shutil.which("lua5.1")
pytestmark = pytest.mark.skipif(LUA is None, reason="lua5.1 not installed "
                                "(scripts/setup-machine.sh installs it)")

NO_VAL = 4294967294
SUCCESS, ERROR, E_NODES, E_DENIED = 0, -1, 2006, 2002

HARNESS = """
messages = {}
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, INFINITE = 4294967295,
         ESLURM_INVALID_NODE_COUNT = 2006, ESLURM_ACCESS_DENIED = 2002, JOB_SHARED_NONE = 0,
         log_user = function(fmt, ...) table.insert(messages, string.format(fmt, ...)) end}
assert(dofile(%s) == slurm.SUCCESS)
local job_desc = %s
local rc
if %s then
  rc = slurm_job_modify(job_desc, %s, {}, %d)
else
  rc = slurm_job_submit(job_desc, {}, 1000)
end
print("rc\\t" .. rc)
for k, v in pairs(job_desc) do print("field\\t" .. k .. "\\t" .. tostring(v)) end
for _, m in ipairs(messages) do print("msg\\t" .. m) end
"""


def lua_value(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_value(k)}] = {lua_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=True)


def run_lua(job_desc: dict[str, object], *, modify_uid: int | None = None,
            job_rec: dict[str, object] | None = None, plugin: Path = JOB_SUBMIT_LUA,
            path_prefix: Path | None = None) -> tuple[int, dict[str, str], list[str]]:
    modify = modify_uid is not None
    code = HARNESS % (lua_value(str(plugin)), lua_value(job_desc), lua_value(modify),
                      lua_value(job_rec or {}), modify_uid or 0)
    env = dict(os.environ)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    proc = subprocess.run([str(LUA), "-"], input=code, capture_output=True, text=True,
                          timeout=30, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    rc, fields, msgs = None, {}, []
    for line in proc.stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "rc":
            rc = int(rest)
        elif kind == "field":
            key, _, value = rest.partition("\t")
            fields[key] = value
        elif kind == "msg":
            msgs.append(rest)
    assert rc is not None, proc.stdout
    return rc, fields, msgs


def submission(**kw: object) -> dict[str, object]:
    job: dict[str, object] = {"qos": "malletrain", "min_nodes": 2, "max_nodes": 4,
                              "script": "#!/bin/sh"}
    job.update(kw)
    return {k: v for k, v in job.items() if v is not None}


def test_range_becomes_held_array_of_one_node_tasks() -> None:
    rc, f, msgs = run_lua(submission())
    assert rc == SUCCESS and msgs == []
    assert f["array_inx"] == "0-3"
    assert (f["min_nodes"], f["max_nodes"]) == ("1", "1")
    assert (f["priority"], f["requeue"], f["shared"]) == ("0", "1", "0")
    assert f["partition"] == "preemptable"
    assert f["qos"] == ""
    assert f["admin_comment"] == "malletrain:min=2,max=4"


def test_user_options_from_comment_are_tagged() -> None:
    rc, f, _ = run_lua(submission(comment=" model=resnet50 ,profile=no"))
    assert rc == SUCCESS
    assert f["admin_comment"] == "malletrain:min=2,max=4,model=resnet50,profile=no"


@pytest.mark.parametrize("max_nodes", [NO_VAL, 0, None])
def test_count_without_range_means_exactly_that_many(max_nodes: int | None) -> None:
    rc, f, _ = run_lua(submission(min_nodes=3, max_nodes=max_nodes))
    assert rc == SUCCESS
    assert f["admin_comment"] == "malletrain:min=3,max=3"
    assert f["array_inx"] == "0-2"


def test_other_jobs_are_untouched() -> None:
    job = submission(qos="normal")
    rc, f, msgs = run_lua(job)
    assert rc == SUCCESS and msgs == []
    assert f == {k: str(v) for k, v in job.items()}


@pytest.mark.parametrize("job, code, says", [
    (submission(min_nodes=5, max_nodes=2), E_NODES,
     "-N 5-2: the minimum is above the maximum; write -N 2-5"),
    (submission(min_nodes=NO_VAL, max_nodes=NO_VAL), E_NODES, "give the node range"),
    (submission(min_nodes=2, max_nodes=5000), E_NODES,
     "-N 2-5000: at most 1000 nodes on this cluster; write -N 2-1000"),
    (submission(script=None), ERROR, "must be batch jobs: submit a script with sbatch"),
    (submission(script=""), ERROR, "must be batch jobs"),
    (submission(array_inx="0-7"), ERROR, "drop --array"),
    (submission(comment="resnet 50"), ERROR, "'resnet 50' is not key=value"),
    (submission(comment="min=1"), ERROR, "give the node range with -N LO-HI, not in --comment"),
    (submission(comment="model=a,,x=1"), ERROR, "'' is not key=value"),
])
def test_impossible_requests_are_refused(job: dict[str, object], code: int, says: str) -> None:
    rc, f, msgs = run_lua(job)
    assert rc == code
    assert len(msgs) == 1 and msgs[0].startswith("malletrain: ") and says in msgs[0]
    assert "admin_comment" not in f


def test_keep_qos_setting(tmp_path: Path) -> None:
    plugin = tmp_path / "job_submit.lua"
    plugin.write_text(render_job_submit(keep_qos=True))
    rc, f, _ = run_lua(submission(), plugin=plugin)
    assert rc == SUCCESS
    assert f["qos"] == "malletrain"
    assert f["admin_comment"] == "malletrain:min=2,max=4"


TAGGED = {"job_id": 12, "admin_comment": "malletrain:min=1,max=4"}


def test_user_cannot_modify_tagged_job() -> None:
    rc, _, msgs = run_lua({"priority": 1}, modify_uid=1000, job_rec=TAGGED)
    assert rc == E_DENIED
    assert msgs and "job 12 is an elastic job" in msgs[0] and "scancel" in msgs[0]


def test_root_may_modify_tagged_job() -> None:
    rc, _, msgs = run_lua({"priority": 1}, modify_uid=0, job_rec=TAGGED)
    assert (rc, msgs) == (SUCCESS, [])


def test_slurm_user_learned_at_load_may_modify(tmp_path: Path) -> None:
    fake_id = tmp_path / "id"
    fake_id.write_text("#!/bin/sh\necho 4242\n")
    fake_id.chmod(fake_id.stat().st_mode | stat.S_IXUSR)
    rc, _, _ = run_lua({"priority": 1}, modify_uid=4242, job_rec=TAGGED, path_prefix=tmp_path)
    assert rc == SUCCESS
    rc, _, _ = run_lua({"priority": 1}, modify_uid=4242, job_rec=TAGGED)
    assert rc == E_DENIED


def test_user_may_modify_own_untagged_job_but_not_into_the_qos() -> None:
    plain = {"job_id": 13, "admin_comment": None}
    assert run_lua({"comment": "x"}, modify_uid=1000, job_rec=plain)[0] == SUCCESS
    rc, _, msgs = run_lua({"qos": "malletrain"}, modify_uid=1000, job_rec=plain)
    assert rc == E_DENIED and "cannot be moved into the malletrain QOS" in msgs[0]


def test_no_io_at_job_time() -> None:
    """The only command (`id -u`) is in the function called once at load; the only I/O at job
    time is one datagram, sent without blocking and inside pcall (an error or a missing socket
    module never fails a submission)."""
    text = JOB_SUBMIT_LUA.read_text()
    text = text[text.index("]]") + 2:]  # after the header comment
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    start = code.index("local function slurm_user_uid")
    loader = code[start:code.index("\nend\n", start)]
    start = code.index("local function wake_daemon")
    wake = code[start:code.index("\nend\n", start)]
    at_load = [line for line in code.splitlines()
               if line.startswith(("local HOOK_SOCKET = os.getenv(",
                                   'local have_unix, unix = pcall(require, "socket.unix")'))]
    assert len(at_load) == 2
    rest = code.replace(loader, "").replace(wake, "")
    for line in at_load:
        rest = rest.replace(line, "")
    assert "io.popen" in loader
    assert "pcall(function()" in wake and wake.index("settimeout(0)") < wake.index("sendto(")
    assert "os.execute" not in wake and "popen" not in wake
    for call in ("io.", "os.", "require", "popen", "socket", "dofile", "loadfile"):
        assert call not in rest, call
