"""MalleTrain's PBS hooks: one script, installed as seven hooks, eight with mt_launch (see
install.sh).

* ``periodic`` (mt_periodic): the vnodes that are free, run no job and are not reserved soon,
  sent as ``nodes_free`` datagrams.
* ``modifyvnode`` (mt_modifyvnode) and ``jobobit`` (mt_jobobit): fast hints, one datagram each,
  constant time, never waiting.
* ``queuejob`` (mt_queuejob): routes jobs submitted to the MalleTrain entry queue to the
  preemptable queue, or refuses a request that cannot work, with a message saying how to fix it.
* ``postqueuejob`` (mt_postqueuejob): an array just queued in the preemptable queue is announced
  to the daemon (``job_queued``); this event runs once the server holds the job, unlike
  queuejob, so the woken daemon finds it.
* ``modifyjob`` and ``movejob`` (mt_modifyjob): keep users from steering their workers. Only PBS
  itself, root, and the server's managers and operators (the daemon is one) may alter, hold,
  release or move a job of the preemptable queue; everyone else gets a one-line refusal.
* ``execjob_epilogue`` (mt_epilogue, on the moms): a worker subjob whose batch script died of
  a signal PBS did not send (its launcher SIGKILLed, the OOM killer: Exit_status 128 + signal;
  PBS's own kills, a qdel or the daemon's qrerun, read 256 + signal, and SIGTERM, PBS's way
  of ending a job, never counts) is put back in its queue
  (``job.rerun()``) instead of ending: PBS never runs a finished subjob again, so without this
  the job could never grow to its whole range again. The same hook's ``execjob_preterm`` event
  notes each worker PBS is ending (a qdel's TermJob, on the mom): when the SIGTERM is not enough
  and the queue's kill_delay brings PBS's SIGKILL, a script can read 128 + 9 like a launcher
  killed outside PBS (seen in CI on a loaded machine: a qdel'd subjob requeued, never ending),
  so a noted worker is never put back.
* ``execjob_launch`` (mt_launch, on the moms; only where munge is absent and install.sh was
  given ``--job-key-file``): puts the job's secret, HMAC-SHA256(site key, array id), into the
  environment of the job's processes as ``MALLETRAIN_JOB_SECRET`` (docs/pbs.md, "Launchers
  without munge"); the key lives only in this hook's root-only config.

The script runs inside PBS's embedded Python, not the project's environment: standard library
only (Python >= 3.6), and it encodes the daemon's datagram itself (one JSON object per unix
datagram, at most 4096 bytes). A datagram is only a hint; the daemon's poll of pbsnodes and
qstat is the truth, so a hint hook always accepts, even when the daemon is down or the hook
itself fails. ``accept()`` and ``reject()`` end the hook by raising SystemExit, which is never
swallowed here.
"""

import errno
import hashlib
import hmac
import json
import os
import re
import socket
import time

import pbs

MAX_DATAGRAM_BYTES = 4096
DEFAULTS = {
    "socket": "/run/malletrain/hook.sock",  # the daemon's hook socket
    "entry_queue": "malletrain",            # where users submit elastic jobs (qsub -q)
    "queue": "mt_preemptable",              # where the workers wait and run
    "max_nodes": 0,                         # most nodes one job may ask for; 0: no limit
    "resv_margin_s": 3600,                  # a vnode reserved within this is not offered
    "min_nodes_var": "MALLETRAIN_MIN_NODES",  # the job variable holding the lower bound
    "job_key": "",                          # mt_launch only: the site key (hex)
}
JOB_SECRET_VAR = "MALLETRAIN_JOB_SECRET"
_JOB_SECRET_LABEL = b"malletrain job secret\0"  # as malletrain_core.jobsecret.derive
_QUIET_ERRNOS = (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN, errno.EWOULDBLOCK)
# Exit_status codes with which PBS puts a job back in its queue instead of ending it.
_REQUEUE_EXITS = (-11, -14, -15, -18, -20)
_RERUN_SUBSTATES = (60, 61, 62, 63)

