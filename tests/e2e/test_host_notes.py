"""The e2e tier of tests/unit/test_host_notes.py (the same subject; its helpers are there)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import hostcheck
from gpu_train.contract import BOOT_CRON_STOPPED, BOOT_OFF, BOOT_ON
from remote.loopback import Sshd
from tests.unit.test_project import started_run
from tests.unit.test_resilience import crontab_restored  # noqa: F401 (a fixture)
from tests.unit.test_stack_select import OurProject

# nvidia-smi as a T4 host answers while another user's job holds the GPU: its list, the utilisation
# query procs.gpus asks, and the compute apps query (csv,noheader,nounits: "pid, process_name, used_memory").
FAKE_SMI = """#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: Tesla T4 (UUID: GPU-00000000)" ;;
  *--query-gpu*) echo "0, Tesla T4, 97, 10300, 15360" ;;
  *--query-compute-apps*) echo "4242, /usr/bin/python3, 10240" ;;
esac
"""


@pytest.fixture
def busy_host(tmp_path: Path):
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(FAKE_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    server = Sshd(tmp_path / "sshd", "127.0.14.12", setenv=f"PATH={fakebin}:/usr/local/bin:/usr/bin:/bin").start()
    yield server
    server.stop()
    subprocess.run(["pkill", "-f", str(tmp_path / "sshd")], check=False)


@pytest.mark.e2e
def test_train_says_what_the_host_is_busy_with_and_how_reboots_go(tmp_path: Path, busy_host: Sshd, crontab_restored) -> None:
    if not shutil.which("crontab"):
        pytest.skip("crontab is not installed (scripts/test installs cron)")
    proj = OurProject(tmp_path)
    root = busy_host.dir / "home" / ".gpu-train"
    proj.stack(
        "lab",
        f"  gpu-train:hosts: ['{busy_host.spec}']\n  gpu-train:sshKey: {busy_host.client_key}\n"
        f"  gpu-train:python: {sys.executable}\n  gpu-train:venv: false\n",
    )
    first = proj.run("train", "--name", "long", "--command", "sleep 60", check=True)
    long_run = started_run(first)
    assert "in use by 1 process already: pid 4242 python3 (10240 MiB)" in first.stderr, first.stderr
    assert "other run" not in first.stderr
    assert "a reboot there leaves this run interrupted until `gpu-train resume`; `gpu-train setup`" in first.stderr

    second = proj.run("train", "--name", "short", "--command", "true", check=True)
    assert f"1 other run of gpu-train still running here: {long_run}" in second.stderr, second.stderr
    assert "a reboot there" not in second.stderr  # offered once per host

    setup = proj.run("setup", check=True)
    mine = [
        ln
        for ln in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout.splitlines()
        if ln.endswith(f"# gpu-train {root}")
    ]
    assert len(mine) == 1 and mine[0].startswith("@reboot ")
    state = hostcheck.boot_resume(str(root))  # this machine's cron daemon may or may not run
    assert state in (BOOT_ON, BOOT_CRON_STOPPED)
    assert ("no cron daemon runs there" in setup.stderr) == (state == BOOT_CRON_STOPPED)
    third = proj.run("train", "--name", "again", "--command", "true", check=True)
    assert ("no cron daemon runs there" in third.stderr) == (state == BOOT_CRON_STOPPED)
    fourth = proj.run("train", "--name", "more", "--command", "true", check=True)
    assert "no cron daemon runs there" not in fourth.stderr  # said once per host, not on every train

    proj.run("stop", "--run", long_run, check=True)
    down = proj.run("down", check=True)
    assert "took gpu-train's lines out of your crontab" in down.stderr, down.stderr
    assert f"# gpu-train {root}" not in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    assert hostcheck.boot_resume(str(root)) == BOOT_OFF


@pytest.mark.e2e
def test_down_leaves_the_reboot_line_only_for_other_projects_runs_that_would_resume(
    tmp_path: Path, busy_host: Sshd, crontab_restored
) -> None:
    """Two projects on one host, both down: each kept the @reboot line for the other's runs, all long finished
    ("other projects' runs resume with it"), so it stayed for ever. Only a running or interrupted run keeps it."""
    if not shutil.which("crontab"):
        pytest.skip("crontab is not installed (scripts/test installs cron)")
    root = busy_host.dir / "home" / ".gpu-train"
    lines = f"  gpu-train:hosts: ['{busy_host.spec}']\n  gpu-train:sshKey: {busy_host.client_key}\n  gpu-train:python: {sys.executable}\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours, theirs = OurProject(tmp_path / "a"), OurProject(tmp_path / "b")
    for proj in (ours, theirs):
        proj.stack("lab", lines + "  gpu-train:venv: false\n")
    theirs_long = started_run(theirs.run("train", "--name", "long", "--command", "sleep 60", check=True))
    ours.run("train", "--name", "quick", "--command", "true", check=True)
    ours.run("setup", check=True)

    def cron() -> str:
        return subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout

    kept = ours.run("down", check=True)
    assert f"other projects' runs resume with it ({theirs_long}" in kept.stderr and f"# gpu-train {root}" in cron(), kept.stderr
    theirs.run("stop", "--run", theirs_long, check=True)  # finished now: nothing left to resume
    gone = ours.run("down", check=True)
    assert "took gpu-train's lines out of your crontab" in gone.stderr, gone.stderr
    assert f"# gpu-train {root}" not in cron()
