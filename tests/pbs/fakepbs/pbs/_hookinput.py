"""Read and write PBS's hook debug text format (``pbs_python --hook -i IN -o OUT``).

Each input line is ``<object>.<attribute>=<value>`` or ``<object>.<attribute>[<resource>]=
<value>``, with objects ``pbs.event()``, ``pbs.event().job``, ``pbs.event().vnode_list[<name>]``
and so on; the value starts after the first ``=`` (blanks around it trimmed) and may span lines
inside triple quotes. Lines without ``=`` are ignored, as PBS does. The output record has the
same shape: ``pbs.event().accept=True``, ``pbs.event().reject_msg=...``, the job's attributes.

Stricter than PBS on purpose: an object or event attribute it does not know is an error (exit
2), so a typo in a fixture fails loudly instead of testing nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pbs

EVENT = "pbs.event()"
EVENT_FIELDS = {"type", "hook_name", "hook_type", "requestor", "requestor_host", "alarm",
                "debug", "user", "freq", "fail_action", "progname", "argv", "env", "pid"}
SINGLE_OBJECTS = {"job": pbs.job, "job_o": pbs.job, "vnode": pbs.vnode,
                  "vnode_o": pbs.vnode, "resv": pbs.resv}
LIST_OBJECTS = {"vnode_list": pbs.vnode, "resv_list": pbs.resv}
STATE_BITS = {
    "free": pbs.ND_FREE, "offline": pbs.ND_OFFLINE, "down": pbs.ND_DOWN,
    "deleted": pbs.ND_STATE_DELETED, "unresolvable": pbs.ND_UNRESOLVABLE,
    "job-busy": pbs.ND_JOBBUSY, "stale": pbs.ND_STALE, "job-exclusive": pbs.ND_JOB_EXCLUSIVE,
    "busy": pbs.ND_BUSY, "state-unknown": pbs.ND_STATE_UNKNOWN,
    "initializing": pbs.ND_STATE_INIT, "provisioning": pbs.ND_PROV,
    "wait-provisioning": pbs.ND_WAIT_PROV, "resv-exclusive": pbs.ND_RESV_EXCLUSIVE,
    "offline_by_mom": pbs.ND_STATE_OFFLINE_BY_MOM, "maintenance": pbs.ND_STATE_MAINTENANCE,
    "sleep": pbs.ND_SLEEP,
}
INT_ATTRS = {"run_count", "Exit_status", "substate", "Priority", "session_id", "pcpus", "Port",
             "last_state_change_time", "last_used_time", "reserve_start", "reserve_end",
             "reserve_duration", "ctime", "mtime", "qtime", "etime", "stime"}
BOOL_ATTRS = {"Rerunable", "interactive", "array", "resv_enable", "in_multivnode_host"}
_OBJ = re.compile(r'^pbs\.event\(\)\.(\w+)(?:\[\s*"?([^"\]]+)"?\s*\])?$')
_ATTR = re.compile(r'^(\w+)(?:\[\s*"?([^"\]]*)"?\s*\])?\s*$')


class HookInputError(Exception):
    """A fixture line the fake cannot understand; names the line."""


@dataclass(frozen=True)
class Line:
    lineno: int
    obj: str
    attr: str
    resource: str | None
    value: str


def _split_name(name: str) -> tuple[str, str]:
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        if ch == "]":
            depth += 1
        elif ch == "[":
            depth -= 1
        elif ch == "." and depth == 0:
            return name[:i], name[i + 1:]
    return "", name


def read_lines(text: str) -> list[Line]:
    """Split an input file into lines; triple-quoted values may span lines."""
    out: list[Line] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno, raw = i + 1, lines[i]
        i += 1
        if "=" not in raw:
            continue
        name, value = raw.split("=", 1)
        value = value.strip()
        if value.startswith('"""'):
            body = value[3:]
            while not body.endswith('"""'):
                if i >= len(lines):
                    raise HookInputError(f"line {lineno}: unmatched triple quotes")
                body += "\n" + lines[i]
                i += 1
            value = body[:-3]
        if name.strip() == "pbs.get_local_nodename()":
            continue  # the server's host name: nothing in the fake depends on it
        obj, attr = _split_name(name.strip())
        m = _ATTR.match(attr)
        if not obj or not m:
            raise HookInputError(f"line {lineno}: cannot read {raw!r}")
        out.append(Line(lineno, obj, m.group(1), m.group(2), value))
    return out


def _bool(text: str) -> bool:
    return text.strip().lower() in ("true", "t", "y", "yes", "1")


def _state(text: str) -> int:
    text = text.strip()
    if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", text):
        return int(text, 0)
    bits = 0
    for word in text.split(","):
        key = word.strip().lower()
        if key not in STATE_BITS:
            raise HookInputError(f"unknown vnode state {word!r}")
        bits |= STATE_BITS[key]
    return bits


