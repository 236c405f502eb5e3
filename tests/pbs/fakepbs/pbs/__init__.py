"""A clean-room fake of the PBS hook-side ``pbs`` module, for tests only.

It reproduces the documented contract that MalleTrain's hooks rely on (OpenPBS's pbs_module(7B)
man page and its hooks documentation; the numeric values are PBS's own): integer event types
and vnode state bits, one ``event()`` per process with per-event parameters (asking an event
for a parameter it does not have raises :class:`EventIncompatibleError`), ``accept`` and
``reject`` ending the hook with ``SystemExit``, :class:`UnsetAttributeNameError` for unknown
attributes, ``logmsg``, ``server()``, and ``hook_config_filename`` (from the
``PBS_HOOK_CONFIG_FILE`` environment variable, which the PBS server sets too). The hook alarm
is delivered by the runner (``python -m pbs --hook ...``) as ``KeyboardInterrupt``.

Two test knobs, both off by default: ``FAKEPBS_PARAM_DELAY_S`` makes the first read of an event
parameter that slow (a busy server, so that the alarm fires inside the hook), and
``FAKEPBS_FAIL=<parameter>|server`` makes that read, or ``pbs.server()``, raise RuntimeError.

No code of OpenPBS is used. Only what MalleTrain's hooks touch is modelled; anything else is
absent rather than guessed.
"""

from __future__ import annotations

import os
import sys
import time

# Event types (bits): PBS's HOOK_EVENT_* values.
QUEUEJOB = 0x01
MODIFYJOB = 0x02
RESVSUB = 0x04
MOVEJOB = 0x08
RUNJOB = 0x10
PROVISION = 0x20
EXECJOB_BEGIN = 0x40
EXECJOB_PROLOGUE = 0x80
EXECJOB_EPILOGUE = 0x100
EXECJOB_END = 0x200
EXECJOB_PRETERM = 0x400
EXECJOB_LAUNCH = 0x800
EXECHOST_PERIODIC = 0x1000
EXECHOST_STARTUP = 0x2000
EXECJOB_ATTACH = 0x4000
PERIODIC = 0x8000
RESV_END = 0x10000
EXECJOB_RESIZE = 0x20000
EXECJOB_ABORT = 0x40000
EXECJOB_POSTSUSPEND = 0x80000
EXECJOB_PRERESUME = 0x100000
MANAGEMENT = 0x200000
MODIFYVNODE = 0x400000
JOBOBIT = 0x800000
RESV_BEGIN = 0x1000000
RESV_CONFIRM = 0x2000000
MODIFYRESV = 0x4000000
POSTQUEUEJOB = 0x8000000
MOM_EVENTS = (EXECJOB_BEGIN | EXECJOB_PROLOGUE | EXECJOB_EPILOGUE | EXECJOB_END
              | EXECJOB_PRETERM | EXECJOB_LAUNCH | EXECHOST_PERIODIC | EXECHOST_STARTUP
              | EXECJOB_ATTACH | EXECJOB_RESIZE | EXECJOB_ABORT | EXECJOB_POSTSUSPEND
              | EXECJOB_PRERESUME)

# Vnode state bits: free is the absence of every bit.
ND_FREE = ND_STATE_FREE = 0x0
ND_OFFLINE = ND_STATE_OFFLINE = 0x1
ND_DOWN = ND_STATE_DOWN = 0x2
ND_STATE_DELETED = 0x4
ND_UNRESOLVABLE = ND_STATE_UNRESOLVABLE = 0x8
ND_JOBBUSY = ND_STATE_JOBBUSY = 0x10
ND_STALE = ND_STATE_STALE = 0x20
ND_JOB_EXCLUSIVE = ND_STATE_JOB_EXCLUSIVE = 0x40
ND_BUSY = ND_STATE_BUSY = 0x80
ND_STATE_UNKNOWN = 0x100
ND_STATE_NEEDS_HELLOSVR = 0x200
ND_STATE_INIT = 0x400
ND_PROV = ND_STATE_PROV = 0x800
ND_WAIT_PROV = ND_STATE_WAIT_PROV = 0x1000
ND_RESV_EXCLUSIVE = ND_STATE_RESV_EXCLUSIVE = 0x2000
ND_STATE_OFFLINE_BY_MOM = 0x4000
ND_STATE_MARKEDDOWN = 0x8000
ND_STATE_NEED_ADDRS = 0x10000
ND_STATE_MAINTENANCE = 0x20000
ND_SLEEP = ND_STATE_SLEEP = 0x40000
ND_STATE_NEED_CREDENTIALS = 0x80000

