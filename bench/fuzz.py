"""Fuzzing by count: every parser and wire format, N generated cases each, crashes counted.

Targets (``--target NAME``, repeatable; all by default):

* ``hooks``    hook datagrams → ``protocol.decode`` (refusal: ``ProtocolError``; an accepted
               datagram must round-trip through ``protocol.encode``);
* ``reports``  launcher progress reports → ``reports.verify`` (``ReportError``); half the cases
               are mutated payloads signed again with the key, so the checks behind the
               signature are reached;
* ``api``      API request lines → the daemon's real ``Dispatcher`` (status, jobs, nodes,
               profile, checkin wired to a real daemon, engine and epoch coordinator); every
               reply must be one JSON line, and an "internal error" reply is a crash;
* ``codec``    journal rows → ``json.loads`` + ``codec.from_dict`` (``ValueError``); an accepted
               row must round-trip through ``codec.to_dict``;
* ``toml``     ``malletrain.toml`` → ``config.load`` (``ConfigError``);
* ``idle-csv`` idle-trace CSV → ``traces.read_idle_csv`` (``InputFileError``);
* ``swf``      SWF logs → ``sources.read_swf`` (``InputFileError``);
* ``sbatch``   ``sbatch`` submissions and modifications → the real ``plugin/job_submit.lua`` in
               one ``lua5.1`` process (the stand-in ``slurm`` table of
               tests/test_job_submit_lua.py): a Lua error, a return code Slurm does not know, or
               an accepted elastic job whose array and tag do not match its range is a crash.

Each case is a seeded mutation of a valid input (bit flips, cuts, insertions of tokens that
parsers trip on, structural edits of the decoded value: a field dropped, retyped, replaced by
a huge, negative, non-finite or deeply nested value) or, one case in ten, random bytes. A
crash is any other exception type, a refusal that is not one clear line, a broken contract
above, or a case running over ``--hang-s`` (a hang). Prints one JSON object (cases, crashes,
hangs, seconds and the first examples of each crash per target); progress goes to stderr.
``--markdown FILE`` rewrites the fuzz section of FILE.

    nice -n 10 python -m bench.fuzz --cases 100000 --markdown BENCHMARKS.md

Over 400 lines on purpose: each target is a small class (30-60 lines) over one parser, and they
share the case generators (``mutate_bytes``, ``mutate_value``) and the one loop that counts
cases and crashes; one file lists every target as the BENCHMARKS section reports them.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.fuzz "
             + " ".join(sys.argv[1:]))
from bench.sections import host, replace_section  # noqa: E402
from malletrain_core import config  # noqa: E402
from malletrain_core.daemon import codec  # noqa: E402
from malletrain_core.errors import ConfigError, InputFileError  # noqa: E402
from malletrain_core.wire import hooks as protocol  # noqa: E402
from malletrain_core.wire import reports  # noqa: E402

BEGIN, END = "<!-- fuzz:begin -->", "<!-- fuzz:end -->"
KEY = b"k" * 32


class Crash(Exception):
    """A broken contract (not an exception the parser is allowed to raise)."""


class Hang(BaseException):
    """The case ran over the bound."""


def one_line(message: str) -> None:
    if not message or "\n" in message or "Traceback" in message:
        raise Crash(f"refusal is not one clear line: {message[:120]!r}")


# ----- generic mutations ------------------------------------------------------------------------
TOKENS = [b'"', b"{", b"}", b"[", b"]", b",", b":", b"\\", b"\\u0000", b"\\ud800", b"1e999",
          b"-1", b"NaN", b"Infinity", b"null", b"true", b'""', b"\xff", b"\x00", b"\n", b"\r",
          b" ", b"=", b"#", b"%s", b"%d", b"%", b"[" * 300, b"9" * 400, b"0x10", b"-0",
          b"\xc3\xa9", b"\xe2\x80\xa8", b"n[1-99999999]", b"@all", b"'", b"''", b"[[",
          b"\t", b"2_0", b"1.", b".5", b"+1", b"inf", b"nan"]

VALUES: list[Any] = [None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63), 10**400, 1.5, -0.0,
                     float("nan"), float("inf"), float("-inf"), 1e308, "", "x", "\x00", "é",
                     "\ud800", "a" * 5000, "1", "-1", "nan", "n[1-3]", "n[1-99999999]", [],
                     [1, 2], {}, {"a": 1}, [[[[[]]]]], "%s%s%s", "0-3", "malletrain"]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    raw = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        i = rng.randint(0, len(raw))
        if op == 0 and raw:
            raw[min(i, len(raw) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and raw:
            raw[min(i, len(raw) - 1)] = rng.randrange(256)
        elif op == 2:
            raw[i:i] = rng.choice(TOKENS)
        elif op == 3:
            del raw[i:i + rng.randint(1, 16)]
        elif op == 4:
            del raw[i:]
        elif op == 5 and raw:
            j = rng.randint(0, len(raw) - 1)
            raw[i:i] = raw[j:j + rng.randint(1, 32)]
        else:
            raw[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(raw)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if r < 0.6 or depth > 2:
        return copy.deepcopy(rng.choice(VALUES))  # never a shared container
    if r < 0.7:
        return rng.uniform(-1e12, 1e12)
    if r < 0.8:
        return rng.randint(-(2**40), 2**40)
    if r < 0.9:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "job", "nodes", "v", ""]): random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def mutate_value(rng: random.Random, obj: Any) -> Any:
    """A structural edit somewhere inside ``obj`` (a JSON value; copied)."""
    obj = json.loads(json.dumps(obj))
    for _ in range(rng.randint(1, 3)):
        holder: Any = None
        key: Any = None
        node = obj
        while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            holder, key = node, rng.choice(keys)
            node = node[key]
        if holder is None:
            if isinstance(obj, dict) and rng.random() < 0.5:
                obj[rng.choice(["extra", "v", "kind", "type", "op", "args", "job"])] = \
                    random_value(rng)
            elif rng.random() < 0.1:
                obj = random_value(rng)
            continue
        op = rng.randrange(4)
        if op == 0 and isinstance(holder, dict):
            del holder[key]
        elif op == 1 and isinstance(node, str):
            holder[key] = mutate_bytes(rng, node.encode("utf-8", "surrogatepass")).decode(
                "utf-8", "replace")
        elif op == 2 and isinstance(node, (int, float)) and not isinstance(node, bool):
            pick = rng.randrange(6)
            try:
                holder[key] = (node + 1, -node, node * 2**40, 0, float(node) + 0.5,
                               str(node))[pick] if pick != 4 else float(node) + 0.5
            except OverflowError:
                holder[key] = str(node)
        else:
            holder[key] = random_value(rng)
    return obj


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")


def mutated(rng: random.Random, valid: list[Any], encode: Callable[[Any], bytes],
            random_max: int = 600) -> bytes:
    """One case: random bytes (10 %), a byte mutation (45 %) or a structural one (45 %)."""
    r = rng.random()
    if r < 0.1:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, random_max)))
    base = rng.choice(valid)
    if r < 0.55:
        return mutate_bytes(rng, encode(base))
    return encode(mutate_value(rng, base))


# ----- targets ----------------------------------------------------------------------------------
class Target:
    """``make(rng)`` draws a case, ``check(case)`` runs it and raises :class:`Crash` (or any
    exception not in ``allowed``) on a crash."""

    name = ""
    allowed: tuple[type[BaseException], ...] = ()

    def make(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def check(self, case: Any) -> bool | None:
        """Run one case; true when the input was accepted (not refused)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class FileTarget(Target):
    """A parser of files: each case is written to ``self.path`` in a private folder."""

    filename = "input"

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="malletrain-fuzz-")
        self.path = Path(self.dir) / self.filename

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Hooks(Target):
    name = "hooks"
    allowed = (protocol.ProtocolError,)

    def __init__(self) -> None:
        msgs: list[protocol.Message] = [protocol.JobEnd(src="epilog", t=1.7e9, job="42_3", nodes=("n01", "n02"),
                                user="alice", uid=1000, restarts=1, exit="0:15",
                                partition="work"),
                protocol.NodesFree(src="pbs", t=1.7e9, nodes=("a", "b")),
                protocol.NodeChange(src="pbs", t=5.0, node="n1", state="down")]
        self.valid = [json.loads(protocol.encode(m)) for m in msgs]

    def make(self, rng: random.Random) -> bytes:
        return mutated(rng, self.valid, dumps, protocol.MAX_DATAGRAM_BYTES + 64)

    def check(self, case: bytes) -> bool | None:
        try:
            msg = protocol.decode(case)
        except protocol.ProtocolError as exc:
            one_line(str(exc))
            return None
        if protocol.decode(protocol.encode(msg)) != msg:
            raise Crash("an accepted datagram does not round-trip")
        return True


