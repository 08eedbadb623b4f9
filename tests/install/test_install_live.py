"""``deploy/install.sh`` for real, and b300d running AS USER b300 from that install.

The install goes into folders of its own under /var/tmp (``--prefix``,
``--config-dir``, ``--unit-dir``, ``--bin-dir``) so that it never meets another
installation on the machine, but it is the real script: the system user b300,
a venv of the system python with the wheel (not editable), the config, the
state folder, the unit and its drop-in, and the Slurm user b300 with admin
level Admin (``--slurm-account root``). A re-run without ``--admin-group`` keeps the
installed group; a config still holding the example's paths is refused before any
folder is made. Then b300d runs as b300 (setpriv, no root, the unit's umask) against
the local cluster: a 2-node training run is submitted with the
installed b300ctl, a node is killed, the daemon drains it (as b300: this needs
Slurm's Admin level; Operator is refused with "Security violation,
UPDATE_NODE") and resumes the run elsewhere from its newest checkpoint. Last,
an admin-group member reads the store with the installed ``b300ctl`` and
another user is refused in one line; ``--uninstall`` deletes a ``b300-spares-*``
reservation and lists the node the daemon drained (never another's drain), and
``--uninstall --purge --resume-drained`` returns it and removes everything, the
PERM node-down trigger too.

Every file the b300 user or its jobs touch lives under /var/tmp/b300-install-*
(mode 0755), never under /root or a mode-0700 pytest folder.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import CLUSTER, REPO, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
INSTALL = REPO / "deploy" / "install.sh"
# The test's own Python may sit under /root (pyenv), out of b300's reach: the job runs the
# system python on a stdlib-only workload with generic checkpoints.
WORKLOAD = REPO / "tests" / "workload" / "steps.py"
SYSTEM_PYTHON = "/usr/bin/python3"
ADMIN_GROUP = "b300-test-admins"
NOBODY_GROUP = 65534


@dataclass(frozen=True)
class Install:
    base: Path
    prefix: Path
    config: Path
    state: Path
    unit_dir: Path
    bin_dir: Path
    slurm_conf: str

    def dirs(self) -> list[str]:
        return ["--prefix", str(self.prefix), "--config-dir", str(self.config.parent),
                "--unit-dir", str(self.unit_dir), "--bin-dir", str(self.bin_dir)]

    def script(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "SLURM_CONF": self.slurm_conf}
        return subprocess.run(["bash", str(INSTALL), *args, *self.dirs()], capture_output=True,
                              text=True, env=env, timeout=1200, check=False)

    def ctl(self, *args: str) -> Any:
        """The installed b300ctl (through the BIN_DIR link), as root, --json."""
        proc = subprocess.run([str(self.bin_dir / "b300ctl"), "--config", str(self.config),
                               "--json", *args], capture_output=True, text=True, timeout=120,
                              check=False, env={"PATH": os.environ["PATH"]})
        assert proc.returncode == 0, f"b300ctl {args} -> {proc.returncode}: {proc.stderr}"
        return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def installed(slurm_conf: str) -> Iterator[Install]:
    base = Path(tempfile.mkdtemp(prefix="b300-install-", dir="/var/tmp"))
    base.chmod(0o755)
    inst = Install(base=base, prefix=base / "opt", config=base / "etc" / "b300.toml",
                   state=base / "state", unit_dir=base / "systemd", bin_dir=base / "bin",
                   slurm_conf=slurm_conf)
    inst.config.parent.mkdir()
    # Written before the install, which keeps a config it finds (as at a real site).
    inst.config.write_text("\n".join([
        "[daemon]", 'mode = "act"', f'state_dir = "{inst.state}"', 'poll_interval = "1s"',
        'submit_grace = "3s"',
        'log_format = "json"', 'log_level = "debug"', f'admin_group = "{ADMIN_GROUP}"',
        "[slurm]", 'backend = "cli"', f'conf = "{slurm_conf}"',
        "[checkpoints]", f'roots = ["{base / "run"}"]',
    ]) + "\n")
    proc = inst.script("--admin-group", ADMIN_GROUP, "--slurm-account", "root")
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield inst
    keep = REPO / "artifacts" / "install-live"  # the daemon's and the jobs' logs, for a failure
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    for log in (base / "b300d.log", *(base / "state" / "job-logs").glob("*")):
        if log.is_file():
            shutil.copy2(log, keep / log.name)
    # If the uninstall test did not run (or failed), do not leave the user and venv behind.
    if inst.prefix.exists() or _user_exists("b300"):
        inst.script("--uninstall", "--purge")
    shutil.rmtree(base, ignore_errors=True)
    subprocess.run(["groupdel", ADMIN_GROUP], capture_output=True, check=False, timeout=30)


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def test_install_layout(installed: Install) -> None:
    inst = installed
    user = pwd.getpwnam("b300")
    assert user.pw_uid < 1000 and user.pw_shell == "/usr/sbin/nologin"  # a system user
    assert "b300" in grp.getgrnam(ADMIN_GROUP).gr_mem
    cfg = (inst.prefix / "venv" / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg and "include-system-site-packages = false" in cfg
    py = inst.prefix / "venv" / "bin" / "python"
    where = subprocess.run([str(py), "-c", "import b300, b300.recovery.recoverer; print(b300.__file__)"],
                           capture_output=True, text=True, check=True, timeout=60,
                           cwd="/").stdout.strip()
    assert where.startswith(str(inst.prefix / "venv" / "lib")), where
    site = Path(where).parent.parent
    assert not list(site.glob("__editable__*")), "installed editable, not from the wheel"
    st = inst.config.stat()
    admins = grp.getgrnam(ADMIN_GROUP).gr_gid
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o640, 0, admins)
    st = inst.state.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o2750, user.pw_uid, admins)
    unit = (inst.unit_dir / "b300d.service").read_text()
    assert f"ExecStart={inst.prefix}/venv/bin/b300d --config {inst.config}\n" in unit
    dropin = (inst.unit_dir / "b300d.service.d" / "paths.conf").read_text()
    assert f"ReadWritePaths={inst.state} {inst.state}/job-logs {inst.base}/run\n" in dropin
    help_ = subprocess.run([str(inst.bin_dir / "b300ctl"), "--help"], capture_output=True,
                           text=True, timeout=60, check=False)
    assert help_.returncode == 0 and "usage" in help_.stdout
    level = slurm_cmd(inst.slurm_conf, "sacctmgr", "-n", "-P", "show", "user", "b300",
                      "format=adminlevel").strip()
    assert level == "Administrator"


def _spec(run: Path) -> Path:
    # Paused after step 12 until the test opens the gate: the node is killed while the
    # job surely runs (a free-running 20 s job ended before the kill beside a CPU hog).
    command = (f"srun {SYSTEM_PYTHON} {run / 'steps.py'} --steps 40 --ckpt-every 5 --step-time 0.5"
               f" --pause-at 12 --gate {run / 'go'}")
    spec = run / "spec.toml"
    spec.write_text("\n".join([
        'name = "as-b300"', "[job]", f"command = {json.dumps(command)}", "nodes = 2",
        "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
        "[checkpoint]", f'dir = "{run / "ckpt"}"', 'layout = "generic"',
        "[health]", f'progress_file = "{run / "progress.json"}"',
        "[retries]", "infra = 3",
    ]) + "\n")
    return spec


def _progress(run: Path) -> int:
    try:
        return int(json.loads((run / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_b300d_as_user_b300_drains_a_failed_node_and_recovers(installed: Install) -> None:
    inst = installed
    b300 = pwd.getpwnam("b300")
    run = inst.base / "run"  # a [checkpoints] root: install.sh made it for b300
    assert run.owner() == "b300"
    shutil.copy2(WORKLOAD, run / "steps.py")
    (run / "steps.py").chmod(0o644)
    (run / "ckpt").mkdir()
    for path in (run, run / "ckpt"):
        os.chown(path, b300.pw_uid, b300.pw_gid)
    spec = _spec(run)
    log = inst.base / "b300d.log"
    with open(log, "ab") as out:
        daemon = subprocess.Popen(
            # The unit's UMask: the store's files are 0640, readable by the admin group.
            ["sh", "-c", 'umask 0027 && exec "$0" "$@"', "setpriv", "--reuid=b300", "--regid=b300",
             "--init-groups", str(inst.prefix / "venv" / "bin" / "b300d"), "--config", str(inst.config)],
            stdout=out, stderr=subprocess.STDOUT, cwd=inst.base,
            env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"})
    killed: list[str] = []
    try:
        wait_for(lambda: (inst.state / "b300d.sock").exists() or daemon.poll() is not None, 60,
                 "b300d's control socket")
        assert daemon.poll() is None, log.read_text()[-3000:]
        assert _uid_of(daemon.pid) == b300.pw_uid  # setpriv execs: this is b300d itself
        run_id = str(inst.ctl("submit", str(spec))["run"]["id"])
        started = wait_for(lambda: (r := inst.ctl("status", run_id))["run"]["state"]
                           in {"RUNNING", "FAILED", "CANCELLED", "COMPLETED"} and r, 240, "the run to start")
        assert started["run"]["state"] == "RUNNING", (started["events"][-5:], log.read_text()[-3000:])
        first = started["attempts"][0]
        wait_for(lambda: _progress(run) >= 12, 180, "training to pass step 12")
        victim = first["nodes"][1]
        killed.append(victim)
        subprocess.run(["bash", str(CLUSTER), "kill-node", victim], check=True, timeout=60,
                       capture_output=True)
        wait_for(lambda: len(inst.ctl("status", run_id)["attempts"]) >= 2, 180, "a second attempt")
        (run / "go").touch()
        status = wait_for(lambda: (r := inst.ctl("status", run_id))["run"]["state"]
                          in {"COMPLETED", "FAILED", "CANCELLED"} and r, 300, "the run to end")
        assert status["run"]["state"] == "COMPLETED", status["events"][-5:]
        _, a2 = status["attempts"]
        assert victim in a2["excluded_nodes"] and victim not in a2["nodes"]
        assert a2["resume_from"] and Path(a2["resume_from"]).parent == run / "ckpt"
        # Slurm says who drained it: b300 itself, with its Admin level, not root.
        out = slurm_cmd(inst.slurm_conf, "sinfo", "-R", "--noheader", f"--nodes={victim}",
                        "--format=%u|%E")
        drainer, reason = out.strip().split("|", 1)
        assert drainer == "b300" and run_id in reason, out
        history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
        assert [h["attempt"] for h in history] == [1, 2]
        assert history[1]["start_step"] == int(Path(a2["resume_from"]).name.split("_")[1]) >= 10
        assert json.loads((run / "done.json").read_text())["step"] == 40
        assert daemon.poll() is None
    finally:
        (run / "go").touch()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        ids = [ln.split("|")[0] for ln in slurm_cmd(inst.slurm_conf, "squeue", "--noheader",
                                                     "--user=b300", "--format=%i|%j").splitlines()]
        if ids:
            slurm_cmd(inst.slurm_conf, "scancel", *ids)
        for node in killed:
            subprocess.run(["bash", str(CLUSTER), "revive", node], capture_output=True,
                           timeout=120, check=False)
    assert daemon.returncode == 0, log.read_text()[-3000:]


def test_a_rerun_without_admin_group_keeps_the_installed_one(installed: Install) -> None:
    inst = installed
    stray = _group_exists("b300-admins")
    proc = inst.script()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"admin group {ADMIN_GROUP}" in proc.stderr
    assert _group_exists("b300-admins") == stray  # no stray default group
    assert f'admin_group = "{ADMIN_GROUP}"' in inst.config.read_text()
    assert inst.config.stat().st_gid == grp.getgrnam(ADMIN_GROUP).gr_gid
    other = inst.script("--admin-group", "b300-other-admins")
    last = other.stderr.strip().splitlines()[-1]
    assert other.returncode != 0 and f'has admin_group = "{ADMIN_GROUP}"' in last, last
    assert not _group_exists("b300-other-admins")


def test_the_unedited_example_config_is_refused_before_any_folder(installed: Install) -> None:
    inst = installed
    fresh = Install(**{**inst.__dict__, "config": inst.base / "etc-fresh" / "b300.toml",
                       "unit_dir": inst.base / "systemd-fresh"})
    example = (REPO / "deploy" / "examples" / "b300.toml").read_text()
    assert 'roots = ["/lustre/ckpt"]' in example and 'job_log_dir = "/shared/b300/job-logs"' in example
    before = {p: Path(p).exists() for p in ("/lustre", "/shared", "/var/lib/b300", "/run/b300")}
    proc = fresh.script("--admin-group", ADMIN_GROUP)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "still has the example's paths" in last and "[daemon] job_log_dir" in last \
        and "[checkpoints] roots" in last and "/lustre/ckpt" in last, last
    assert "Traceback" not in proc.stderr
    assert {p: Path(p).exists() for p in before} == before
    assert fresh.config.exists()  # written from the example, for the operator to edit
    assert not (fresh.unit_dir / "b300d.service").exists()


def _ctl_as(inst: Install, groups: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed b300ctl (system python, readable by all) as user nobody with ``groups``."""
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", f"--groups={groups}",
                           str(inst.bin_dir / "b300ctl"), "--config", str(inst.config), *args],
                          capture_output=True, text=True, timeout=120, check=False, cwd="/",
                          env={"PATH": os.environ["PATH"], "HOME": "/"})


