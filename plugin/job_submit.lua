--[[
MalleTrain job_submit.lua (Slurm 22.05 or later, JobSubmitPlugins=lua; install it beside
slurm.conf as job_submit.lua).

`sbatch --qos=malletrain -N LO-HI job.sbatch` becomes a HELD job array of HI one-node tasks
in the preemptable partition, tagged in admin_comment with `malletrain:min=LO,max=HI` and the
options the user gave with --comment (e.g. --comment=model=resnet50,profile=no). The MalleTrain
daemon finds the array at its next poll and releases tasks onto idle nodes; Slurm preempts
them when regular jobs need the nodes back.

  -N LO-HI   elastic between LO and HI nodes.
  -N HI      exactly HI nodes (Slurm's own meaning of -N without a range); say -N 1-HI to
             let the job run on fewer.
  no -N      refused: an elastic job needs its node range.

Two ways to install it: as job_submit.lua itself, or, where the site already has a
job_submit.lua, as malletrain.lua which the site's script loads with require("malletrain") and
calls from its own slurm_job_submit and slurm_job_modify (slurm_conf/README.md shows the lines).

Refused, with a message that says how to fix it: LO > HI, HI above MAX_NODES, no batch script
(salloc/srun), a job that already is an array, a malformed --comment.

slurm_job_modify refuses every change to a tagged job (release, hold, update of any field)
unless it comes from root, SlurmUser or a uid in ADMIN_UIDS: the tasks' placement is the
allocator's decision. scancel is not a modification and keeps working for the owner.

Almost no I/O per job: this runs inside slurmctld under its locks. The only command (`id -u`,
to learn SlurmUser's uid from the process that loads this file) runs once, when slurmctld loads
or reloads the script. Each accepted submission (elastic or not: another job's datagram says
"elastic":false) sends one non-blocking datagram to the daemon's hook socket (a few
microseconds; only where Lua's socket module is installed, Debian's lua-socket), so that a daemon polling slowly while nothing changes looks at once.
]]

-- The module name when a site's own job_submit.lua loads this file with require("malletrain");
-- nil when slurmctld loads it as job_submit.lua.
local MODULE_NAME = ...

-- ------------------------------------------------------------------ site settings (edit these)
-- QOS name that marks an elastic submission.
local QOS_NAME = "malletrain"
-- true where slurmdbd defines the malletrain QOS (preempt/qos): the job keeps it. false where
-- partitions do the preemption (preempt/partition_prio) and no such QOS exists.
local KEEP_QOS = false
-- Partition of the elastic tasks (preemptable by the production partitions or QOS).
local PARTITION = "preemptable"
-- Largest HI accepted. Each task counts towards MaxJobCount, and HI - 1 must stay below
-- MaxArraySize (default 1001).
local MAX_NODES = 1000
-- Extra uids (besides root and SlurmUser) allowed to modify tagged jobs, e.g. the uid the
-- MalleTrain daemon runs as when it is not root: { [1234] = true }.
local ADMIN_UIDS = {}
-- The daemon's hook socket (daemon.hook_socket): each elastic submission wakes it.
local HOOK_SOCKET = os.getenv("MALLETRAIN_HOOK_SOCKET") or "/run/malletrain/hook.sock"

-- ------------------------------------------------------------------ implementation
local TAG = "malletrain:"
local NO_VAL = slurm.NO_VAL or 4294967294      -- "not set" (32 bit)
local INFINITE = slurm.INFINITE or 4294967295
local E_NODES = slurm.ESLURM_INVALID_NODE_COUNT or slurm.ERROR
local E_DENIED = slurm.ESLURM_ACCESS_DENIED or slurm.ERROR

local function slurm_user_uid()
	local ok, uid = pcall(function()
		local pipe = io.popen("id -u")
		if not pipe then return nil end
		local out = pipe:read("*l")
		pipe:close()
		return tonumber(out)
	end)
	if ok then return uid end
	return nil
end

-- slurmctld runs as SlurmUser, so the uid of the process that loads this file is SlurmUser's.
local SLURM_USER_UID = slurm_user_uid()

local function is_admin(uid)
	return uid == 0 or uid == SLURM_USER_UID or ADMIN_UIDS[uid] == true
end

local function unset(n)
	return n == nil or n == NO_VAL or n == INFINITE or n == 0
end

-- "model=resnet50,profile=no" -> normalised option string, or nil and the reason.
local function parse_options(comment)
	if comment == nil or comment == "" then return "", nil end
	local parts = {}
	for item in string.gmatch(comment .. ",", "([^,]*),") do
		local key, value = string.match(item, "^%s*([%a_][%w_]*)=([%w_.+/%-]+)%s*$")
		if key == nil then
			return nil, string.format("'%s' is not key=value (letters, digits, _ . + / -)", item)
		end
		if key == "min" or key == "max" then
			return nil, "give the node range with -N LO-HI, not in --comment"
		end
		table.insert(parts, key .. "=" .. value)
	end
	return table.concat(parts, ","), nil
end

-- Lua's socket module, if installed: without it the daemon finds the job at its next poll.
local have_unix, unix = pcall(require, "socket.unix")

-- A count Slurm leaves unset reads NO_VAL (0xfffffffe): only smaller ones are sent.
local function count_field(name, value)
	if type(value) ~= "number" or value < 0 or value >= 2147483647 then return "" end
	return string.format(',"%s":%d', name, value)
end

-- elastic false: a job MalleTrain does not convert (a production job): the daemon then grants
-- no node until Slurm has planned it (daemon side: slurm.unplanned_wait_s). Its requested
-- nodes (-w) and node counts go along: a job that can run only on the nodes it names (as many
-- as it asks for) makes the daemon hold back only the tasks it was starting there.
local function wake_daemon(elastic, job_desc)
	if not have_unix or type(unix) ~= "table" or unix.dgram == nil then return end
	pcall(function()
		local extra = ""
		if not elastic then
			extra = ',"elastic":false'
			local req = job_desc and job_desc.req_nodes
			if type(req) == "string" and req ~= "" and #req <= 1024 and
					string.find(req, "^[%w%-%.%[%],_]+$") then
				extra = extra .. ',"nodes":"' .. req .. '"' ..
					count_field("min_nodes", job_desc.min_nodes) ..
					count_field("max_nodes", job_desc.max_nodes)
			end
		end
		local sock = unix.dgram()
		if sock == nil then return end
		sock:settimeout(0)
		sock:sendto(string.format(
			'{"v":1,"src":"slurm-job-submit","kind":"job_submit","t":%d%s}', os.time(), extra),
			HOOK_SOCKET)
		sock:close()
	end)
end

local function refuse(msg, code)
	slurm.log_user("malletrain: %s", msg)
	return code or slurm.ERROR
end

-- Returns nil (accepted, job_desc rewritten) or an error message and Slurm error code.
local function convert(job_desc)
	if job_desc.script == nil or job_desc.script == "" then
		return "elastic jobs must be batch jobs: submit a script with sbatch --qos=" ..
			QOS_NAME .. " -N LO-HI job.sbatch (not salloc or srun)"
	end
	if job_desc.array_inx ~= nil and job_desc.array_inx ~= "" then
		return "an elastic job is already an array of one-node tasks: drop --array and give " ..
			"the node range with -N LO-HI"
	end
	local lo, hi = job_desc.min_nodes, job_desc.max_nodes
	if lo == 0 and not unset(hi) then
		return string.format("-N 0-%d: an elastic job needs at least one node; write -N 1-%d",
			hi, hi), E_NODES
	end
	if unset(lo) then
		return "give the node range of the elastic job: sbatch --qos=" .. QOS_NAME ..
			" -N LO-HI (e.g. -N 2-8)", E_NODES
	end
	if unset(hi) then hi = lo end
	if lo > hi then
		return string.format("-N %d-%d: the minimum is above the maximum; write -N %d-%d",
			lo, hi, hi, lo), E_NODES
	end
	if hi > MAX_NODES then
		return string.format("-N %d-%d: at most %d nodes on this cluster; write -N %d-%d",
			lo, hi, MAX_NODES, math.min(lo, MAX_NODES), MAX_NODES), E_NODES
	end
	local options, why = parse_options(job_desc.comment)
	if options == nil then
		return "--comment=" .. job_desc.comment .. ": " .. why ..
			"; e.g. --comment=model=resnet50,profile=no"
	end
	local tag = string.format("%smin=%d,max=%d", TAG, lo, hi)
	if options ~= "" then tag = tag .. "," .. options end
	job_desc.admin_comment = tag
	job_desc.array_inx = string.format("0-%d", hi - 1)
	job_desc.min_nodes = 1
	job_desc.max_nodes = 1
	job_desc.priority = 0        -- held (JobHeldUser) until the daemon releases a task
	job_desc.requeue = 1         -- preemption requeues the task instead of cancelling it
	if PARTITION ~= nil and PARTITION ~= "" then job_desc.partition = PARTITION end
	if not KEEP_QOS then job_desc.qos = "" end  -- "": no QOS (the setter takes no nil)
	job_desc.shared = slurm.JOB_SHARED_NONE or 0  -- a whole node per task, like --exclusive
	return nil
end

-- Returns slurm.SUCCESS for a job MalleTrain does not touch or has converted, else the
-- error code of a refusal (the user sees the message).
local function job_submit(job_desc, part_list, submit_uid)
	if job_desc.qos ~= QOS_NAME then
		wake_daemon(false, job_desc)
		return slurm.SUCCESS
	end
	local err, code = convert(job_desc)
	if err ~= nil then return refuse(err, code) end
	wake_daemon(true)
	return slurm.SUCCESS
end

local function job_modify(job_desc, job_rec, part_list, modify_uid)
	if is_admin(modify_uid) then return slurm.SUCCESS end
	local tagged = job_rec.admin_comment ~= nil and
		string.sub(job_rec.admin_comment, 1, #TAG) == TAG
	if tagged then
		return refuse(string.format("job %s is an elastic job: the MalleTrain daemon starts " ..
			"and stops its tasks, so it cannot be held, released or updated; use scancel " ..
			"to end it", tostring(job_rec.job_id)), E_DENIED)
	end
	if job_desc.qos == QOS_NAME then
		return refuse("a job cannot be moved into the " .. QOS_NAME .. " QOS: submit it " ..
			"anew with sbatch --qos=" .. QOS_NAME .. " -N LO-HI", E_DENIED)
	end
	return slurm.SUCCESS
end

-- Loaded with require (a site's own job_submit.lua calls these two; see
-- slurm_conf/README.md): return them and define no Slurm entry points.
if type(MODULE_NAME) == "string" then
	return {job_submit = job_submit, job_modify = job_modify, is_elastic = function(job_rec)
		return job_rec ~= nil and job_rec.admin_comment ~= nil and
			string.sub(job_rec.admin_comment, 1, #TAG) == TAG
	end}
end

-- Installed as job_submit.lua itself: these are Slurm's entry points.
function slurm_job_submit(job_desc, part_list, submit_uid)
	return job_submit(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return job_modify(job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