class Reports(Target):
    name = "reports"
    allowed = (reports.ReportError,)

    def __init__(self) -> None:
        self.valid = [json.loads(reports.Report(job=j, epoch=e, seq=s, t=1.7e9, samples=1e6,
                                                world=w, rank=0, ckpt=c).payload())
                      for j, e, s, w, c in (("42", 0, 1, 4, None), ("7_1", 3, 99, 1, 120))]

    def make(self, rng: random.Random) -> bytes:
        if rng.random() < 0.5:  # signed again: the checks behind the signature
            payload = mutated(rng, self.valid, dumps, reports.MAX_BYTES)
            import hashlib
            import hmac
            mac = hmac.new(KEY, payload, hashlib.sha256).hexdigest().encode()
            return reports.MAGIC + b" " + mac + b" " + payload
        base = reports.sign(reports.Report(**{**self.valid[0], "ckpt": None}), KEY)
        return mutate_bytes(rng, base)

    def check(self, case: bytes) -> bool | None:
        try:
            report = reports.verify(case, KEY)
        except reports.ReportError as exc:
            one_line(str(exc))
            return None
        if not (report.world >= 1 and 0 <= report.rank < report.world
                and math.isfinite(report.samples) and report.samples >= 0):
            raise Crash(f"accepted an out-of-range report {report}")
        return True


