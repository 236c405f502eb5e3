"""Accounting mode of the local cluster: a private MariaDB and slurmdbd, and the QOS setup.

MariaDB listens on 127.0.0.1 at port base + 2 (no shared unix socket: two clusters may run
side by side), slurmdbd on port base + 1; both write PID files beside the cluster's others,
so :meth:`LocalCluster.stop` stops them (MariaDB's, written as user mysql, in its own
directory). The ``malletrain`` QOS is made by the admin script
``slurm_conf/qos-setup.sh``, so the local cluster exercises exactly what a site runs.
Needs Debian's mariadb-server, slurmdbd and slurm-wlm-mysql-plugin
(``MALLETRAIN_ACCOUNTING=1 scripts/setup-machine.sh``).
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
from typing import TYPE_CHECKING

from malletrain_core.errors import MalleTrainError

if TYPE_CHECKING:
    from . import LocalCluster

ACCOUNT = "mt"
PACKAGES = {"mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
            "slurmdbd": "slurmdbd", "sacctmgr": "slurm-client"}


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_accounting(cluster: LocalCluster) -> None:
    """Start MariaDB and slurmdbd for ``cluster`` and set up its cluster, account, QOS."""
    from . import REPO, ClusterError

    missing = sorted({pkg for cmd, pkg in PACKAGES.items() if not shutil.which(cmd)})
    if missing:
        raise ClusterError(f"accounting mode needs {', '.join(missing)}: run "
                           "MALLETRAIN_ACCOUNTING=1 scripts/setup-machine.sh")
    assert cluster.port_base is not None
    run_dir, pids, logs = cluster.run_dir, cluster.run_dir / "pids", cluster.run_dir / "log"
    db_dir, db_port, dbd_port = run_dir / "mysql", cluster.port_base + 2, cluster.port_base + 1
    (db_dir / "data").mkdir(parents=True, exist_ok=True)
    shutil.chown(db_dir, "mysql", "mysql")
    shutil.chown(db_dir / "data", "mysql", "mysql")
    runner = cluster.runner(timeout_s=120)
    runner.run(["mariadb-install-db", "--user=mysql", f"--datadir={db_dir / 'data'}",
                "--auth-root-authentication-method=socket", "--skip-test-db"])
    sock = db_dir / "mysqld.sock"
    with open(logs / "mariadbd.out", "ab") as out:
        subprocess.Popen(
            ["mariadbd", "--no-defaults", "--user=mysql", f"--datadir={db_dir / 'data'}",
             f"--socket={sock}", f"--pid-file={db_dir / 'mariadbd.pid'}", f"--port={db_port}",
             "--bind-address=127.0.0.1", f"--log-error={db_dir / 'mariadb.err'}",
             "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0"],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    sql = cluster.runner(timeout_s=10)
    cluster.wait_for("MariaDB up", lambda: sql.run(
        ["mariadb", f"--socket={sock}", "-uroot", "-e", "select 1"], check=False).returncode == 0,
        timeout_s=60, interval_s=0.2)
    password = secrets.token_hex(12)
    sql.run(["mariadb", f"--socket={sock}", "-uroot"], input=(
        "CREATE DATABASE IF NOT EXISTS slurm_acct_db;\n"
        f"CREATE OR REPLACE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\n"))
    # slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF.
    conf = cluster.conf_path.parent / "slurmdbd.conf"
    conf.write_text("\n".join([
        "AuthType=auth/munge", f"AuthInfo=socket={cluster.munge_socket}",
        "DbdHost=localhost", "DbdAddr=127.0.0.1", f"DbdPort={dbd_port}", "SlurmUser=root",
        f"LogFile={logs / 'slurmdbd.log'}", f"PidFile={pids / 'slurmdbd.pid'}",
        "DebugLevel=info", "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1", f"StoragePort={db_port}", "StorageLoc=slurm_acct_db",
        "StorageUser=slurm", f"StoragePass={password}", ""]))
    conf.chmod(0o600)
    runner.run(["slurmdbd"])
    cluster.wait_for("slurmdbd up", lambda: _port_open(dbd_port), timeout_s=60, interval_s=0.2)
    name = f"mt{cluster.port_base}"
    sacctmgr = ["sacctmgr", "-i"]
    runner.run([*sacctmgr, "add", "cluster", name])
    runner.run([*sacctmgr, "add", "account", ACCOUNT, "Description=malletrain",
                "Organization=local", f"Cluster={name}"])
    runner.run([*sacctmgr, "add", "user", "root", f"Account={ACCOUNT}", f"Cluster={name}"])
    runner.run(["bash", str(REPO / "slurm_conf" / "qos-setup.sh"), "root"])


def add_user(cluster: LocalCluster, user: str) -> None:
    """Let ``user`` submit to the accounting-mode cluster, the malletrain QOS included."""
    from . import REPO

    if cluster.mode != "accounting":
        raise MalleTrainError("add_user: only accounting-mode clusters have associations")
    runner = cluster.runner()
    # sacctmgr exits 1 with "Nothing new added" when the association exists: that is fine.
    runner.run(["sacctmgr", "-i", "add", "user", user, f"Account={ACCOUNT}",
                f"Cluster=mt{cluster.port_base}"], check=False)
    runner.run(["bash", str(REPO / "slurm_conf" / "qos-setup.sh"), user])
