"""The promises of a GPU VM's lifecycle, kept under a real systemd: a booted guest runs the startup
script the program declares, and a user drives it with `fab` over SSH.

Power off is systemd's own orderly shutdown (as when Compute Engine stops or preempts the VM), a
reboot is power off then boot. Timings are Compute Engine's where they matter (the spot grace is
measured for real); elsewhere short settings keep the tier quick.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from remote.ssh.listener import accept_each
from tests.conftest import gcp_raw
from tests.guest.fabuser import EXAMPLE, FabUser
from tests.guest.harness import LOOPBACK, Guest, MetadataServer, free_port
from tests.guest.startup import startup_script_of


@pytest.fixture
def vm(make_guest, public_key: Path, tmp_path: Path):
    """``vm(**stack_settings)``: a booted guest for a GCP stack with these settings, and its user."""

    def start(
        remote_root: str = "~/gpu-train", torch: bool = True, files: dict[str, str] | None = None, **settings
    ) -> tuple[Guest, FabUser]:
        raw = gcp_raw(sshUser="trainer", remoteRoot=remote_root, **settings)
        guest = make_guest(startup_script_of(raw))
        if torch:
            guest.add_python_with_torch()
        for inside, text in (files or {}).items():  # on the boot disk before the first boot
            guest.write(inside, text)
        guest.boot()
        # A boot whose startup script (or any unit) failed is "degraded", not down: say why here, not later
        # as a missing unit. (Other guests' units failed here under -n 4 while the guests shared a cgroup tree.)
        failed = guest.failed_units()
        assert failed == [], "\n".join(guest.journal(unit)[-3000:] for unit in failed)
        return guest, FabUser(tmp_path / "user", guest, public_key.with_suffix(""), remote_root)

    return start


def unit_of(run: str) -> str:
    return f"gpu-train-{run}.service"


# -- power off mid-training, boot: resumed once, from the checkpoint ----------------------------------
def test_power_off_mid_training_then_boot_resumes_once_from_the_checkpoint(vm) -> None:
    guest, user = vm(spot=False)
    run = user.train("--dir", str(EXAMPLE), "--script", "train.py", "--args", "--steps 300 --checkpoint-every 100000 --step-time 0.03")
    user.wait_state(run, ("running",))
    # Its own unit, with Compute Engine's grace for a standard VM; screen -r still shows it.
    show = guest.sh(f"systemctl show -P TimeoutStopUSec {unit_of(run)}").stdout.strip()
    assert show == "1min 50s", show
    assert run in guest.sh("screen -ls", user="trainer", check=False).stdout
    at = user.wait_step(run, 30)
    took = guest.power_off()
    log = user.log(run)
    assert "signal 15: saved ckpt_" in log, log[-2000:]
    assert took < 110
    assert user.state(run)["state"] == "interrupted"
    saved = sorted((user.root / "runs" / run / "job" / "checkpoints").glob("ckpt_*.pt"))
    assert saved and int(saved[-1].stem.split("_")[1]) >= at

    guest.boot()
    user.wait_for("the resumed job", lambda: "resumed from ckpt_" in user.log(run)[len(log) :])
    # The boot unit has finished; the job runs on in its own unit.
    assert guest.sh("systemctl show -P SubState gpu-train-boot.service").stdout.strip() == "exited"
    assert guest.sh(f"systemctl is-active {unit_of(run)}", check=False).stdout.strip() == "active"
    assert user.state(run)["resumes"] == 1
    done = user.fab("logs", "--follow", "--run", run, timeout=300)
    assert done.returncode == 0, done.stderr
    info = user.run_status(run)
    assert info["state"] == "succeeded" and info["resumes"] == 1
    assert "resumed 1x" in user.fab("status", check=True).stdout


# -- preemption and the maintenance notice ---------------------------------------------------------------
def test_a_maintenance_notice_reaches_the_job_and_a_preemption_is_counted(vm, metadata_server: MetadataServer) -> None:
    guest, user = vm(spot=True)
    run = user.train("--dir", str(EXAMPLE), "--script", "train.py", "--args", "--steps 100000 --checkpoint-every 100000 --step-time 0.03")
    user.wait_step(run, 20)
    metadata_server.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    user.wait_for(
        "the early warning in the job's log",
        lambda: "early warning (TERMINATE_ON_HOST_MAINTENANCE): saved ckpt_" in user.log(run),
        timeout=30,
    )
    metadata_server.set("instance/preempted", "TRUE")
    user.wait_for(
        "the preemption notice in the job's log",
        lambda: "early warning: TERMINATE_ON_HOST_MAINTENANCE, PREEMPTED" in user.log(run),
        timeout=30,
    )
    # A busy metadata server: the shutdown's own question goes unanswered for longer than it waits
    # (2 s), and what gpu-train-watch already told the job still counts the preemption.
    metadata_server.stall("instance/preempted", 5)
    took = guest.power_off()
    assert took < 30, "a spot VM has 30 s"
    assert "signal 15: saved ckpt_" in user.log(run)
    metadata_server.stall("instance/preempted", 0)
    metadata_server.set("instance/preempted", "FALSE")
    metadata_server.set("instance/maintenance-event", "NONE")
    guest.boot()
    user.wait_state(run, ("running",))
    info = user.run_status(run)
    # (seen once in a loaded full run: 0 preemptions; then what the agent and the last boot's journal said)
    assert info["preemptions"] == 1 and info["resumes"] == 1, (
        guest.sh(f"cat ~{guest.user}/gpu-train/agent.log", check=False).stdout[-3000:] + guest.journal(boot=-1)[-6000:]
    )
    user.fab("stop", "--grace", "5", check=True)


# -- Compute Engine's spot grace, measured: a job that ignores SIGTERM is killed in time ---------------
def test_a_job_that_ignores_sigterm_is_killed_within_the_spot_grace(vm, plain: str) -> None:
    guest, user = vm(spot=True, torch=False)
    run = user.train("--dir", plain, "--command", "trap '' TERM; echo up; sleep 600", "--name", "stubborn")
    user.wait_state(run, ("running",))
    user.wait_for("the job", lambda: "up" in user.log(run))
    took = guest.power_off()
    assert 25 <= took < 30, f"power off took {took:.1f} s: the job must get 25 s, and the VM is gone at 30"
    guest.boot()
    user.wait_state(run, ("running",))
    assert user.state(run)["resumes"] == 1


# -- crash loop: one resume per boot, failed after maxResumes --------------------------------------------
def test_a_run_interrupted_at_every_boot_fails_after_max_resumes(vm, plain: str) -> None:
    guest, user = vm(maxResumes=2, torch=False)
    run = user.train("--dir", plain, "--command", "sleep 600", "--name", "doomed")
    for boot in range(3):
        user.wait_state(run, ("running",))
        assert user.state(run)["resumes"] == boot  # exactly one resume per boot
        guest.power_off()
        guest.boot()
    info = user.wait_state(run, ("failed",), timeout=30)
    assert "interrupted 3 times" in info["reason"] and "maxResumes = 2" in info["reason"]
    assert info["resumes"] == 2


# -- boot handles each run on its own ----------------------------------------------------------------------
def test_one_run_that_cannot_be_relaunched_never_stops_the_others(vm, plain: str) -> None:
    guest, user = vm(torch=False)
    long_name = "n" + "x" * 111  # 128 characters with the timestamp: over screen's 80 for a session name
    first = user.train("--dir", plain, "--command", "sleep 600", "--name", "first")
    broken = user.train("--dir", plain, "--command", "sleep 600", "--name", "broken")
    long = user.train("--dir", plain, "--command", "sleep 600", "--name", long_name)
    for run in (first, broken, long):
        user.wait_state(run, ("running",))
    guest.power_off()
    (user.root / "runs" / broken / "spec.json").unlink()  # this one cannot be relaunched
    guest.boot()
    for run in (first, long):
        assert user.wait_state(run, ("running",))["resumes"] == 1
    info = user.wait_state(broken, ("failed",))
    assert info["reason"]
    assert long[:70] in guest.sh("screen -ls", user="trainer", check=False).stdout


# -- stop means stopped, at any phase ---------------------------------------------------------------------
class StallingIndex:
    """A package index that accepts connections and never answers: pip waits on it."""

    def __init__(self, address: str):
        self.sock = socket.socket()
        self.sock.bind((address, free_port(address)))
        self.sock.listen(16)
        self.held: list[socket.socket] = []
        accept_each(self.sock, self.held.append)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()
        return f"http://{host}:{port}/simple/"

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_stop_during_a_slow_requirements_install_leaves_nothing(vm, tmp_path: Path) -> None:
    guest, user = vm()
    index = StallingIndex(f"{LOOPBACK}.1")
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text(f"--index-url {index.url}\nslow-package-that-never-comes\n")
    (code / "job.sh").write_text("touch ran-marker\nsleep 600\n")
    try:
        run = user.train("--dir", str(code), "--command", "bash job.sh", "--name", "slowpip")
        user.wait_for("pip at work", lambda: "installing requirements.txt" in user.log(run))
        user.wait_for("pip's process", lambda: guest.sh("pgrep -u trainer -f 'pip install'", check=False).returncode == 0)
        out = user.fab("stop", "--grace", "3", check=True)
        assert "stopped" in out.stdout
        time.sleep(3)  # were anything left, it would run now
        assert user.state(run)["state"] == "stopped"
        assert guest.sh("pgrep -u trainer -f 'pip install|job.sh'", check=False).returncode == 1
        assert guest.sh(f"systemctl is-active {unit_of(run)}", check=False).stdout.strip() != "active"
        assert not (user.root / "runs" / run / "code" / "ran-marker").exists()
    finally:
        index.close()


# -- errors are failures, with their reason ---------------------------------------------------------------
def test_a_missing_interpreter_or_torch_is_refused_before_started(vm, plain: str, tmp_path: Path) -> None:
    _, user = vm(torch=False)
    user.restack("  gpu-train:python: /opt/nowhere/bin/python\n")
    out = user.fab("train", "--dir", plain, "--command", "true")
    assert out.returncode != 0 and "started" not in out.stdout
    assert "gpu-train:python" in out.stderr and "/opt/nowhere/bin/python" in out.stderr
    user.restack("  gpu-train:python: /usr/bin/python3\n")  # a Python without torch
    code = tmp_path / "needs-torch"
    code.mkdir()
    (code / "train.py").write_text((EXAMPLE / "train.py").read_text())  # imports torch; no requirements.txt
    out = user.fab("train", "--dir", str(code), "--script", "train.py")
    assert out.returncode != 0 and "started" not in out.stdout
    assert "import torch" in out.stderr
    assert not any((user.root / "runs").glob("*/state.json"))


def test_a_wrapper_error_fails_the_run_with_its_reason_and_is_not_relaunched(vm, tmp_path: Path) -> None:
    guest, user = vm()
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("--no-index\na-package-that-does-not-exist==1.0\n")
    run = user.train("--dir", str(code), "--command", "touch ran-marker", "--name", "badreq")
    info = user.wait_state(run, ("failed",))
    assert "pip install -r requirements.txt failed" in info["reason"]
    assert "pip install -r requirements.txt failed" in user.log(run)
    guest.power_off()
    guest.boot()
    time.sleep(2)
    assert user.state(run)["state"] == "failed" and user.state(run).get("resumes", 0) == 0
    assert not (user.root / "runs" / run / "code" / "ran-marker").exists()


# -- idle auto-stop -------------------------------------------------------------------------------------------
# The idle check as the startup script installs it (gpu-train-tick.timer running the agent's tick as
# root, `systemctl poweroff` when idle), on a quicker clock: every second from the first tick, which
# the test starts, rather than every TICK s from the boot (tick_interval_s is a table test; waiting
# whole real intervals proves nothing more, and a tick before the test is ready would race it).
QUICK_TICK = "[Timer]\nOnBootSec=\nOnUnitActiveSec=1s\nAccuracySec=50ms\n"


def test_idle_stop_powers_off_only_when_no_job_runs_and_no_ssh_session_is_open(vm, plain: str) -> None:
    import paramiko

    guest, user = vm(
        idleStopMinutes=0.05,
        torch=False,  # 3 s idle
        files={"/etc/systemd/system/gpu-train-tick.timer.d/quick.conf": QUICK_TICK},
    )
    run = user.train("--dir", plain, "--command", "sleep 9", "--name", "busy")
    user.wait_state(run, ("running",), timeout=60)
    guest.sh("systemctl start gpu-train-tick.service")  # the first tick; the timer ticks every second from it
    time.sleep(5)  # five ticks with only the job running
    assert guest.up, "powered off while a job ran"
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(guest.address, guest.port, guest.user, key_filename=str(user.key_file), look_for_keys=False, allow_agent=False)
    try:
        user.wait_state(run, ("succeeded",), timeout=60)
        user.end_shared_connection()  # the tasks' own shared connection would hold the clock too (for 60 s)
        time.sleep(6)  # idle but for the session: twice the idle time, a tick each second
        assert guest.up, "powered off while an SSH session was open"
        ticks = guest.journal("gpu-train-tick.service")
        assert "job(s) running" in ticks and "SSH session(s) open" in ticks, ticks[-3000:]
    finally:
        client.close()
    closed = time.monotonic()
    guest.wait_down(timeout=60)
    assert time.monotonic() - closed < 15