class Api(Target):
    name = "api"

    def __init__(self) -> None:
        from malletrain_core.daemon.api import Dispatcher
        from malletrain_core.daemon.bridge import EpochBridge
        from malletrain_core.daemon.core import Daemon
        from malletrain_core.daemon.epochs import EpochCoordinator
        from malletrain_core.daemon.launchers import LauncherService
        from malletrain_core.daemon.service import attach
        from malletrain_core.daemon.store import Store
        from malletrain_core.engine import Engine, EngineConfig
        from malletrain_core.sim.churn import ChurnBackend

        self.tmp = tempfile.mkdtemp(prefix="malletrain-fuzz-api-")
        coordinator = EpochCoordinator()
        bridge = EpochBridge(ChurnBackend(7), coordinator,
                             uid_of=lambda user: 1000 + int(user[1:]) if user else -1)
        clock = [1.0e6]
        self.daemon = Daemon(Engine(EngineConfig()), bridge, Store(self.tmp),
                             clock=lambda: clock[0])
        for _ in range(100):  # jobs, nodes and epochs for the handlers to look up
            self.daemon.cycle()
            clock[0] += 2.0
        self.dispatcher = Dispatcher(admin_uids={0})
        attach(self.daemon, self.dispatcher, 0)
        LauncherService(coordinator, lambda key, uid: "credential", "127.0.0.1:7817",
                        lambda: clock[0], lock=self.daemon.lock).register(self.dispatcher)
        jobs = sorted(self.daemon.engine.jobs)  # type: ignore[attr-defined]
        nodes = sorted(self.daemon.engine.node_map)  # type: ignore[attr-defined]
        job, node = (jobs or ["1"])[-1], (nodes or ["n000"])[0]
        self.valid: list[Any] = [
            {"op": "status", "args": {}}, {"op": "jobs", "args": {"user": "u1"}},
            {"op": "jobs", "args": {}}, {"op": "nodes", "args": {}},
            {"op": "profile", "args": {"job": job}},
            {"op": "checkin", "args": {"job": job, "node": node, "epoch": 0, "state": "idle",
                                       "rc": None, "addr": "127.0.0.1:29500",
                                       "ckpt_seen": 0}},
            {"op": "checkin", "args": {"job": job, "node": node, "state": "running",
                                       "epoch": 1}}]
        self.uids = [0, 1001, 1002, 1003, 1004, 65534]

    def make(self, rng: random.Random) -> tuple[int, bytes]:
        return rng.choice(self.uids), mutated(rng, self.valid, dumps, 2000)

    def check(self, case: tuple[int, bytes]) -> bool | None:
        uid, line = case
        with self.daemon.lock:
            reply = self.dispatcher.dispatch(uid, line)
        if not reply.endswith(b"\n") or reply.count(b"\n") != 1:
            raise Crash("the reply is not one line")
        body = json.loads(reply)
        if not isinstance(body, dict) or not isinstance(body.get("ok"), bool):
            raise Crash(f"malformed reply {reply[:100]!r}")
        if not body["ok"]:
            one_line(body["error"])
            if body["error"].startswith("internal error"):
                raise Crash(f"a handler raised: {body['error']}")
        return bool(body["ok"])

    def close(self) -> None:
        self.daemon.store.close()
        self.daemon.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Codec(Target):
    name = "codec"
    allowed = (ValueError,)  # json's errors and codec's refusals are ValueErrors

    def __init__(self) -> None:
        from malletrain_core.events import Checkpoint, Finish, Grow, Shrink
        from malletrain_core.sim.churn import ChurnBackend
        backend = ChurnBackend(3)
        events: list[Any] = []
        t = 1.0e6
        while len(events) < 200:
            events += backend.poll(t)
            t += 2.0
        events += [Grow("1", ("n1", "n2"), 3600.0), Shrink("1", ("n1",)), Checkpoint("1"),
                   Finish("1")]
        kinds: dict[str, Any] = {}
        for e in events:
            kinds.setdefault(type(e).__name__, codec.to_dict(e))
        self.valid = list(kinds.values())

    def make(self, rng: random.Random) -> bytes:
        return mutated(rng, self.valid, dumps)

    def check(self, case: bytes) -> bool | None:
        try:
            obj = codec.from_dict(json.loads(case))
        except ValueError as exc:
            if not isinstance(exc, json.JSONDecodeError) and not isinstance(
                    exc, UnicodeDecodeError):
                one_line(str(exc))
            return None
        again = codec.to_dict(obj)
        if codec.to_dict(codec.from_dict(json.loads(json.dumps(again)))) != again:
            raise Crash("an accepted row does not round-trip")
        return True