def test_the_admin_group_reads_the_store_and_no_one_else(installed: Install) -> None:
    inst = installed
    if not (inst.state / "state.db").exists():
        pytest.skip("the daemon test did not run: no store yet")
    admins = str(grp.getgrnam(ADMIN_GROUP).gr_gid)
    for args in (("status",), ("events",), ("nodes",), ("checkpoints",)):
        proc = _ctl_as(inst, admins, *args)
        assert proc.returncode == 0, (args, proc.stderr)
    assert "as-b300" in _ctl_as(inst, admins, "status", "--all").stdout
    for args in (("status",), ("events",), ("cancel", "r-none")):
        proc = _ctl_as(inst, str(NOBODY_GROUP), *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"config file {inst.config} is not readable by user nobody" in lines[0], lines[0]


def _drain(conf: str, node: str, reason: str, user: str) -> None:
    subprocess.run(["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "scontrol", "update",
                    f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], check=True, timeout=60,
                   capture_output=True, env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"})


def _reason(conf: str, node: str) -> str:
    return slurm_cmd(conf, "sinfo", "-h", "-N", "-R", f"--nodes={node}", "-o", "%u|%E").strip()


def test_uninstall_purge_removes_everything_and_the_perm_trigger(installed: Install) -> None:
    inst = installed
    conf = inst.slurm_conf
    program = inst.state / "node-down-trigger"
    if not program.exists():  # b300d writes it at start; the test before may not have run
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o755)
    # What docs/install.md tells a site to do as SlurmUser (b300 may not set node triggers).
    armed = subprocess.run(["strigger", "--set", "--node", "--down", "--flags=PERM", f"--program={program}"],
                           capture_output=True, text=True, timeout=60, check=False,
                           env={"SLURM_CONF": conf, "PATH": os.environ["PATH"]})
    assert armed.returncode == 0, (armed.stderr, slurm_cmd(conf, "strigger", "--get"))
    assert str(program) in slurm_cmd(conf, "strigger", "--get")
    # A spare pool as b300d holds it (no end), a node the daemon drained (user b300, its
    # reason), and a node a person drained with a reason that only looks like the daemon's.
    slurm_cmd(conf, "scontrol", "create", "reservation", "ReservationName=b300-spares-x", "Nodes=gpu04",
              "StartTime=now", "Duration=infinite", "Users=root", "Flags=IGNORE_JOBS")
    try:
        _drain(conf, "gpu03", "b300: run r-test job 1 NODE_FAIL", "b300")
        _drain(conf, "gpu02", "b300: kept by hand", "root")
        proc = inst.script("--uninstall")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "removed 1 node-down trigger" in out
        assert str(program) not in slurm_cmd(conf, "strigger", "--get")
        assert "deleted the spare pool reservation b300-spares-x" in out
        assert "b300-spares-x" not in slurm_cmd(conf, "scontrol", "-o", "show", "reservation")
        assert ("drained by the daemon: gpu03; return it with: "
                "scontrol update NodeName=gpu03 State=RESUME") in out
        assert "gpu02" not in out
        assert _reason(conf, "gpu03").startswith("b300|b300: run r-test")  # listed, not returned

        again = inst.script()  # installed again: the purge below needs the venv for the paths
        assert again.returncode == 0, again.stderr[-3000:]
        proc = inst.script("--uninstall", "--purge", "--resume-drained")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "returned gpu03 (drained by the daemon)" in out and "gpu02" not in out
        assert _reason(conf, "gpu03") == ""
        assert _reason(conf, "gpu02") == "root|b300: kept by hand"  # not the daemon's: untouched
    finally:
        subprocess.run(["scontrol", "delete", "reservation=b300-spares-x"], capture_output=True, timeout=30,
                       check=False, env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"})
        for node in ("gpu02", "gpu03"):
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True,
                           timeout=30, check=False, env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"})
    for gone in (inst.prefix, inst.config.parent, inst.state, inst.unit_dir / "b300d.service",
                 inst.unit_dir / "b300d.service.d", inst.bin_dir / "b300ctl"):
        assert not gone.exists(), gone
    assert not _user_exists("b300")
    with pytest.raises(KeyError):
        grp.getgrnam("b300")
    assert slurm_cmd(conf, "sacctmgr", "-n", "-P", "show", "user", "b300").strip() == ""
    grp.getgrnam(ADMIN_GROUP)  # a site's group: never removed
