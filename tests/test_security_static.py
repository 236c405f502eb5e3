"""Static least-privilege checks over the source: the daemon never hands a string to a shell,
never runs user code and never deserialises input into code.

* Batch-system commands go through ``malletrain_core/runner.py`` (argument lists, no shell).
* ``malletrain_core/worker/launcher.py`` is the one place a user's command runs: ``malletrain-run``
  starts the user's training command as an argument list inside the job's own batch task, as
  the job's user; the daemon never imports it.
* ``devtools/localcluster/`` starts a development Slurm cluster (slurmctld, slurmd) for
  the tests and the demo; the daemon never imports it either.
* The hooks (EpilogSlurmctld, the PBS hook) only send a datagram: no process, no eval.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.security

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "malletrain_core"
HOOKS = [REPO / "plugin" / "epilog_slurmctld", REPO / "pbs_hooks" / "malletrain_pbs.py"]
MAY_START_PROCESSES = {"runner.py", "launcher.py", "localcluster"}
DAEMON_MODULES = ["malletrain_core.daemon.main", "malletrain_core.daemon.api",
                  "malletrain_core.backends.slurm.backend", "malletrain_core.backends.pbs.backend"]
NEVER_IN_DAEMON = ["malletrain_core.worker.launcher", "malletrain_core.worker.training",
                   "devtools.localcluster", "torch"]


def sources() -> list[Path]:
    """The package, the development tools beside it and the hooks."""
    return sorted(PACKAGE.rglob("*.py")) + sorted((REPO / "devtools").rglob("*.py")) + HOOKS


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "?"


FORBIDDEN_CALLS = {"eval", "exec", "compile", "os.system", "os.popen", "os.execv", "os.execvp",
                   "os.execve", "os.execl", "os.execlp", "os.spawnv", "os.spawnl", "pty.spawn",
                   "pickle.load", "pickle.loads", "marshal.loads", "yaml.load",
                   "subprocess.getoutput", "subprocess.getstatusoutput", "__import__"}


def violations(path: Path) -> list[str]:
    found = []
    may_spawn = bool(MAY_START_PROCESSES.intersection(path.relative_to(REPO).parts[1:]))
    for node in ast.walk(parsed(path)):
        where = f"{rel(path)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.keyword) and node.arg == "shell":
            if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                found.append(f"{where}: shell= other than False")
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            if name in FORBIDDEN_CALLS:
                found.append(f"{where}: {name}()")
            if name.endswith("load") and any(k.arg == "allow_pickle" and not (
                    isinstance(k.value, ast.Constant) and k.value.value is False)
                    for k in node.keywords):
                found.append(f"{where}: {name}(allow_pickle=...)")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) \
                else [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in {"pickle", "marshal", "shelve", "pty"}:
                    found.append(f"{where}: imports {name}")
                if top == "subprocess" and not may_spawn:
                    found.append(f"{where}: imports subprocess outside runner.py, launcher.py "
                                 "and localcluster/")
    return found


def test_no_shell_eval_or_pickle_anywhere() -> None:
    problems = [v for path in sources() for v in violations(path)]
    assert problems == []


def test_the_check_itself_catches_each_pattern(tmp_path: Path) -> None:
    bad = PACKAGE / "_static_probe_never_committed.py"
    assert not bad.exists()
    code = ("import subprocess, pickle\nimport numpy as np\n"
            "subprocess.run('ls', shell=True)\nos.system('x')\neval(s)\n"
            "pickle.loads(b)\nnp.load(f, allow_pickle=True)\nsubprocess.run(a, shell=flag)\n")
    bad.write_text(code)
    try:
        found = "\n".join(violations(bad))
    finally:
        bad.unlink()
    for needle in ("imports subprocess", "imports pickle", "shell= other", "os.system()",
                   "eval()", "pickle.loads()", "allow_pickle"):
        assert needle in found, needle
    assert found.count("shell= other") == 2


def test_hooks_start_no_process() -> None:
    for hook in HOOKS:
        text = hook.read_text()
        for word in ("subprocess", "os.system", "os.popen", "os.exec", "eval(", "exec("):
            assert word not in text, f"{rel(hook)} uses {word}"


def test_daemon_never_loads_user_code_modules() -> None:
    """Importing every daemon-side module pulls in neither the launcher (the only code that
    starts a user's command), the training library nor the development cluster."""
    code = ("import sys, importlib\n"
            f"for m in {DAEMON_MODULES!r}: importlib.import_module(m)\n"
            f"print(','.join(m for m in {NEVER_IN_DAEMON!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_launcher_runs_the_user_command_as_an_argument_list() -> None:
    tree = parsed(PACKAGE / "worker" / "launcher.py")
    spawns = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
              and dotted(n.func) in {"subprocess.Popen", "subprocess.run"}]
    assert len(spawns) == 1, "one place starts the user's command"
    first = spawns[0].args[0]
    assert not isinstance(first, (ast.Constant, ast.JoinedStr, ast.BinOp)), \
        "the command is an argv list, never a string"