class Toml(FileTarget):
    name = "toml"
    filename = "malletrain.toml"
    allowed = (ConfigError,)

    def __init__(self) -> None:
        super().__init__()
        self.text = config.DOCUMENTED_DEFAULTS.read_text()
        self.lines = self.text.splitlines()
        self.values = ['"x"', "-1", "nan", "inf", "-inf", "1e999", "[1, 2]", "{a = 1}", '"²"',
                       '"-0"', "true", "0", "[[[[", '"1_0"', '"nan"', "0x10", "1_000", "1.5",
                       '""', "[]", '["root", 1]', "{ bob = -3 }", "{ bob = 2 }", "9" * 30,
                       "2026-01-01", "'lit'", '"""a\nb"""', '"\\u0000"', "99999", "65536"]

    def make(self, rng: random.Random) -> bytes:
        r = rng.random()
        if r < 0.1:
            return bytes(rng.randrange(256) for _ in range(rng.randint(0, 400)))
        if r < 0.4:
            return mutate_bytes(rng, self.text.encode())
        lines = list(self.lines)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(lines))
            op = rng.randrange(4)
            if op == 0 and "=" in lines[i]:
                lines[i] = lines[i].split("=")[0] + "= " + rng.choice(self.values)
            elif op == 1:
                lines.insert(rng.randrange(len(lines)), lines[i])
            elif op == 2:
                del lines[i]
            else:
                lines[i] += rng.choice(["]", "[", " = ", "x", " = 1", "\\"])
        return "\n".join(lines).encode()

    def check(self, case: bytes) -> bool | None:
        self.path.write_bytes(case)
        try:
            cfg = config.load(self.path, env={})
        except ConfigError as exc:
            one_line(str(exc))
            return None
        cfg.validate()
        return True


class TraceTarget(FileTarget):
    """A trace reader: refusals are ``InputFileError``; an accepted trace has nodes and
    ``end ≥ start``."""

    allowed = (InputFileError,)

    def read(self) -> Any:
        raise NotImplementedError

    def check(self, case: bytes) -> bool | None:
        self.path.write_bytes(case)
        try:
            trace = self.read()
        except InputFileError as exc:
            one_line(str(exc))
            return None
        if not trace.node_names or not trace.end >= trace.start:
            raise Crash("accepted a trace without nodes or with end < start")
        return True