# Job states as the module numbers them.
JOB_STATE_TRANSIT, JOB_STATE_QUEUED, JOB_STATE_HELD, JOB_STATE_WAITING = 0, 1, 2, 3
JOB_STATE_RUNNING, JOB_STATE_EXITING, JOB_STATE_EXPIRED, JOB_STATE_BEGUN = 4, 5, 6, 7
JOB_STATE_MOVED, JOB_STATE_FINISHED = 8, 9

LOG_DEBUG = 5
LOG_WARNING = 6
LOG_ERROR = 7

EVENT_NAMES = {
    "queuejob": QUEUEJOB, "postqueuejob": POSTQUEUEJOB, "modifyjob": MODIFYJOB,
    "resvsub": RESVSUB, "modifyresv": MODIFYRESV, "movejob": MOVEJOB, "runjob": RUNJOB,
    "provision": PROVISION, "periodic": PERIODIC, "resv_confirm": RESV_CONFIRM,
    "resv_begin": RESV_BEGIN, "resv_end": RESV_END, "management": MANAGEMENT,
    "jobobit": JOBOBIT, "modifyvnode": MODIFYVNODE, "execjob_begin": EXECJOB_BEGIN,
    "execjob_prologue": EXECJOB_PROLOGUE, "execjob_epilogue": EXECJOB_EPILOGUE,
    "execjob_end": EXECJOB_END, "execjob_preterm": EXECJOB_PRETERM,
    "execjob_launch": EXECJOB_LAUNCH, "execjob_attach": EXECJOB_ATTACH,
    "execjob_resize": EXECJOB_RESIZE, "execjob_abort": EXECJOB_ABORT,
    "execjob_postsuspend": EXECJOB_POSTSUSPEND, "execjob_preresume": EXECJOB_PRERESUME,
    "exechost_periodic": EXECHOST_PERIODIC, "exechost_startup": EXECHOST_STARTUP,
}

# Which parameters each event carries (the rest raise EventIncompatibleError).
EVENT_PARAMS: dict[int, tuple[str, ...]] = {
    QUEUEJOB: ("job",), POSTQUEUEJOB: ("job",), MODIFYJOB: ("job", "job_o"),
    MOVEJOB: ("job", "src_queue"), RUNJOB: ("job",), JOBOBIT: ("job",),
    PERIODIC: ("vnode_list", "resv_list"), MODIFYVNODE: ("vnode", "vnode_o"),
    RESVSUB: ("resv",), MODIFYRESV: ("resv",), RESV_CONFIRM: ("resv",),
    RESV_BEGIN: ("resv",), RESV_END: ("resv",), MANAGEMENT: ("management",),
    PROVISION: ("vnode", "aoe"), EXECHOST_PERIODIC: ("vnode_list",),
    EXECHOST_STARTUP: ("vnode_list",),
}
for _mom_event in (EXECJOB_BEGIN, EXECJOB_PROLOGUE, EXECJOB_EPILOGUE, EXECJOB_END,
                   EXECJOB_PRETERM, EXECJOB_LAUNCH, EXECJOB_ATTACH, EXECJOB_RESIZE,
                   EXECJOB_ABORT, EXECJOB_POSTSUSPEND, EXECJOB_PRERESUME):
    EVENT_PARAMS[_mom_event] = ("job", "vnode_list")


class EventIncompatibleError(AttributeError):
    """The event has no such parameter (e.g. ``job`` asked of a periodic event)."""


class UnsetAttributeNameError(Exception):
    """An attribute name the object does not have."""


class UnsetResourceNameError(Exception):
    """A resource name PBS does not know."""


class BadAttributeValueError(Exception):
    """A value that cannot be set (for example a read-only attribute)."""


class BadAttributeValueTypeError(Exception):
    """A value of the wrong type."""


class BadResourceValueError(Exception):
    """A resource value that cannot be set."""


class select(str):
    """A select statement, e.g. ``1:ncpus=64``."""