# PBS's words for the vnode state bits, as pbsnodes prints them; names missing from an older
# pbs module are skipped.
_STATE_NAMES = (
    ("ND_OFFLINE", "offline"), ("ND_DOWN", "down"), ("ND_STATE_DELETED", "deleted"),
    ("ND_UNRESOLVABLE", "unresolvable"), ("ND_JOBBUSY", "job-busy"), ("ND_STALE", "Stale"),
    ("ND_JOB_EXCLUSIVE", "job-exclusive"), ("ND_BUSY", "busy"),
    ("ND_STATE_UNKNOWN", "state-unknown"), ("ND_STATE_INIT", "initializing"),
    ("ND_PROV", "provisioning"), ("ND_WAIT_PROV", "wait-provisioning"),
    ("ND_RESV_EXCLUSIVE", "resv-exclusive"), ("ND_STATE_OFFLINE_BY_MOM", "offline_by_mom"),
    ("ND_STATE_MAINTENANCE", "maintenance"), ("ND_SLEEP", "sleep"),
)
STATE_WORDS = tuple((getattr(pbs, name), word) for name, word in _STATE_NAMES
                    if hasattr(pbs, name))


def log(level: int, text: str) -> None:
    pbs.logmsg(level, "malletrain: " + text)


def load_config() -> dict:
    """The defaults, overlaid with the hook's JSON config file when one was imported."""
    cfg = dict(DEFAULTS)
    path = getattr(pbs, "hook_config_filename", None)
    if not path:
        return cfg
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        log(pbs.LOG_WARNING, f"config {path} unreadable ({exc}); using the defaults")
        return cfg
    if not isinstance(data, dict):
        log(pbs.LOG_WARNING, f"config {path} is not a JSON object; using the defaults")
        return cfg
    for key, value in data.items():
        if key not in DEFAULTS:
            known = ", ".join(sorted(DEFAULTS))
            log(pbs.LOG_WARNING, f"config {path}: unknown key {key!r} ignored; known: {known}")
        elif type(value) is not type(DEFAULTS[key]):
            kind = type(DEFAULTS[key]).__name__
            log(pbs.LOG_WARNING, f"config {path}: {key} must be a {kind}; default kept")
        else:
            cfg[key] = value
    return cfg


def send(cfg: dict, message: dict) -> bool:
    """Send one datagram without waiting; False when it could not go (the daemon may be down)."""
    data = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_DATAGRAM_BYTES:
        log(pbs.LOG_WARNING, f"{message['kind']} datagram of {len(data)} bytes not sent")
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.sendto(data, cfg["socket"])
        return True
    except OSError as exc:
        if exc.errno not in _QUIET_ERRNOS:
            log(pbs.LOG_WARNING, f"cannot send to {cfg['socket']}: {exc}")
        return False
    finally:
        sock.close()


def message(src: str, kind: str, **fields: object) -> dict:
    msg = {"v": 1, "src": src, "kind": kind, "t": round(time.time(), 3)}
    msg.update((k, v) for k, v in fields.items() if v is not None)
    return msg


def state_words(state: int) -> str:
    """``0x12`` -> ``"down,job-busy"``; 0 -> ``"free"`` (the words pbsnodes prints)."""
    if state == pbs.ND_FREE:
        return "free"
    words = [word for bit, word in STATE_WORDS if state & bit]
    return ",".join(words) if words else f"0x{state:x}"


def queue_name(queue: object) -> str:
    """The name of a job's queue (a pbs.queue, a string, or None), without any ``@server``."""
    if queue is None:
        return ""
    name = getattr(queue, "name", None) or str(queue)
    return name.split("@", 1)[0].strip()