def _env(text: str) -> pbs.pbs_env:
    env = pbs.pbs_env()
    for item in re.split(r"(?<!\\),", text):
        if "=" in item:
            key, val = item.split("=", 1)
            env[key.strip()] = val.replace("\\,", ",")
    return env


def _resource(name: str, text: str) -> object:
    if name == "select":
        return pbs.select(text)
    if name == "place":
        return pbs.place(text)
    if name in ("walltime", "cput", "min_walltime", "max_walltime"):
        return pbs.duration(text)
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def convert(attr: str, text: str) -> object:
    """A fixture value as the pbs module would hand it to a hook."""
    if attr == "state":
        return _state(text)
    if attr == "queue":
        return pbs.queue(text) if text else None
    if attr == "Variable_List":
        return _env(text)
    if attr in INT_ATTRS:
        return int(text)
    if attr in BOOL_ATTRS:
        return _bool(text)
    return text


def build_event(lines: list[Line]) -> tuple[pbs._Event, dict[str, str]]:
    """The event the lines describe and the ``pbs.event()`` fields (alarm, hook_name...)."""
    fields: dict[str, str] = {}
    objects: dict[str, pbs._Object] = {}
    lists: dict[str, dict[str, pbs._Object]] = {}
    for ln in lines:
        if ln.obj == EVENT:
            if ln.attr not in EVENT_FIELDS:
                raise HookInputError(f"line {ln.lineno}: unknown event attribute '{ln.attr}'")
            fields[ln.attr] = ln.value
            continue
        m = _OBJ.match(ln.obj)
        if not m or (m.group(1) not in SINGLE_OBJECTS and m.group(1) not in LIST_OBJECTS):
            raise HookInputError(f"line {ln.lineno}: unknown object '{ln.obj}'")
        kind, key = m.group(1), m.group(2)
        if kind in LIST_OBJECTS:
            if not key:
                raise HookInputError(f"line {ln.lineno}: {kind} needs [<name>]")
            target = lists.setdefault(kind, {}).setdefault(key, LIST_OBJECTS[kind](key))
        else:
            target = objects.setdefault(kind, SINGLE_OBJECTS[kind](None))
        try:
            if ln.resource is not None:
                getattr(target, ln.attr)[ln.resource] = _resource(ln.resource, ln.value)
            else:
                setattr(target, ln.attr, convert(ln.attr, ln.value))
        except (pbs.UnsetAttributeNameError, pbs.UnsetResourceNameError, ValueError,
                TypeError) as exc:
            raise HookInputError(f"line {ln.lineno}: {exc}") from None
    type_name = fields.get("type", "")
    if type_name not in pbs.EVENT_NAMES:
        raise HookInputError(f"pbs.event().type={type_name!r} is not an event type; one of "
                             + ", ".join(sorted(pbs.EVENT_NAMES)))
    etype = pbs.EVENT_NAMES[type_name]
    params: dict[str, object] = dict(objects)
    params.update(lists)
    for name in pbs.EVENT_PARAMS.get(etype, ()):
        if name in LIST_OBJECTS:
            params.setdefault(name, {})
        elif name in ("job",):
            params.setdefault(name, pbs.job(None))
    try:
        event = pbs._Event(etype, params)
    except pbs.EventIncompatibleError as exc:
        raise HookInputError(str(exc)) from None
    for name in ("hook_name", "hook_type", "requestor", "requestor_host"):
        if name in fields:
            setattr(event, name, fields[name])
    if "freq" in fields:
        event.freq = int(fields["freq"])
    return event, fields


def _fmt(value: object) -> str:
    if isinstance(value, pbs.pbs_env):
        return ",".join(f"{k}={str(v).replace(',', chr(92) + ',')}" for k, v in value.items())
    return str(value)


def record(event: pbs._Event) -> str:
    """The hook execution record (``-o``), in PBS's format."""
    out = [f"{EVENT}.accept={event._accepted}", f"{EVENT}.reject={not event._accepted}"]
    if not event._accepted:
        if event._reject_msg:
            out.append(f"{EVENT}.reject_msg={event._reject_msg}")
        return "\n".join(out) + "\n"
    job = event._param.get("job")
    if isinstance(job, pbs.job):
        for name in sorted(job._values):
            value = job._values[name]
            if isinstance(value, pbs.pbs_resource):
                out.extend(f"{EVENT}.job.{name}[{r}]={_fmt(v)}" for r, v in sorted(value.items()))
            elif value not in (None, ""):
                out.append(f"{EVENT}.job.{name}={_fmt(value)}")
        if job.__dict__.get("_rerun"):
            out.append(f"{EVENT}.job._rerun=True")
    return "\n".join(out) + "\n"