class IdleCsv(TraceTarget):
    name = "idle-csv"
    filename = "trace.csv"

    def make(self, rng: random.Random) -> bytes:
        rows = ["unix_time,node,idle"]
        t = 1_600_000_000
        for _ in range(rng.randint(1, 12)):
            t += rng.choice([0, 1, 60, 3600])
            rows.append(f"{t},n{rng.randint(0, 5)},{rng.randint(0, 1)}")
        base = ("\n".join(rows) + "\n").encode()
        return mutate_bytes(rng, base) if rng.random() < 0.8 else base

    def read(self) -> Any:
        from malletrain_core.sim import traces
        return traces.read_idle_csv(self.path, use_cache=False)


class Swf(TraceTarget):
    name = "swf"
    filename = "log.swf"

    def make(self, rng: random.Random) -> bytes:
        rows = ["; MaxNodes: 8"]
        submit = 0
        for j in range(1, rng.randint(2, 10)):
            submit += rng.randint(0, 600)
            n = rng.randint(1, 8)
            rows.append(" ".join(str(x) for x in (j, submit, rng.randint(0, 300),
                                                  rng.randint(1, 3600), n, -1, -1, n, 3600)))
        base = ("\n".join(rows) + "\n").encode()
        return mutate_bytes(rng, base) if rng.random() < 0.8 else base

    def read(self) -> Any:
        from malletrain_core.sim import sources
        return sources.read_swf(self.path, machine_nodes=8, use_cache=False)


LUA_DRIVER = r"""
messages = {}
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, INFINITE = 4294967295,
         ESLURM_INVALID_NODE_COUNT = 2006, ESLURM_ACCESS_DENIED = 2002, JOB_SHARED_NONE = 0,
         log_user = function(fmt, ...) table.insert(messages, string.format(fmt, ...)) end}
assert(dofile(arg[1]) == slurm.SUCCESS)
local function clean(s) return (string.gsub(tostring(s), "[%c]", "?")) end
for line in io.lines() do
  messages = {}
  local ok, out = pcall(function()
    local case = assert(loadstring("return " .. line))()
    local rc
    if case.modify then
      rc = slurm_job_modify(case.desc, case.rec, {}, case.uid)
    else
      rc = slurm_job_submit(case.desc, {}, case.uid)
    end
    local d = case.desc
    return table.concat({tostring(rc), clean(d.admin_comment), clean(d.array_inx),
                         clean(d.min_nodes), clean(d.max_nodes), clean(d.qos),
                         tostring(#messages), clean(messages[1] or "")}, "\t")
  end)
  if ok then io.write("ok\t", out, "\n") else io.write("err\t", clean(out), "\n") end
  io.flush()
end
"""

NO_VAL = 4294967294


def lua_string(data: bytes) -> str:
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}"
                         for b in data) + '"'