def vnode_names(spec: object) -> list:
    """Vnode names in an exec_vnode / resv_nodes string ``(n1:ncpus=4)+(n2:ncpus=4+n3:mem=1gb)``."""
    names = []
    for chunk in str(spec or "").replace("(", "").replace(")", "").split("+"):
        name = chunk.split(":", 1)[0].strip()
        if name and name not in names:
            names.append(name)
    return names


def reserved_soon(resvs: object, now: float, margin_s: float) -> set:
    """Vnodes of reservations that start within ``margin_s`` (or have started)."""
    names = set()
    for resv in (resvs or {}).values():
        start = getattr(resv, "reserve_start", None)
        try:
            start = float(start)
        except (TypeError, ValueError):
            start = now  # unknown start: treat as imminent
        if start - now <= margin_s:
            names.update(vnode_names(getattr(resv, "resv_nodes", "")))
    return names


def free_vnodes(vnodes: object, resvs: object, now: float, cfg: dict) -> list:
    """Names of the vnodes MalleTrain may offer: state exactly FREE (no bit set: a bitmask
    is never tested with ``&`` for FREE), no job on them, not reserved soon, and not tied to
    another queue."""
    soon = reserved_soon(resvs, now, cfg["resv_margin_s"])
    free = []
    for name, vnode in (vnodes or {}).items():
        if vnode.state != pbs.ND_FREE or vnode.jobs or getattr(vnode, "resv", None):
            continue
        if name in soon:
            continue
        tied = queue_name(getattr(vnode, "queue", None))
        if tied and tied != cfg["queue"]:
            continue
        free.append(str(name))
    return sorted(free)


def split_names(src: str, names: list) -> list:
    """``nodes_free`` datagrams, each within the size limit."""
    out, batch = [], []
    for name in names:
        trial = message(src, "nodes_free", nodes=batch + [name])
        if batch and len(json.dumps(trial, separators=(",", ":"))) > MAX_DATAGRAM_BYTES - 64:
            out.append(message(src, "nodes_free", nodes=batch))
            batch = []
        batch.append(name)
    if batch:
        out.append(message(src, "nodes_free", nodes=batch))
    return out


def on_periodic(e: object, cfg: dict) -> None:
    for msg in split_names("pbs-periodic", free_vnodes(e.vnode_list, e.resv_list,
                                                       time.time(), cfg)):
        if not send(cfg, msg):
            break


def on_modifyvnode(e: object, cfg: dict) -> None:
    vnode, old = e.vnode, e.vnode_o
    if old is not None and old.state == vnode.state:
        return
    send(cfg, message("pbs-modifyvnode", "node_change", node=str(vnode.name),
                      state=state_words(vnode.state)))


def exit_field(status: object) -> object:
    """PBS Exit_status as the datagram's ``"code:signal"``: >= 256 means killed by a signal."""
    try:
        code = int(status)
    except (TypeError, ValueError):
        return None
    if 256 < code < 512:
        return f"0:{code - 256}"
    return f"{code}:0"


def on_jobobit(e: object, cfg: dict) -> None:
    job = e.job
    qname = queue_name(job.queue)
    if qname != cfg["queue"]:
        return
    try:
        restarts = int(job.run_count or 0)
    except (TypeError, ValueError):
        restarts = None
    exit_code = exit_field(job.Exit_status)
    substate = getattr(job, "substate", None)
    requeued = (exit_code is not None and int(job.Exit_status) in _REQUEUE_EXITS) or \
        (substate is not None and int(substate) in _RERUN_SUBSTATES)
    nodes = vnode_names(job.exec_vnode)
    send(cfg, message("pbs-jobobit", "job_end", job=str(job.id),
                      nodes=",".join(nodes) if nodes else None,
                      user=str(job.euser) if job.euser else None, restarts=restarts,
                      exit=exit_code, partition=qname, requeued=bool(requeued)))


_SIGTERM = 15  # the same number on every platform PBS runs on