class place(str):
    """A placement spec, e.g. ``scatter:excl``."""


class duration(int):
    """Seconds; also built from ``[[HH:]MM:]SS``."""

    def __new__(cls, value: object) -> duration:
        if isinstance(value, str) and ":" in value:
            secs = 0
            for part in value.split(":"):
                secs = secs * 60 + int(part)
            return super().__new__(cls, secs)
        return super().__new__(cls, int(value))  # type: ignore[call-overload]

    def __str__(self) -> str:
        secs = int(self)
        return f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"


class pbs_env(dict):
    """A job's Variable_List: variable name -> value."""


JOB_ATTRIBUTES = frozenset("""
    id Job_Name Job_Owner job_state queue server Account_Name Checkpoint ctime Error_Path
    exec_host exec_vnode Hold_Types Join_Path Keep_Files Mail_Points Mail_Users mtime
    Output_Path Priority qtime Rerunable Resource_List resources_used session_id substate
    Variable_List euser egroup run_count Exit_status Submit_arguments project interactive
    array array_id array_index array_indices_submitted array_indices_remaining comment
    etime stime obittime estimated group_list User_List depend umask sandbox run_version
    Shell_Path_List stagein stageout max_run_subjobs Execution_Time eligible_time
""".split())
VNODE_ATTRIBUTES = frozenset("""
    name state jobs resv queue resources_available resources_assigned last_state_change_time
    last_used_time ntype sharing comment Mom Port pcpus pbs_version resv_enable
    in_multivnode_host partition maintenance_jobs current_aoe license
""".split())
RESV_ATTRIBUTES = frozenset("""
    resvid reserve_name reserve_owner reserve_state reserve_substate reserve_start
    reserve_end reserve_duration resv_nodes queue Resource_List Authorized_Users
""".split())
RESOURCES = frozenset("""
    select place nodect nodes ncpus ngpus mem vmem walltime cput arch host vnode
    preempt_targets mpiprocs ompthreads software min_walltime max_walltime
""".split())


class pbs_resource(dict):
    """A resource list: missing names read as None; unknown names cannot be set."""

    def __init__(self, owner: str) -> None:
        super().__init__()
        self._owner = owner

    def __getitem__(self, name: str) -> object:
        return self.get(name)

    def __setitem__(self, name: str, value: object) -> None:
        if name not in RESOURCES:
            raise UnsetResourceNameError(f"resource '{name}' not found")
        super().__setitem__(name, value)


class _Object:
    """A job, vnode or reservation: known attributes read as None until set."""

    _kind = "object"
    _known: frozenset[str] = frozenset()
    _resource_attrs: tuple[str, ...] = ()

    def __init__(self, ident: str | None) -> None:
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_hook_set", [])
        for name in self._resource_attrs:
            self._values[name] = pbs_resource(name)
        self._values["name" if self._kind == "vnode" else "id"] = ident

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._known:
            return self._values.get(name)
        raise AttributeError(f"{self._kind} has no attribute '{name}'")

    def __setattr__(self, name: str, value: object) -> None:
        if name not in self._known:
            raise UnsetAttributeNameError(f"{self._kind} attribute '{name}' not found")
        if name == "Variable_List" and _EVENT is not None and _EVENT._running:
            # As OpenPBS 23.06 does (measured): a hook changes the variables in place.
            raise BadAttributeValueError(f"attribute '{name}' cannot be directly set.")
        self._values[name] = value
        if _EVENT is not None and _EVENT._running and name not in self._hook_set:
            self._hook_set.append(name)

    def __str__(self) -> str:
        return str(self._values.get("name" if self._kind == "vnode" else "id"))


class job(_Object):
    _kind = "job"
    _known = JOB_ATTRIBUTES
    _resource_attrs = ("Resource_List", "resources_used")

    def rerun(self) -> None:
        """Ask PBS to requeue the job once the hook ends (a mom hook: recorded as
        ``pbs.event().job._rerun=True``, as pbs_python's record says it)."""
        object.__setattr__(self, "_rerun", True)


class vnode(_Object):
    _kind = "vnode"
    _known = VNODE_ATTRIBUTES
    _resource_attrs = ("resources_available", "resources_assigned")


class resv(_Object):
    _kind = "resv"
    _known = RESV_ATTRIBUTES
    _resource_attrs = ("Resource_List",)