def lua_literal(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_literal(k)}] = {lua_literal(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("(0/0)" if value != value else
                                                           ("(1/0)" if value > 0 else "(-1/0)"))
    data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return lua_string(data)


class Sbatch(Target):
    name = "sbatch"

    def __init__(self) -> None:
        from devtools.localcluster import JOB_SUBMIT_LUA
        lua = shutil.which("lua5.1")
        if lua is None:
            raise RuntimeError("lua5.1 is not installed (scripts/setup-machine.sh installs it)")
        self.dir = tempfile.mkdtemp(prefix="malletrain-fuzz-lua-")
        driver = Path(self.dir) / "driver.lua"
        driver.write_text(LUA_DRIVER)
        self.cmd = [lua, str(driver), str(JOB_SUBMIT_LUA)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.max_nodes = 1000  # the plugin's default cap (tests/test_job_submit_lua.py)

    def _start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return self.proc

    def _count(self, rng: random.Random) -> Any:
        # Slurm hands the plugin node counts as uint32 numbers (NO_VAL when not given).
        return rng.choice([1, 2, 3, 4, 16, 999, 1000, 1001, 0, NO_VAL, NO_VAL + 1, 2**31,
                           2**32 - 1, rng.randint(1, 1200), rng.randint(0, 2**32 - 1), None])

    def _comment(self, rng: random.Random) -> Any:
        base = rng.choice([b"model=resnet50", b"model=resnet50,profile=no", b"profile=yes",
                           b" model=bert , profile=no", b"", b"min=1", b"x", b"a=b=c"])
        if rng.random() < 0.7:
            base = mutate_bytes(rng, base)
        return base if rng.random() < 0.9 else None

    def make(self, rng: random.Random) -> dict[str, Any]:
        desc: dict[str, Any] = {
            "qos": rng.choice(["malletrain"] * 6 + ["normal", "", "MALLETRAIN", None]),
            "min_nodes": self._count(rng), "max_nodes": self._count(rng),
            "script": rng.choice(["#!/bin/sh", "#!/bin/sh", "", None]),
            "comment": self._comment(rng)}
        if rng.random() < 0.1:
            desc["array_inx"] = rng.choice(["0-7", "", "1", "%"])
        if rng.random() < 0.1:
            desc["partition"] = rng.choice(["prod", "preemptable", ""])
        desc = {k: v for k, v in desc.items() if v is not None}
        if rng.random() < 0.25:
            rec = {"job_id": rng.randint(1, 10**6),
                   "admin_comment": rng.choice(["malletrain:min=1,max=4", None, "",
                                                "malletrain:", "other"])}
            rec = {k: v for k, v in rec.items() if v is not None}
            mod = {k: v for k, v in desc.items() if rng.random() < 0.5}
            return {"modify": True, "desc": mod, "rec": rec,
                    "uid": rng.choice([0, 1000, 4242, 2**32 - 1])}
        return {"modify": False, "desc": desc, "uid": rng.choice([0, 1000, 65534])}

    def check(self, case: dict[str, Any]) -> bool | None:
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(lua_literal(case).encode("latin-1") + b"\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 5.0)
        if not ready:
            proc.kill()
            proc.wait()
            self.proc = None
            raise Hang()
        line = proc.stdout.readline().decode("utf-8", "replace").rstrip("\n")
        if not line:
            self.proc = None
            raise Crash("lua5.1 exited")
        kind, _, rest = line.partition("\t")
        if kind != "ok":
            raise Crash(f"Lua error: {rest[:160]}")
        rc_s, tag, array, lo, hi, qos, nmsg, msg = rest.split("\t")
        rc = int(float(rc_s))
        if rc not in (0, -1, 2002, 2006):
            raise Crash(f"return code {rc} Slurm does not know")
        if rc != 0:
            if nmsg != "1" or not msg.startswith("malletrain: "):
                raise Crash(f"a refusal without one malletrain: message ({nmsg}, {msg[:80]!r})")
            return None
        desc = case["desc"]
        if case["modify"] or desc.get("qos") != "malletrain":
            return True
        m = re.fullmatch(r"malletrain:min=(\d+),max=(\d+)(,.*)?", tag)
        if m is None:
            raise Crash(f"accepted elastic job tagged {tag!r}")
        lo_n, hi_n = int(m.group(1)), int(m.group(2))
        if not 1 <= lo_n <= hi_n <= self.max_nodes or array != f"0-{hi_n - 1}" or \
                (lo, hi) != ("1", "1"):
            raise Crash(f"accepted range {lo_n}-{hi_n} as array {array!r}, nodes {lo}-{hi}")
        return True

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


TARGETS: dict[str, Callable[[], Target]] = {
    "hooks": Hooks, "reports": Reports, "api": Api, "codec": Codec, "toml": Toml,
    "idle-csv": IdleCsv, "swf": Swf, "sbatch": Sbatch}


# ----- the driver -------------------------------------------------------------------------------
def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang()


def fuzz(name: str, cases: int, seed: int, hang_s: float) -> dict[str, Any]:
    target = TARGETS[name]()
    rng = random.Random(f"{seed}:{name}")
    crashes: dict[str, dict[str, Any]] = {}
    hangs = 0
    accepted = 0
    slowest = 0.0
    t0 = time.perf_counter()
    last = t0
    signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(cases):
            case = target.make(rng)
            c0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, hang_s)
            try:
                accepted += bool(target.check(case))
            except Hang:
                hangs += 1
                kind = "hang"
            except target.allowed:
                kind = ""
            except Crash as exc:
                kind = f"Crash: {exc}"[:200]
            except Exception as exc:  # noqa: BLE001 - this is what is counted
                where = traceback.extract_tb(exc.__traceback__)[-1]
                kind = f"{type(exc).__name__} at {Path(where.filename).name}:{where.lineno}"
            else:
                kind = ""
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            slowest = max(slowest, time.perf_counter() - c0)
            if kind:
                entry = crashes.setdefault(kind, {"count": 0, "examples": []})
                entry["count"] += 1
                if len(entry["examples"]) < 3:
                    entry["examples"].append(repr(case)[:300])
            now = time.perf_counter()
            if now - last > 10:
                last = now
                print(f"fuzz {name}: {i + 1}/{cases} cases, "
                      f"{sum(c['count'] for c in crashes.values())} crashes, "
                      f"{now - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        target.close()
    seconds = time.perf_counter() - t0
    total = sum(c["count"] for c in crashes.values())
    print(f"fuzz {name}: {cases} cases, {total} crashes ({hangs} hangs), {seconds:.1f} s",
          file=sys.stderr, flush=True)
    return {"cases": cases, "accepted": accepted, "crashes": total, "hangs": hangs,
            "seconds": round(seconds, 1),
            "slowest_case_ms": round(slowest * 1e3, 1), "kinds": crashes}


def section(r: dict[str, Any]) -> str:
    rows = [f"| {name} | {t['cases']} | {t['accepted']} | {t['crashes']} | {t['hangs']} | {t['seconds']} | "
            f"{t['slowest_case_ms']} |" for name, t in r["targets"].items()]
    return "\n".join([
        BEGIN,
        f"Measured {r['date']} on {r['machine']}, with `{r['command']}` (seed {r['seed']}, "
        f"hang bound {r['hang_s']} s per case).",
        "",
        "| target | cases | accepted | crashes | hangs | seconds | slowest case ms |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Each case is a seeded mutation of a valid input (byte-level or of its decoded "
        "structure) or random bytes; a crash is an exception other than the parser's own "
        "refusal, a refusal that is not one line, a case over the hang bound, or a broken "
        "contract (an accepted input that does not round-trip, an API handler's internal "
        "error, a Lua error or an elastic job accepted with an array or tag that does not "
        "match its range). \"accepted\": cases the parser took as valid. The targets are "
        "described in bench/fuzz.py; inputs that crashed a parser in earlier runs are kept as "
        "regression tests in tests/test_fuzz_regressions.py. The run's JSON: "
        "bench/results/fuzz.json.",
        END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=100_000, help="cases per target")
    p.add_argument("--target", action="append", choices=sorted(TARGETS),
                   help="only this target (repeatable)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hang-s", type=float, default=5.0, help="a case running longer is a hang")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the fuzz section of FILE")
    p.add_argument("--from-json", metavar="FILE",
                   help="no run: write the section from the JSON a previous run printed")
    args = p.parse_args(argv)
    if args.cases < 1 or args.hang_s <= 0:
        p.error("--cases must be ≥ 1 and --hang-s > 0")
    if args.from_json:
        previous = json.loads(Path(args.from_json).read_text())
        if args.markdown:
            replace_section(Path(args.markdown), BEGIN, END, section(previous),
                            "Fuzzing by count")
        print(json.dumps(previous))
        return 0 if previous["crashes"] == 0 else 1
    names = args.target or list(TARGETS)
    result: dict[str, Any] = {"seed": args.seed, "hang_s": args.hang_s, "targets": {}}
    for name in names:
        result["targets"][name] = fuzz(name, args.cases, args.seed, args.hang_s)
    flags = list(argv if argv is not None else sys.argv[1:])
    result["command"] = "python -m bench.fuzz " + shlex.join(flags)
    result["machine"] = host()
    result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result["crashes"] = sum(t["crashes"] for t in result["targets"].values())
    if args.markdown:
        replace_section(Path(args.markdown), BEGIN, END, section(result),
                        "Fuzzing by count")
    print(json.dumps(result))
    return 0 if result["crashes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