def killed_outside_pbs(status: object) -> int:
    """The signal that ended a batch script when PBS did not send it (Exit_status 128 +
    signal, as the shell reports a child killed by one), else 0. PBS's own kills (qdel,
    qrerun, a walltime) read 256 + signal when the job's shell dies of them, and its
    requeue codes are negative. SIGTERM never counts: it is how PBS ends a job (a qdel's
    TermJob, a walltime), and the launcher, catching it, exits 128 + 15, which reads like a
    signal PBS did not send (seen on the OpenPBS 23.06 complex: a qdel'd subjob exited 143
    and was requeued). A launcher killed outside PBS is SIGKILLed or dies of a fault signal;
    one SIGTERMed by hand outside PBS ends its subjob as before."""
    try:
        code = int(status)
    except (TypeError, ValueError):
        return 0
    sig = code - 128 if 128 < code < 128 + 65 else 0
    return 0 if sig == _SIGTERM else sig


TERM_MARK = "malletrain-terminated-"
"""The name's start of the file that says PBS is ending a worker (:func:`on_preterm`)."""


def term_mark(job_id: object) -> str:
    """Where :func:`on_preterm` notes that PBS is ending ``job_id``: in the hook's working
    directory, which a mom makes its own ``mom_priv/hooks/tmp`` (root-only) before it runs a
    hook as root, so that a mom's epilogue finds what its own preterm noted."""
    return os.path.join(os.getcwd(), TERM_MARK + str(job_id).replace(os.sep, "_"))


def on_preterm(e: object, cfg: dict) -> None:
    """PBS is ending a running worker (TermJob: a qdel): noted for :func:`on_epilogue`."""
    job = e.job
    if queue_name(job.queue) != cfg["queue"]:
        return
    try:
        with open(term_mark(job.id), "w", encoding="utf-8") as fh:
            fh.write(f"{time.time():.3f}\n")
    except OSError as exc:
        log(pbs.LOG_WARNING, f"{job.id}: PBS's end of the job could not be noted ({exc}): "
            "if a SIGKILL follows its SIGTERM, the subjob is requeued")


def on_epilogue(e: object, cfg: dict) -> None:
    job = e.job
    if queue_name(job.queue) != cfg["queue"]:
        return
    ended_by_pbs = False
    try:
        os.unlink(term_mark(job.id))
        ended_by_pbs = True
    except OSError:
        pass
    sig = killed_outside_pbs(job.Exit_status)
    if not sig or ended_by_pbs:
        return
    log(pbs.LOG_WARNING, f"{job.id}: its batch script died of signal {sig} that PBS did not "
        "send (the launcher killed?): requeued, so that the job keeps its subjob")
    job.rerun()


def array_size(spec: str) -> int:
    """Indices in an ``-J`` range ``X-Y[:Z]`` (ValueError when it is not one)."""
    body, _, step = spec.partition(":")
    first, _, last = body.partition("-")
    lo, hi, by = int(first), int(last), int(step or 1)
    if by < 1 or hi < lo:
        raise ValueError(spec)
    return len(range(lo, hi + 1, by))


def select_nodes(select: str) -> int:
    """Chunks in a select statement: ``2:ncpus=4+ncpus=8`` -> 3."""
    total = 0
    for chunk in select.split("+"):
        head = chunk.split(":", 1)[0].strip()
        total += int(head) if head.isdigit() else 1
    return total


def job_env(job: object, name: str) -> object:
    env = getattr(job, "Variable_List", None)
    if env is None:
        return None
    try:
        return env.get(name)
    except AttributeError:
        return None