class queue:
    """A queue; ``str()`` is its name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        return str(other) == self.name

    def __hash__(self) -> int:
        return hash(self.name)


class _Server:
    """``pbs.server()``: only ``queue(name)`` and ``name`` are modelled."""

    def __init__(self, name: str) -> None:
        self.name = name

    def queue(self, name: str) -> queue:
        return queue(name)

    def __str__(self) -> str:
        return self.name


class _Event:
    """The event of this hook run. Per-event parameters live in ``_param``."""

    _FIELDS = ("type", "hook_name", "hook_type", "requestor", "requestor_host", "freq")

    def __init__(self, type: int, params: dict[str, object]) -> None:
        allowed = EVENT_PARAMS.get(type, ())
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise EventIncompatibleError(f"event type {type:#x} has no parameter(s) {unknown}")
        object.__setattr__(self, "_param", {name: params.get(name) for name in allowed})
        for name in self._FIELDS:
            object.__setattr__(self, name, None)
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "_running", False)
        object.__setattr__(self, "_accepted", True)
        object.__setattr__(self, "_reject_msg", None)
        object.__setattr__(self, "_delay_s", float(os.environ.get("FAKEPBS_PARAM_DELAY_S", 0)))

    def __getattr__(self, key: str) -> object:
        if key.startswith("_"):
            raise AttributeError(key)
        if key not in self._param:
            raise EventIncompatibleError(f'"{key}" not found in self._param')
        if self._delay_s:  # test knob: a slow server, so that the hook alarm can fire
            delay, self.__dict__["_delay_s"] = self._delay_s, 0.0
            time.sleep(delay)
        if key == os.environ.get("FAKEPBS_FAIL"):  # test knob: the server fails
            raise RuntimeError(f"fake server failure reading event parameter '{key}'")
        return self._param[key]

    def __setattr__(self, name: str, value: object) -> None:
        if name in self._param:
            raise BadAttributeValueError(f"event attribute '{name}' is readonly")
        if name not in self._FIELDS:
            raise UnsetAttributeNameError(f"event attribute '{name}' not found")
        if self._running:
            raise BadAttributeValueError(f"event attribute '{name}' is readonly")
        object.__setattr__(self, name, value)

    def accept(self, ecode: int = 0) -> None:
        """End the hook; PBS goes ahead with the request."""
        object.__setattr__(self, "_accepted", True)
        raise SystemExit(str(ecode))

    def reject(self, emsg: str = "", ecode: int = 255) -> None:
        """End the hook; PBS refuses the request and shows ``emsg`` to the requestor."""
        object.__setattr__(self, "_accepted", False)
        object.__setattr__(self, "_reject_msg", emsg)
        raise SystemExit(str(ecode))


_EVENT: _Event | None = None
_SERVER = _Server(os.environ.get("FAKEPBS_SERVER", "pbs-server"))
_LOG = None
hook_config_filename = os.environ.get("PBS_HOOK_CONFIG_FILE") or None


def event() -> _Event:
    """The event this hook runs for."""
    if _EVENT is None:
        raise RuntimeError("pbs.event(): no hook event (run the hook through python -m pbs)")
    return _EVENT


def server() -> _Server:
    if os.environ.get("FAKEPBS_FAIL") == "server":  # test knob: the server fails
        raise RuntimeError("fake server failure in pbs.server()")
    return _SERVER


def get_local_nodename() -> str:
    return os.environ.get("FAKEPBS_LOCAL_NODE", "localhost")


def logmsg(level: int, msg: str) -> None:
    """Write ``msg`` to the hook log (the runner's ``-l`` file, else stderr)."""
    if not isinstance(level, int) or not isinstance(msg, str):
        raise BadAttributeValueTypeError("logmsg(level: int, msg: str)")
    name = _EVENT.hook_name if _EVENT is not None else "-"
    line = f"{time.strftime('%m/%d/%Y %H:%M:%S')};{level:04x};{name};{msg}\n"
    if _LOG is not None:
        _LOG.write(line)
        _LOG.flush()
    else:
        sys.stderr.write(line)


def logjobmsg(jobid: str, msg: str) -> None:
    logmsg(LOG_DEBUG, f"{jobid};{msg}")