def check_request(job: object, cfg: dict) -> tuple:
    """``(problem, min_nodes, max_nodes)``; ``problem`` is None when the job can be routed."""
    usage = ("submit MalleTrain jobs as an array of one-node workers, e.g. "
             f"qsub -q {cfg['entry_queue']} -J 1-32 -l select=1:ncpus=64 "
             f"-v {cfg['min_nodes_var']}=2 job.sh")
    if getattr(job, "interactive", None) in (True, 1, "True", "true"):
        return "jobs cannot be interactive (-I); " + usage, 0, 0
    spec = job.array_indices_submitted
    if not spec:
        return "no -J range given; " + usage, 0, 0
    try:
        max_nodes = array_size(str(spec))
    except ValueError:
        return f"-J {spec} is not a range X-Y[:Z]; {usage}", 0, 0
    select = job.Resource_List["select"]
    if select is None and job.Resource_List["nodes"] is not None:
        return "-l nodes is not supported; " + usage, 0, 0
    if select is not None and select_nodes(str(select)) != 1:
        return (f"-l select={select} asks for {select_nodes(str(select))} nodes per worker, "
                "but each worker is one node: give the node count with -J instead; "
                + usage), 0, 0
    place = job.Resource_List["place"]
    if place is not None and "excl" not in str(place):
        return (f"-l place={place} would share nodes; MalleTrain workers own whole nodes: use "
                "-l place=excl or leave place out"), 0, 0
    rerun = job.Rerunable
    if rerun is not None and str(rerun).lower() in ("false", "n", "0"):
        return ("-r n: preempted MalleTrain workers must be requeued; leave -r out "
                "or use -r y"), 0, 0
    raw = job_env(job, cfg["min_nodes_var"])
    try:
        min_nodes = int(str(raw).strip()) if raw is not None else 1
    except ValueError:
        return f"{cfg['min_nodes_var']}={raw} is not a whole number of nodes", 0, 0
    if min_nodes < 1 or min_nodes > max_nodes:
        return (f"{cfg['min_nodes_var']}={min_nodes} must be between 1 and the {max_nodes} "
                f"workers of -J {spec}"), 0, 0
    limit = cfg["max_nodes"]
    if limit > 0 and min_nodes > limit:
        return (f"the job needs at least {min_nodes} nodes but MalleTrain lends at most "
                f"{limit} here; lower {cfg['min_nodes_var']}"), 0, 0
    if limit > 0 and max_nodes > limit:
        return (f"-J {spec} asks for up to {max_nodes} nodes but MalleTrain lends at most "
                f"{limit} here; use -J 1-{limit}"), 0, 0
    return None, min_nodes, max_nodes


def on_queuejob(e: object, cfg: dict) -> None:
    job = e.job
    target = queue_name(job.queue)
    if target == cfg["queue"] and cfg["queue"] != cfg["entry_queue"]:
        e.reject(f"MalleTrain: do not submit to {target} directly (its jobs run only when "
                 f"MalleTrain starts them); submit with -q {cfg['entry_queue']}")
    if target != cfg["entry_queue"]:
        return
    problem, min_nodes, max_nodes = check_request(job, cfg)
    if problem is not None:
        e.reject("MalleTrain: " + problem)
    job.queue = pbs.server().queue(cfg["queue"])
    if job.Resource_List["place"] is None:
        job.Resource_List["place"] = pbs.place("excl")
    if job.Rerunable is None:
        job.Rerunable = True
    env = getattr(job, "Variable_List", None)
    if env is not None:  # changed in place: a real server refuses `job.Variable_List = ...`
        env[cfg["min_nodes_var"]] = str(min_nodes)
        env["MALLETRAIN_MAX_NODES"] = str(max_nodes)


def on_postqueuejob(e: object, cfg: dict) -> None:
    job = e.job
    if queue_name(job.queue) != cfg["queue"] or "[]" not in str(job.id):
        return  # another queue's job, or a subjob (its array was announced)
    send(cfg, message("pbs-postqueuejob", "job_queued", job=str(job.id)))


# Requestors that are PBS itself (routing, the scheduler, moms): never refused.
_PBS_ITSELF = ("PBS_Server", "Scheduler", "pbs_mom", "PBS_System", "root")


def privileged(requestor: str) -> bool:
    """PBS itself, root, or a manager or operator of the server (``user@host`` entries,
    ``*`` for any host)."""
    user = requestor.split("@", 1)[0]
    if user in _PBS_ITSELF:
        return True
    server = pbs.server()
    for attr in ("managers", "operators"):
        for entry in str(getattr(server, attr, None) or "").split(","):
            if entry.strip() and entry.strip().split("@", 1)[0] == user:
                return True
    return False


def on_modifyjob(e: object, cfg: dict) -> None:
    """qalter/qhold/qrls (modifyjob) and qmove (movejob) of MalleTrain's jobs: only the
    privileged. A user may still qdel the job (that ends it) and read it with qstat."""
    # modifyjob: e.job carries only the requested changes, e.job_o the job as it is.
    old = getattr(e, "job_o", None)
    queues = {queue_name(e.job.queue), queue_name(getattr(old, "queue", None)),
              queue_name(getattr(e, "src_queue", None))}
    if cfg["queue"] not in queues or privileged(str(e.requestor or "")):
        return
    verb = "moved" if e.type == getattr(pbs, "MOVEJOB", None) else "changed"
    e.reject(f"MalleTrain: jobs in {cfg['queue']} are {verb} only by MalleTrain, which "
             f"starts, stops and places its workers; to change the request, qdel the job and "
             f"submit again with -q {cfg['entry_queue']}")


def job_secret(key_hex: str, job_id: str) -> str:
    """The job's launcher secret: HMAC-SHA256(site key, array id)."""
    array = re.sub(r"\[\d+\]", "[]", job_id, count=1)
    return hmac.new(bytes.fromhex(key_hex), _JOB_SECRET_LABEL + array.encode(),
                    hashlib.sha256).hexdigest()


def on_launch(e: object, cfg: dict) -> None:
    job = e.job
    if not cfg["job_key"] or queue_name(job.queue) != cfg["queue"]:
        return
    e.env[JOB_SECRET_VAR] = job_secret(cfg["job_key"], str(job.id))


_EVENT_HANDLERS = (
    ("PERIODIC", on_periodic),
    ("MODIFYVNODE", on_modifyvnode),
    ("JOBOBIT", on_jobobit),
    ("QUEUEJOB", on_queuejob),
    ("POSTQUEUEJOB", on_postqueuejob),
    ("MODIFYJOB", on_modifyjob),
    ("MOVEJOB", on_modifyjob),
    ("EXECJOB_LAUNCH", on_launch),
    ("EXECJOB_PRETERM", on_preterm),
    ("EXECJOB_EPILOGUE", on_epilogue),
)
# Events an older pbs module does not know are left out (their hooks cannot be installed there).
HANDLERS = {getattr(pbs, name): fn for name, fn in _EVENT_HANDLERS if hasattr(pbs, name)}


def main() -> None:
    e = pbs.event()
    routing = e.type == pbs.QUEUEJOB
    try:
        handler = HANDLERS.get(e.type)
        if handler is None:
            log(pbs.LOG_WARNING,
                f"hook {e.hook_name} bound to an event it does not handle ({e.type})")
        else:
            handler(e, load_config())
    except SystemExit:
        raise
    except KeyboardInterrupt:
        # The hook alarm: give up the hint. A queuejob that ran out of time cannot have been
        # checked, so it is refused (PBS refuses it too when the alarm ends the hook).
        log(pbs.LOG_ERROR, f"alarm: hook {e.hook_name} stopped before it finished")
        if routing and _is_ours(e):
            e.reject("MalleTrain: the submission check timed out; please submit again")
    except Exception as exc:  # a hint must never stop PBS; a malformed event is logged
        log(pbs.LOG_ERROR, f"hook {e.hook_name} failed: {type(exc).__name__}: {exc}")
        if routing and _is_ours(e):
            e.reject(f"MalleTrain: the submission check failed ({type(exc).__name__}); "
                     "please tell the administrators")
    e.accept()


def _is_ours(e: object) -> bool:
    try:
        return queue_name(e.job.queue) == load_config()["entry_queue"]
    except Exception:  # an unreadable job cannot be told apart, so it is not refused
        return False


main()
